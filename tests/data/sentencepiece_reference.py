#!/usr/bin/env python3
"""The reference for anvil's SentencePiece tokenizer: Debian's python3-sentencepiece, which is not
anvil's code (anvil links the C++ library; these are the Python bindings and their own handling
of the input). Commands:

  encode MODEL FILE...            ids of the files' bytes, concatenated, one per line
  decode MODEL IDS_FILE           the text of whitespace-separated ids, as bytes on stdout
  prepared MODEL SPLIT_DIR SEQ FILE...
                                  checks that an MDS split holds the files as training documents
                                  (BOS, the text, EOS, back to back) cut into SEQ-token samples;
                                  exits 1 at the first difference
"""
import os
import sys

import sentencepiece

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mds_reference  # noqa: E402


def processor(model):
    return sentencepiece.SentencePieceProcessor(model_file=model)


def read_all(files):
    data = b""
    for f in files:
        with open(f, "rb") as fh:
            data += fh.read()
    return data


def main():
    cmd = sys.argv[1]
    sp = processor(sys.argv[2])
    if cmd == "encode":
        # Bytes go to the library as bytes: invalid UTF-8 is handled as the library handles it.
        ids = sp.encode(read_all(sys.argv[3:]))
        sys.stdout.write("".join(f"{i}\n" for i in ids))
    elif cmd == "decode":
        with open(sys.argv[3]) as fh:
            ids = [int(t) for t in fh.read().split()]
        sys.stdout.buffer.write(sp.decode(ids).encode("utf-8"))
    elif cmd == "prepared":
        split, seq = sys.argv[3], int(sys.argv[4])
        stream = []
        for f in sys.argv[5:]:
            body = sp.encode(read_all([f]))
            if body:
                stream += ([sp.bos_id()] if sp.bos_id() >= 0 else []) + body + [sp.eos_id()]
        _, samples, _ = mds_reference.read_samples(split)
        expected = [stream[i:i + seq] for i in range(0, len(stream) - seq + 1, seq)]
        if len(samples) != len(expected):
            sys.exit(f"{split}: {len(samples)} samples, expected {len(expected)}")
        for k, (got, want) in enumerate(zip(samples, expected)):
            if list(got) != want:
                sys.exit(f"{split}: sample {k} differs: {list(got)[:12]}... expected {want[:12]}...")
        print(f"{len(samples)} samples of {seq} tokens, {len(stream)} tokens in the stream")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
