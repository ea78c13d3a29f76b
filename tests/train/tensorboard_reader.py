#!/usr/bin/env python3
"""An independent reader of TensorBoard event files (TensorBoard itself cannot be installed here),
written from the record format: u64 length, masked CRC-32C of the length, the Event protobuf,
masked CRC-32C of it. Every CRC is verified; the first event of each file must carry
file_version "brain.Event:2"; scalars are Summary.Value simple_value floats.

usage: tensorboard_reader.py LOG_DIR METRICS_JSONL
Checks that the scalars of every event file in LOG_DIR are the run's metrics.jsonl figures (as
float32), step for step, and prints what it read. Exits 1 at the first difference.
"""
import glob
import json
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(buf):
    """(field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, v


def read_events(path):
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert len_crc == masked(header), f"{path}: length CRC at byte {i}"
        body = data[i + 12:i + 12 + length]
        (body_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        assert body_crc == masked(body), f"{path}: data CRC at byte {i}"
        events.append(body)
        i += 16 + length
    return events


def main():
    log_dir, metrics = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    assert files, f"no event files in {log_dir}"
    scalars = {}
    for path in files:
        events = read_events(path)
        first = {n: v for n, _, v in fields(events[0])}
        assert first.get(3) == b"brain.Event:2", f"{path}: first event has no file_version"
        for body in events[1:]:
            step, summary = None, None
            for n, _, v in fields(body):
                if n == 2:
                    step = v
                elif n == 5:
                    summary = v
            assert step is not None and summary is not None, f"{path}: an event without step or summary"
            for n, _, value in fields(summary):
                assert n == 1
                vf = {k: v for k, _, v in fields(value)}
                tag = vf[1].decode()
                (x,) = struct.unpack("<f", vf[2])
                scalars.setdefault(tag, {})[step] = x  # a resumed run's rewrite of a step wins
    rows = [json.loads(line) for line in open(metrics)]
    f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
    want = {"loss/train": "loss", "lr": "lr", "grad_norm": "grad_norm", "throughput/tokens_per_s": "tokens_per_s",
            "throughput/mfu": "mfu", "memory/peak_rss_mib": "peak_rss_mib", "loss/eval": "eval_loss"}
    checked = 0
    for tag, key in want.items():
        expected = {r["step"]: f32(r[key]) for r in rows if key in r}
        got = scalars.get(tag, {})
        if expected != got:
            sys.exit(f"{tag}: event files hold {sorted(got.items())[:4]}..., metrics.jsonl {sorted(expected.items())[:4]}...")
        checked += len(got)
    print(f"{len(files)} event file(s), {checked} scalars over {len(scalars)} tags, every CRC verified, "
          f"equal to metrics.jsonl")


if __name__ == "__main__":
    main()
