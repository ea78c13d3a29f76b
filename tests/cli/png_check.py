#!/usr/bin/env python3
"""Checks a loss plot as a reader would see it, with a PNG decoder written here (zlib and the five
PNG filters): the size, and that each run's colour is drawn.

Usage: png_check.py FILE.png WIDTH HEIGHT RUNS
Prints the colour counts; exits non-zero when the image is the wrong size or a run is missing."""
import struct
import sys
import zlib

# anvil's palette, in run order (src/train/loss_plot.cpp).
PALETTE = [(0, 114, 178), (230, 159, 0), (0, 158, 115), (204, 121, 167), (86, 180, 233), (213, 94, 0)]


def decode(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG layout {header}"
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, channels, rows


def main():
    path, want_w, want_h, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    width, height, channels, rows = decode(path)
    counts = [0] * len(PALETTE)
    for line in rows:
        for x in range(width):
            px = tuple(line[x * channels:x * channels + 3])
            for k, colour in enumerate(PALETTE):
                if px == colour:
                    counts[k] += 1
    print(f"{width}x{height}, pixels of each run's colour: {counts[:runs]}")
    ok = (width, height) == (want_w, want_h) and all(n >= 200 for n in counts[:runs])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
