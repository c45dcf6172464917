"""NumPy KV cache with grouped-query attention.

Each row is handled on its own (rows have different lengths).  Inside a row,
the G query heads of a group are stacked as extra rows of the query matrix
([Hkv, G*n, d]) so one matmul per KV head covers the whole group, with no
copy of K or V.
"""
import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"KVCache: need batch, max_len >= 0 and kv_heads, head_dim >= 1; "
                             f"got {batch}, {kv_heads}, {max_len}, {head_dim}")
        self.max_len = int(max_len)
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.lens = np.zeros(batch, np.int64)

    def append(self, k_new, v_new, n_new):
        B, Hkv, _, d = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        for label, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or x.shape[:2] != (B, Hkv) or x.shape[3] != d:
                raise ValueError(f"{label} has shape {x.shape}; want ({B}, {Hkv}, T, {d})")
        if k_new.shape[2] != v_new.shape[2]:
            raise ValueError(f"k_new has T={k_new.shape[2]} but v_new has T={v_new.shape[2]}")
        n = _counts(n_new, B, k_new.shape[2])
        full = np.flatnonzero(self.lens + n > self.max_len)
        if full.size:
            r = full[0]
            raise ValueError(f"no room in row {r}: lens={self.lens[r]}, n_new={n[r]}, max_len={self.max_len}")
        for r in range(B):
            a, z = self.lens[r], self.lens[r] + n[r]
            self.k[r, :, a:z] = k_new[r, :, :n[r]]
            self.v[r, :, a:z] = v_new[r, :, :n[r]]
        self.lens += n


def _counts(n_new, B, T):
    n = np.asarray(n_new)
    if n.shape != (B,):
        raise ValueError(f"n_new has shape {n.shape}; want ({B},)")
    if B and n.dtype.kind not in "iu":
        raise TypeError(f"n_new has dtype {n.dtype}; want integers")
    n = n.astype(np.int64)
    if (n < 0).any() or (n > T).any():
        raise ValueError(f"n_new = {n.tolist()}; each must be in [0, {T}]")
    return n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q has shape {q.shape}; want (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    _, Hkv, _, dc = cache.k.shape
    if B != cache.k.shape[0] or d != dc:
        raise ValueError(f"q has shape {q.shape}; cache k is {cache.k.shape}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads; not a multiple of the {Hkv} KV heads")
    n = _counts(n_new, B, T)
    if (n > cache.lens).any():
        raise ValueError(f"n_new = {n.tolist()} but lens = {cache.lens.tolist()}")
    G = Hq // Hkv
    out = np.zeros(q.shape, q.dtype)
    for r in range(B):
        m, L = int(n[r]), int(cache.lens[r])
        if m == 0:
            continue
        K, V = cache.k[r, :, :L], cache.v[r, :, :L]              # [Hkv, L, d]
        Q = q[r, :, :m].reshape(Hkv, G * m, d)                    # row g*m + t of group kv
        s = Q @ K.transpose(0, 2, 1) / np.sqrt(d)                 # [Hkv, G*m, L]
        s = s.reshape(Hkv, G, m, L)
        first = L - m                                             # position of query 0
        future = np.arange(L)[None, :] > (first + np.arange(m))[:, None]
        s[:, :, future] = -np.inf                                 # key 0 is never future
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[r, :, :m] = (s.reshape(Hkv, G * m, L) @ V).reshape(Hq, m, d)
    return out
