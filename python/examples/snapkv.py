"""snapkv in Python: the chunk's last `window` queries vote with their attention, pooled over
`kernel` neighbouring positions (zero padding counted) — the built-in snapkv, in NumPy.

    kvlab.register_policy("snapkv_py", SnapKV)   # then kv_cache.name "snapkv_py-default"
"""
import numpy as np

POLICY_NAME = "snapkv_py"


class SnapKV:
    """snapkv in Python: last-window attention votes, average-pooled over neighbours"""

    needs = ("attention",)

    def __init__(self, window=32, kernel=5):
        self.attention_window = window  # --kv_cache.snapkv_window of the built-in
        self.kernel = kernel            # --kv_cache.snapkv_kernel

    def score(self, f):
        return np.zeros((f.rows, f.n), np.float32)  # new tokens start at 0 until they are voted on

    def update(self, f):
        T, half = f.length, self.kernel // 2
        order = np.argsort(f.positions[:, :T], axis=1, kind="stable")  # neighbours in the sequence
        votes = np.take_along_axis(f.weights, order, axis=1)
        padded = np.zeros((f.rows, T + 2 * half), np.float32)
        padded[:, half:half + T] = votes
        pooled = np.zeros((f.rows, T), np.float32)
        for k in range(2 * half + 1):  # left to right, as the built-in sums
            pooled += padded[:, k:k + T]
        pooled /= np.float32(self.kernel)
        np.put_along_axis(f.scores[:, :T], order, pooled, axis=1)
