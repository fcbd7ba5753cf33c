#!/usr/bin/python3
"""Independent float64 reference for kvlab's GGUF path on SmolLM2-135M-Instruct (Q4_1).

Reads the GGUF file with its own minimal reader (header, typed metadata, tensor infos,
general.alignment, data offsets) and its own dequantizers (F32, Q8_0, Q4_1: the only types in
this file; anything else is refused), tokenizes two fixed prompts with its own small byte-level
BPE over the file's vocabulary and merges, runs the Llama forward pass in float64 with explicit
attention (torch 1.13 has no fused SDPA) and writes the last-position logits to a small
safetensors fixture. Nothing here is derived from kvlab's C++ code; layouts and formulas come
from the GGUF/ggml format documentation (ggml docs/gguf.md, ggml-common.h block structs).

Regenerate (Debian's python3-torch; never part of the build or CI), after
scripts/fetch_assets.sh has put the model into assets/cache:
    /usr/bin/python3 tools/reference/gguf_reference.py \
        --gguf assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/fixtures/gguf
(about 2 minutes on 2 cores; writes tests/fixtures/gguf/smollm2_135m_q4_1.safetensors).
The C++ side is tests/engine/gguf_smollm2_test.cpp.

Dequantization is evaluated in float32 one operation at a time (numpy float32 arrays: every
multiply and add is rounded to f32, no fused multiply-add), x = q * d (+ m); the resulting f32
weights are then widened to float64 exactly. This is "identical dequantization": the same f32
weight values any correct f32 dequantizer of these formulas produces. All further math is f64.

RoPE and llama.cpp's Q/K row permutation
----------------------------------------
llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) stores, for architecture
"llama", q_proj permuted with n_head and k_proj permuted with n_head_kv:
    W_gguf = W_hf.reshape(n, 2, D/2, in).swapaxes(1, 2).reshape(n*D, in)
i.e. GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i (i < D/2, j in {0, 1}). llama.cpp then
applies its "normal" RoPE to the llama architecture, which rotates consecutive pairs
(2i, 2i+1) by pos * base^(-2i/D). This script uses exactly that: interleaved RoPE on the
weights as stored, with no un-permutation. kvlab instead moves the rows back to HF order and
applies rotate-half RoPE (pairs (i, i + D/2), same frequency base^(-2i/D)). The two are
equivalent: under the row map above, GGUF pair (2i, 2i+1) *is* HF pair (i, i + D/2), rotated by
the same angle with the same sign convention; so the rotated q and k of one head are the HF
ones with their D coordinates permuted the same way, and every dot product q.k (hence every
attention weight) is unchanged. V and the output projection are not permuted. Because the two
routes share nothing but the formula above, agreement of kvlab's logits with these logits tests
kvlab's un-permutation. The script also runs the second route (un-permute + rotate-half) on the
first prompt and asserts both agree to f64 rounding (--no-crosscheck skips it).

Prompt ids
----------
Both prompts are tokenized here by `bpe_encode` (GPT-2 byte-to-unicode map, the GPT-2
pre-tokenizer regex restricted to ASCII letters/punctuation/space, lowest-rank merge first,
special tokens <|im_start|>/<|im_end|> matched before splitting). Digits and non-ASCII are
refused (SmolLM2 splits digits one by one; not needed here). The ids are checked against the
hard-coded EXPECTED_IDS below, so a tokenizer change cannot silently change the fixture, and
the C++ test checks that kvlab's tokenizer produces the same ids from the same text.
"""

import argparse
import hashlib
import json
import math
import os
import re
import struct
import time

import numpy as np
import torch

FIXTURE_MAGIC = "kvlab-gguf-fixture"
FIXTURE_VERSION = 1
FIXTURE_NAME = "smollm2_135m_q4_1.safetensors"

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
# What bpe_encode gives for PROMPTS with this file's vocabulary (recorded from its first run;
# the same ids HF's SmolLM2 tokenizer gives: <|im_start|>=1, <|im_end|>=2, "\n"=198).
EXPECTED_IDS = [
    [504, 3575, 282, 4649, 314],
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
]
GREEDY_STEPS = 12  # greedy continuation of the chat prompt (reported, stored for the test)


# ---------------------------------------------------------------------------------------------
# GGUF container (docs/gguf.md): little-endian throughout.
#   header: magic "GGUF" (4 bytes), u32 version (3), u64 tensor_count, u64 metadata_kv_count
#   kv:     string key, u32 value_type, value
#   string: u64 length + UTF-8 bytes (no terminator)
#   array:  u32 element type, u64 count, elements
#   tensor info: string name, u32 n_dims, u64 ne[n_dims] (ne[0] = fastest-varying), u32 ggml
#                type, u64 offset relative to the start of the data section (a multiple of
#                the alignment)
#   data section: starts at the first multiple of general.alignment (default 32) after the
#                 tensor infos.
# ---------------------------------------------------------------------------------------------
GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34)}


class GgufError(Exception):
    pass


class GgufFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.path = path
        self.pos = 0
        if self.buf[:4] != b"GGUF":
            raise GgufError(f"{path}: bad magic {self.buf[:4]!r}")
        self.pos = 4
        self.version = self._scalar("<I")
        if self.version != 3:
            raise GgufError(f"{path}: version {self.version}, expected 3")
        n_tensors = self._scalar("<Q")
        n_kv = self._scalar("<Q")
        self.meta = {}
        for _ in range(n_kv):
            key = self._string()
            vtype = self._scalar("<I")
            if key in self.meta:
                raise GgufError(f"{path}: duplicate key {key}")
            self.meta[key] = self._value(vtype)
        self.infos = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar("<I")
            if not 1 <= n_dims <= 4:
                raise GgufError(f"{path}: tensor {name}: {n_dims} dims")
            ne = [self._scalar("<Q") for _ in range(n_dims)]
            gtype = self._scalar("<I")
            offset = self._scalar("<Q")
            self.infos[name] = (ne, gtype, offset)
        self.alignment = int(self.meta.get("general.alignment", 32))
        self.data_start = (self.pos + self.alignment - 1) // self.alignment * self.alignment
        for name, (ne, gtype, offset) in self.infos.items():
            if gtype not in GGML_TYPES:
                raise GgufError(f"{path}: tensor {name}: ggml type {gtype} not supported by this reference")
            _, blk, bb = GGML_TYPES[gtype]
            if ne[0] % blk:
                raise GgufError(f"{path}: tensor {name}: ne[0]={ne[0]} not a multiple of {blk}")
            nbytes = math.prod(ne) // blk * bb
            if offset % self.alignment or self.data_start + offset + nbytes > len(self.buf):
                raise GgufError(f"{path}: tensor {name}: data [{offset}, +{nbytes}) misaligned or past the end")

    def _scalar(self, fmt):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.buf):
            raise GgufError(f"{self.path}: truncated at byte {self.pos}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def _string(self):
        n = self._scalar("<Q")
        if self.pos + n > len(self.buf):
            raise GgufError(f"{self.path}: string of {n} bytes past the end")
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype in GGUF_SCALARS:
            return self._scalar(GGUF_SCALARS[vtype])
        if vtype == GGUF_STRING:
            return self._string()
        if vtype == GGUF_ARRAY:
            etype = self._scalar("<I")
            n = self._scalar("<Q")
            return [self._value(etype) for _ in range(n)]
        raise GgufError(f"{self.path}: unknown value type {vtype}")

    def tensor(self, name):
        """Dequantized f32 numpy array with shape ne reversed (PyTorch [out, in] for matrices)."""
        ne, gtype, offset = self.infos[name]
        tname, blk, bb = GGML_TYPES[gtype]
        n = math.prod(ne)
        raw = np.frombuffer(self.buf, dtype=np.uint8, count=n // blk * bb, offset=self.data_start + offset)
        y = DEQUANT[tname](raw, n)
        return y.reshape(list(reversed(ne)))


# ---------------------------------------------------------------------------------------------
# Dequantizers (ggml-common.h block structs; all blocks 32 elements, little-endian fp16 fields)
#   Q8_0: { f16 d; int8 qs[32]; }            34 bytes, x[j] = qs[j] * d
#   Q4_1: { f16 d; f16 m; u8 qs[16]; }       20 bytes, byte j = element j (low nibble) and
#                                            element j + 16 (high nibble), x = q * d + m
# ---------------------------------------------------------------------------------------------
def _f16_field(blocks, start):
    return blocks[:, start:start + 2].copy().view("<f2").astype(np.float32)  # exact widening


def deq_f32(raw, n):
    return raw.view("<f4").astype(np.float32)


def deq_q8_0(raw, n):
    b = raw.reshape(n // 32, 34)
    d = _f16_field(b, 0)                                # (nb, 1)
    q = b[:, 2:34].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(n)                           # one f32 multiply per element


def deq_q4_1(raw, n):
    b = raw.reshape(n // 32, 20)
    d = _f16_field(b, 0)
    m = _f16_field(b, 2)
    qs = b[:, 4:20]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)  # elements 0..15, 16..31
    return (q * d + m).reshape(n)                       # f32 multiply, then f32 add


DEQUANT = {"F32": deq_f32, "Q8_0": deq_q8_0, "Q4_1": deq_q4_1}


# ---------------------------------------------------------------------------------------------
# Byte-level BPE (ASCII subset), from tokenizer.ggml.tokens / tokenizer.ggml.merges
# ---------------------------------------------------------------------------------------------
def byte_to_unicode():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


# GPT-2 pre-tokenizer with \p{L} -> [A-Za-z]; valid because bpe_encode refuses other letters.
PRETOK = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
SPECIALS = ["<|im_start|>", "<|im_end|>"]


def bpe_encode(text, tokens, merges):
    if any(ord(c) > 127 or c.isdigit() for c in text):
        raise ValueError("this small BPE handles ASCII text without digits only")
    vocab = {t: i for i, t in enumerate(tokens)}
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    b2u = byte_to_unicode()
    ids = []
    for part in re.split("(" + "|".join(re.escape(s) for s in SPECIALS) + ")", text):
        if part in SPECIALS:
            ids.append(vocab[part])
            continue
        for word in PRETOK.findall(part):
            sym = [b2u[b] for b in word.encode("utf-8")]
            while len(sym) > 1:
                pairs = [(rank.get((sym[i], sym[i + 1]), 1 << 60), i) for i in range(len(sym) - 1)]
                r, i = min(pairs)
                if r == 1 << 60:
                    break
                sym = sym[:i] + [sym[i] + sym[i + 1]] + sym[i + 2:]
            ids.extend(vocab[s] for s in sym)
    return ids


# ---------------------------------------------------------------------------------------------
# The model in float64
# ---------------------------------------------------------------------------------------------
def load_weights(g):
    a = "llama."
    cfg = {
        "n_layer": g.meta[a + "block_count"], "n_embd": g.meta[a + "embedding_length"],
        "n_head": g.meta[a + "attention.head_count"], "n_head_kv": g.meta[a + "attention.head_count_kv"],
        "n_ff": g.meta[a + "feed_forward_length"], "eps": float(g.meta[a + "attention.layer_norm_rms_epsilon"]),
        "base": float(g.meta[a + "rope.freq_base"]), "n_rot": g.meta[a + "rope.dimension_count"],
    }
    cfg["head_dim"] = cfg["n_embd"] // cfg["n_head"]
    assert g.meta["general.architecture"] == "llama"
    assert cfg["n_rot"] == cfg["head_dim"], "partial rotary not handled"
    W = {name: torch.from_numpy(np.ascontiguousarray(g.tensor(name))).double() for name in g.infos}
    if "output.weight" not in W:
        W["output.weight"] = W["token_embd.weight"]  # tied embeddings
    return cfg, W


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def inv_freq(cfg):
    D = cfg["head_dim"]
    return torch.tensor([cfg["base"] ** (-2.0 * i / D) for i in range(D // 2)], dtype=torch.float64)


def rope_interleaved(x, pos, freq):
    """llama.cpp 'normal' RoPE: pairs (2i, 2i+1). x (H, T, D)."""
    ang = pos[:, None].double() * freq[None, :]        # (T, D/2)
    c, s = torch.cos(ang), torch.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_half(x, pos, freq):
    """Hugging Face rotate-half RoPE: pairs (i, i + D/2). x (H, T, D)."""
    ang = pos[:, None].double() * freq[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)


def unpermute_rows(w, n_head):
    """Inverse of the converter's permute: GGUF row h*D + 2i + j -> HF row h*D + j*D/2 + i."""
    D = w.shape[0] // n_head
    return w.reshape(n_head, D // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def forward(cfg, W, ids, route="interleaved"):
    """Logits (T, V) in float64 for one sequence of ids starting at position 0."""
    T = len(ids)
    NH, G, D = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    eps = cfg["eps"]
    freq = inv_freq(cfg)
    pos = torch.arange(T)
    x = W["token_embd.weight"][torch.tensor(ids)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        p = f"blk.{l}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        wq, wk = W[p + "attn_q.weight"], W[p + "attn_k.weight"]
        if route == "half":
            wq, wk = unpermute_rows(wq, NH), unpermute_rows(wk, G)
        q = (h @ wq.T).view(T, NH, D).transpose(0, 1)
        k = (h @ wk.T).view(T, G, D).transpose(0, 1)
        v = (h @ W[p + "attn_v.weight"].T).view(T, G, D).transpose(0, 1)
        rope = rope_interleaved if route == "interleaved" else rope_half
        q, k = rope(q, pos, freq), rope(k, pos, freq)
        k = k.repeat_interleave(NH // G, dim=0)      # query head h uses kv head h // (NH/G)
        v = v.repeat_interleave(NH // G, dim=0)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, NH * D)
        x = x + a @ W[p + "attn_output.weight"].T
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        gate = h @ W[p + "ffn_gate.weight"].T
        up = h @ W[p + "ffn_up.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "ffn_down.weight"].T
    x = rms_norm(x, W["output_norm.weight"], eps)
    return x @ W["output.weight"].T


def greedy(cfg, W, ids, steps, eos):
    ids, out, margins = list(ids), [], []
    for _ in range(steps):
        z = forward(cfg, W, ids)[-1]
        top = torch.topk(z, 2)
        nxt = int(top.indices[0])
        out.append(nxt)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(nxt)
        if nxt == eos:
            break
    return out, margins


# ---------------------------------------------------------------------------------------------
# safetensors writer (u64 LE header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------------------------
DTYPE_NAMES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        b = t.numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-crosscheck", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    with open(args.gguf, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    g = GgufFile(args.gguf)
    tokens, merges = g.meta["tokenizer.ggml.tokens"], g.meta["tokenizer.ggml.merges"]
    eos = int(g.meta["tokenizer.ggml.eos_token_id"])
    cfg, W = load_weights(g)
    types = sorted({GGML_TYPES[t][0] for _, t, _ in g.infos.values()})
    print(f"{args.gguf}: sha256 {sha}, {len(g.infos)} tensors ({', '.join(types)}), data at {g.data_start}, "
          f"alignment {g.alignment}; cfg {cfg}")

    expected = {}
    for j, text in enumerate(PROMPTS):
        ids = bpe_encode(text, tokens, merges)
        if EXPECTED_IDS[j] is not None and ids != EXPECTED_IDS[j]:
            raise SystemExit(f"prompt {j}: tokenized to {ids}, expected {EXPECTED_IDS[j]}")
        logits = forward(cfg, W, ids)
        last = logits[-1]
        top = torch.topk(last, 5)
        print(f"prompt {j} {text!r}: ids {ids}")
        print("  top-5 next:", [(tokens[int(i)], round(float(v), 4)) for v, i in zip(top.values, top.indices)])
        expected[f"input_ids.{j}"] = torch.tensor(ids, dtype=torch.int64)
        expected[f"logits.{j}"] = last.to(torch.float32)  # f32 storage: 6e-8 relative, far below 1e-4
        if j == 0 and not args.no_crosscheck:
            alt = forward(cfg, W, ids, route="half")[-1]
            d = float((alt - last).abs().max() / last.abs().max())
            print(f"  cross-check un-permute + rotate-half vs interleaved on stored rows: max rel diff {d:.3e}")
            assert d < 1e-12, "the two RoPE routes disagree"
            wrong = forward(cfg, W, ids, route="wrong")[-1]  # rotate-half on rows left permuted
            d = float((wrong - last).abs().max() / last.abs().max())
            wt = torch.topk(wrong, 3)
            print(f"  (rotate-half on the rows as stored would differ by max rel {d:.3e}; "
                  f"top-3 {[tokens[int(i)] for i in wt.indices]})")

    chat_ids = expected["input_ids.1"].tolist()
    toks, margins = greedy(cfg, W, chat_ids, GREEDY_STEPS, eos)
    print(f"greedy chat continuation: {toks} = {''.join(tokens[t] for t in toks)!r}")
    print("  margins:", [round(m, 3) for m in margins])
    expected["greedy.tokens"] = torch.tensor(toks, dtype=torch.int64)
    expected["greedy.margins"] = torch.tensor(margins, dtype=torch.float64)

    meta = {"magic": FIXTURE_MAGIC, "version": str(FIXTURE_VERSION), "gguf_file": os.path.basename(args.gguf),
            "gguf_sha256": sha, "inputs": str(len(PROMPTS)), "generator": "tools/reference/gguf_reference.py",
            "torch": torch.__version__, "numpy": np.__version__}
    for j, text in enumerate(PROMPTS):
        meta[f"prompt.{j}"] = text
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, FIXTURE_NAME)
    write_safetensors(path, expected, meta)
    print(f"wrote {path} ({os.path.getsize(path)} bytes) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
