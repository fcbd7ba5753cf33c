"""keydiff in Python (KeyDiff, kvpress' KeyDiffPress; the built-in keydiff): keys that point
where most keys of their head point add little, so after every chunk each held key is scored
minus its cosine to the anchor, the mean of the row's unit keys. The class keeps its own state
(each held token's unit key, by position), so it rescores in update() without attention.
Sums run in float64 in the built-in's order, so the decisions are the same to the bit.

    kvlab.register_policy("keydiff_py", KeyDiff)   # then kv_cache.name "keydiff_py-default"
"""
import math

import numpy as np

POLICY_NAME = "keydiff_py"


class KeyDiff:
    """keydiff in Python: evict the keys most similar to their head's mean unit key"""

    needs = ("keys",)

    def __init__(self):
        self.unit = {}  # (row, token position) -> unit key (float32, as the built-in stores it)

    def score(self, f):
        k = f.keys.astype(np.float64)  # (rows, n, head_dim)
        n2 = np.zeros(k.shape[:2])
        for d in range(k.shape[2]):  # the built-in's order: one dimension after another
            n2 += k[:, :, d] * k[:, :, d]
        u = (k * (1.0 / np.maximum(np.sqrt(n2), 1e-12))[:, :, None]).astype(np.float32)
        for r in range(f.rows):
            for i in range(f.n):
                self.unit[(r, f.input_pos + i)] = u[r, i]
        return np.zeros((f.rows, f.n), np.float32)  # scored with the others after the chunk

    def update(self, f):
        T = f.length
        held = set()
        for r in range(f.rows):
            pos = f.positions[r, :T]
            U = np.stack([self.unit[(r, int(p))] for p in pos]).astype(np.float64)  # slot order
            held.update((r, int(p)) for p in pos)
            anchor = np.zeros(U.shape[1])
            for j in range(T):
                anchor += U[j]
            anchor /= T
            an = 0.0
            for a in anchor:
                an += a * a
            inv = 1.0 / max(math.sqrt(an), 1e-8)  # torch's cosine_similarity clamps |a| at 1e-8
            dot = np.zeros(T)
            for d in range(U.shape[1]):
                dot += U[:, d] * anchor[d]
            f.scores[r, :T] = (-dot * inv).astype(np.float32)
        self.unit = {key: v for key, v in self.unit.items() if key in held}  # evicted tokens go
