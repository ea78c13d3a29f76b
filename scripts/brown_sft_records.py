#!/usr/bin/env python3
"""Instruction records made from the Brown corpus, for configs/sft-demo.yaml and the fine-tuning
tests: name the genre of a passage. Prompt/response records and chat records (one and two
turns), written as JSON lines to OUT_DIR/train.jsonl and OUT_DIR/validation.jsonl, split by
document (every tenth document is validation).

usage: brown_sft_records.py BROWN_TEXT_DIR OUT_DIR   (BROWN_TEXT_DIR: scripts/brown_to_text.sh's output)
"""
import json, os, sys

GENRES = {"a": "press reportage", "b": "press editorial", "c": "press reviews", "d": "religion",
          "e": "skills and hobbies", "f": "popular lore", "g": "belles lettres", "h": "government",
          "j": "learned", "k": "fiction", "l": "mystery", "m": "science fiction", "n": "adventure",
          "p": "romance", "r": "humor"}


def passages(path, n=3, words=16):
    paras = [p.strip() for p in open(path, encoding="utf-8").read().split("\n\n") if p.strip()]
    return [" ".join(p.split()[:words]) for p in paras[:n]]


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    splits = {"train": [], "validation": []}
    for i, name in enumerate(sorted(f for f in os.listdir(src) if f.endswith(".txt"))):
        genre = GENRES[name[1]]
        ps = passages(os.path.join(src, name))
        if len(ps) < 3:
            continue
        split = "validation" if i % 10 == 0 else "train"
        recs = splits[split]
        recs.append({"prompt": f"Which kind of writing is this?\n{ps[0]}\nAnswer:", "response": f" {genre}"})
        recs.append({"messages": [{"role": "user", "content": f"Name the genre: {ps[1]}"},
                                  {"role": "assistant", "content": genre}]})
        recs.append({"messages": [{"role": "system", "content": "You name genres."},
                                  {"role": "user", "content": f"Genre? {ps[2]}"},
                                  {"role": "assistant", "content": genre},
                                  {"role": "user", "content": "Say it again."},
                                  {"role": "assistant", "content": genre}]})
    for split, recs in splits.items():
        with open(os.path.join(out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
