"""snapkv in Python: the chunk's last `window` queries vote with their attention, average-pooled
over `kernel` neighbouring positions (zero padding counted) before the window, and the window
itself is kept (its tokens take the layer's highest score) — SnapKV's published rule, as the
built-in snapkv, in NumPy.

    kvlab.register_policy("snapkv_py", SnapKV)   # then kv_cache.name "snapkv_py-default"
"""
import numpy as np

POLICY_NAME = "snapkv_py"


class SnapKV:
    """snapkv in Python: last-window attention votes pooled before the window; the window kept"""

    needs = ("attention",)

    def __init__(self, window=32, kernel=5):
        self.attention_window = window  # --kv_cache.snapkv_window of the built-in
        self.kernel = kernel            # --kv_cache.snapkv_kernel

    def score(self, f):
        return np.zeros((f.rows, f.n), np.float32)  # new tokens start at 0 until they are voted on

    def update(self, f):
        T, half = f.length, self.kernel // 2
        first = f.input_pos - min(self.attention_window, f.n)  # the window: positions [first, input_pos)
        top = np.float32(-np.inf)
        for r in range(f.rows):
            pos = f.positions[r, :T]
            order = np.argsort(pos, kind="stable")  # neighbours in the sequence
            sorted_pos = pos[order]
            lo = int(np.searchsorted(sorted_pos, 0))      # empty slots (-1) first
            m = int(np.searchsorted(sorted_pos, first))   # pooled: the positions before the window
            f.scores[r, order[:lo]] = 0
            if m == lo:
                continue
            votes = f.weights[r, order[lo:m]]
            padded = np.zeros(m - lo + 2 * half, np.float32)
            padded[half:half + m - lo] = votes
            pooled = np.zeros(m - lo, np.float32)
            for k in range(2 * half + 1):  # left to right, as the built-in sums
                pooled += padded[k:k + m - lo]
            pooled /= np.float32(self.kernel)
            f.scores[r, order[lo:m]] = pooled
            top = max(top, pooled.max())
        if top == -np.inf:
            top = np.float32(0)
        window = f.positions[:, :T] >= first
        f.scores[:, :T][window] = top
