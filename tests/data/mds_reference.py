#!/usr/bin/env python3
"""An independent MDS v2 reader and writer, written in Python from the format's specification
(docs/formats.md), used to check that anvil's datasets are what MosaicML streaming's MDSWriter
writes for a {"tokens": "ndarray:int32"} column (pretraining) or a {"turns": "json"} column (LLM
Foundry's tokenized fine-tuning data), byte for byte.

usage: mds_reference.py DATASET_DIR
Reads every shard of DATASET_DIR (verifying sizes, offsets and every recorded hash), rewrites the
same samples with the same options into a temporary directory the way MDSWriter does, and
compares the MDS files byte for byte (anvil's tokenizer_record.json and chat_template.json
aside). Exits 1 with the first difference.

usage: mds_reference.py --write-turns JSONL OUT_DIR
Writes the samples of JSONL (one {"turns": [...]} object per line) as a turns dataset, as
Foundry's conversion script writes one, for anvil to read.
"""
import hashlib, json, os, struct, sys, tempfile

import xxhash


def digest(algo, data):
    if algo in ("xxh32", "xxh64", "xxh3_64", "xxh128"):
        return {"xxh32": xxhash.xxh32, "xxh64": xxhash.xxh64, "xxh3_64": xxhash.xxh3_64,
                "xxh128": xxhash.xxh3_128}[algo](data).hexdigest()
    return hashlib.new(algo, data).hexdigest()


def read_samples(directory):
    index = json.load(open(os.path.join(directory, "index.json")))
    assert index["version"] == 2, "index version"
    samples, options = [], None
    for shard in index["shards"]:
        assert shard["format"] == "mds" and shard["version"] == 2
        kind = shard["column_names"][0]
        assert (shard["column_names"], shard["column_encodings"]) in ((["tokens"], ["ndarray:int32"]),
                                                                     (["turns"], ["json"]))
        assert shard["zip_data"] is None, "this check covers uncompressed datasets"
        raw = open(os.path.join(directory, shard["raw_data"]["basename"]), "rb").read()
        assert len(raw) == shard["raw_data"]["bytes"], "shard size"
        for algo, want in shard["raw_data"]["hashes"].items():
            assert digest(algo, raw) == want, f"{algo} of {shard['raw_data']['basename']}"
        (n,) = struct.unpack_from("<I", raw, 0)
        assert n == shard["samples"]
        offsets = struct.unpack_from(f"<{n + 1}I", raw, 4)
        assert offsets[-1] == len(raw)
        for i in range(n):
            s = raw[offsets[i]:offsets[i + 1]]
            (size,) = struct.unpack_from("<I", s, 0)
            col = s[4:4 + size]
            if kind == "turns":
                samples.append(json.loads(col.decode("utf-8")))
                continue
            ndim, shape_code = col[0] >> 2, col[0] & 3
            assert ndim == 1
            width = 1 << shape_code
            dim = int.from_bytes(col[1:1 + width], "little")
            values = struct.unpack_from(f"<{dim}i", col, 1 + width)
            samples.append(values)
        options = (shard["compression"], shard["hashes"], shard["size_limit"], kind)
    return index, samples, options


def encode_sample(values):
    if isinstance(values, dict):  # streaming's json encoding
        column = json.dumps(values).encode("utf-8")
        return struct.pack("<I", len(column)) + column
    n = len(values)
    code = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2 if n < 1 << 32 else 3
    column = bytes([(1 << 2) | code]) + n.to_bytes(1 << code, "little") + struct.pack(f"<{n}i", *values)
    return struct.pack("<I", len(column)) + column


def write_dataset(directory, samples, compression, hashes, size_limit, kind="tokens"):
    config = {"version": 2, "format": "mds", "compression": compression, "hashes": hashes,
              "size_limit": size_limit, "column_names": [kind],
              "column_encodings": ["ndarray:int32" if kind == "tokens" else "json"], "column_sizes": [None]}
    config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
    shards, pending = [], []
    per_shard = 4 + 4 + len(config_bytes)
    size = per_shard

    def flush():
        sizes = [len(p) for p in pending]
        offsets, at = [], 4 + 4 * (len(pending) + 1) + len(config_bytes)
        offsets.append(at)
        for s in sizes:
            at += s
            offsets.append(at)
        data = struct.pack("<I", len(pending)) + struct.pack(f"<{len(offsets)}I", *offsets) + config_bytes + b"".join(pending)
        name = f"shard.{len(shards):05}.mds"
        open(os.path.join(directory, name), "wb").write(data)
        entry = {"samples": len(pending), "raw_data": {"basename": name, "bytes": len(data),
                 "hashes": {a: digest(a, data) for a in hashes}}, "zip_data": None}
        entry.update(config)
        shards.append(entry)

    for values in samples:
        enc = encode_sample(values)
        cost = len(enc) + 4
        if size_limit and size_limit < size + cost:
            flush()
            pending, size = [], per_shard
        pending.append(enc)
        size += cost
    if pending:
        flush()
    open(os.path.join(directory, "index.json"), "wb").write(
        json.dumps({"version": 2, "shards": shards}, sort_keys=True).encode("utf-8"))


def main():
    if sys.argv[1] == "--write-turns":
        os.makedirs(sys.argv[3])
        samples = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8") if line.strip()]
        write_dataset(sys.argv[3], samples, None, ["sha1"], 1 << 26, "turns")
        return
    directory = sys.argv[1]
    index, samples, (compression, hashes, size_limit, kind) = read_samples(directory)
    with tempfile.TemporaryDirectory() as tmp:
        write_dataset(tmp, samples, compression, hashes, size_limit, kind)
        names = sorted(f for f in os.listdir(tmp))
        # anvil's records sit beside the MDS files (streaming does not read them).
        ours = sorted(f for f in os.listdir(directory)
                      if not f.startswith(".") and f not in ("tokenizer_record.json", "chat_template.json"))
        if names != ours:
            sys.exit(f"files differ: reference writes {names}, anvil wrote {ours}")
        for f in names:
            a = open(os.path.join(tmp, f), "rb").read()
            b = open(os.path.join(directory, f), "rb").read()
            if a != b:
                at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                sys.exit(f"{f}: anvil's bytes differ from the reference writer's at byte {at} "
                         f"(sizes {len(b)} vs {len(a)})")
    print(f"{directory}: {len(index['shards'])} shards, {len(samples)} samples: identical to the reference writer")


if __name__ == "__main__":
    main()
