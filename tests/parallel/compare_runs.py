#!/usr/bin/python3
"""Compares data-parallel runs with a reference run: loss per step and final weights.

usage: compare_runs.py TOLERANCE REFERENCE_RUN RUN...
Each run directory holds metrics.jsonl and checkpoints/latest. Passes when every step's loss and
the final weights (relative L2 error over all parameters) agree with the reference to TOLERANCE;
prints the largest differences either way. TOLERANCE 0 asks for the same bits: equal losses and
equal weight digests (the manifest's weights_sha256).
"""
import json
import os
import struct
import sys

import numpy as np


def losses(run):
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                out[row["step"]] = row["loss"]
    return out


def latest(run):
    ckpts = os.path.join(run, "checkpoints")
    with open(os.path.join(ckpts, "latest")) as f:
        return os.path.join(ckpts, f.read().strip())


def digest(run):
    with open(os.path.join(latest(run), "manifest.json")) as f:
        return json.load(f)["weights_sha256"]


def weights(run):
    """The parameters in flat order, from the shard files the manifest lists (moments skipped)."""
    ckpt = latest(run)
    with open(os.path.join(ckpt, "manifest.json")) as f:
        manifest = json.load(f)
    parts = []
    for shard in manifest["shards"]:
        with open(os.path.join(ckpt, shard["file"]), "rb") as f:
            data = f.read()
        (header_len,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + header_len])
        body = data[8 + header_len:]
        for piece in shard["pieces"]:
            if piece["name"].startswith("exp_avg"):
                continue
            a, b = header[piece["name"]]["data_offsets"]
            parts.append(np.frombuffer(body[a:b], dtype=np.float32))
    return np.concatenate(parts).astype(np.float64)


def main():
    tol = float(sys.argv[1])
    ref = sys.argv[2]
    ref_loss, ref_w = losses(ref), weights(ref)
    ok = True
    for run in sys.argv[3:]:
        loss = losses(run)
        if sorted(loss) != sorted(ref_loss):
            print(f"FAIL {run}: steps {sorted(loss)} differ from the reference's")
            ok = False
            continue
        worst = max(abs(loss[s] - ref_loss[s]) / abs(ref_loss[s]) for s in ref_loss)
        w = weights(run)
        werr = float(np.linalg.norm(w - ref_w) / np.linalg.norm(ref_w))
        good = worst <= tol and werr <= tol
        same = ""
        if tol == 0:
            good = good and digest(run) == digest(ref)
            same = f", weights sha256 {digest(run)[:16]}{'' if digest(run) == digest(ref) else ' vs ' + digest(ref)[:16]}"
        ok &= good
        print(f"{'ok' if good else 'FAIL'} {os.path.basename(run)}: {len(loss)} steps, largest loss difference "
              f"{worst:.2e} (relative), final weights relative error {werr:.2e} (tolerance {tol:g}){same}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
