# Hostile submission: exits_in_append.
#
# append raises SystemExit and attention raises KeyboardInterrupt: the harness must
# survive both. Expected: Weak, the steps report those exceptions.
# Honest tier of the same code without the act: Hire.
import numpy as np


class KVCache:
    """Preallocated cache: row b's tokens live at k[b, :, :lens[b]]."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if min(batch, kv_heads, max_len, head_dim) < 0 or kv_heads == 0 or head_dim == 0:
            raise ValueError(f"bad cache size {(batch, kv_heads, max_len, head_dim)}")
        self.max_len = max_len
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        raise SystemExit(4)
        B, H, _, d = self.k.shape
        k_new, v_new, n_new = np.asarray(k_new), np.asarray(v_new), np.asarray(n_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, H) or k_new.shape[3] != d or v_new.shape != k_new.shape:
            raise ValueError(f"k_new/v_new should be [{B}, {H}, T, {d}], got {k_new.shape}, {v_new.shape}")
        if n_new.shape != (B,) or (B and (n_new.min() < 0 or n_new.max() > k_new.shape[2])):
            raise ValueError(f"n_new should be {B} counts in [0, T], got {n_new.tolist()}")
        if B and np.any(self.lens + n_new > self.max_len):
            raise ValueError("append overflows max_len")
        for b in range(B):
            start, n = int(self.lens[b]), int(n_new[b])
            self.k[b, :, start:start + n] = k_new[b, :, :n]
            self.v[b, :, start:start + n] = v_new[b, :, :n]
            self.lens[b] = start + n


def gqa_attention(q, cache, n_new):
    raise KeyboardInterrupt
    q, n_new = np.asarray(q), np.asarray(n_new)
    B, Hq, T, d = q.shape
    Hkv = cache.k.shape[1]
    if Hq % Hkv or d != cache.k.shape[3] or B != cache.k.shape[0]:
        raise ValueError(f"q {q.shape} does not fit the cache {cache.k.shape}")
    if n_new.shape != (B,) or (B and (n_new.min() < 0 or n_new.max() > T)):
        raise ValueError(f"n_new should be {B} counts in [0, {T}], got {n_new.tolist()}")
    G = Hq // Hkv
    out = np.zeros(q.shape, dtype=q.dtype)
    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        visible = np.arange(L)[None, :] <= np.arange(L - n, L)[:, None]
        for h in range(Hkv):
            s = q[b, h * G:(h + 1) * G, :n] @ cache.k[b, h, :L].T / np.sqrt(d)
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            out[b, h * G:(h + 1) * G, :n] = (p / p.sum(axis=-1, keepdims=True)) @ cache.v[b, h, :L]
    return out
