#!/usr/bin/env python3
"""Writes a saved compressed cache (--kv_cache.save's format, engine/kv/compressed_cache_codec.h)
from the layout alone, with Python's struct module, as an encoder independent of kvlab's:
tests/fixtures/compressed_cache/two_layers.kvc (CompressedCacheFile.ReadsAFileWrittenFromTheLayout)
and the fuzz seed fuzz/corpus/compressed_cache_fuzz/valid.kvc.

    python3 tools/reference/compressed_cache_fixture.py
"""
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fnv1a64(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def encode(name, context_ids, rope_width, B, G, D, layers):
    fp = fnv1a64(b"".join(struct.pack("<i", i) for i in context_ids))
    out = b"KVCC" + struct.pack("<I", 1)
    out += struct.pack("<QQQQQQ", len(context_ids), fp, rope_width, B, G, D)
    out += struct.pack("<I", 0)  # DType::F32
    out += struct.pack("<I", len(name)) + name.encode()
    out += struct.pack("<I", len(layers))
    for kept, positions, scores, K, V in layers:
        out += struct.pack("<Q", kept) + bytes([1 if scores else 0])
        out += struct.pack("<%di" % len(positions), *positions)
        out += struct.pack("<%df" % len(scores), *scores)
        out += struct.pack("<%df" % len(K), *K) + struct.pack("<%df" % len(V), *V)
    return out + struct.pack("<Q", fnv1a64(out))


def main():
    # Context ids 10..16 (7 tokens); B = 1, G = 2, D = 2; layer 0 keeps 3 slots per head with
    # scores, layer 1 keeps 2 without (a position-only policy).
    ctx = list(range(10, 17))
    l0 = (3, [0, 2, 6, 1, 2, 5], [0.5, 0.25, 2.0, 1.0, 1.5, 0.125], [float(i) for i in range(12)], [float(-i) for i in range(12)])
    l1 = (2, [0, 6, 0, 6], [], [0.5 * i for i in range(8)], [0.25 * i for i in range(8)])
    data = encode("h2o-default", ctx, 64, 1, 2, 2, [l0, l1])
    for path in ("tests/fixtures/compressed_cache/two_layers.kvc", "fuzz/corpus/compressed_cache_fuzz/valid.kvc"):
        with open(os.path.join(ROOT, path), "wb") as f:
            f.write(data)
    print(len(data), "bytes")


if __name__ == "__main__":
    main()
