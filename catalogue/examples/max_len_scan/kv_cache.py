"""Grouped-query attention with a KV cache that is allocated once.

Shapes: cache k/v [B, Hkv, max_len, d]; q [B, Hq, T, d] with Hq = G * Hkv.
Query head h uses KV head h // G (q is viewed as [B, Hkv, G, T, d]).
"""
import math

import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"KVCache: invalid sizes batch={batch}, kv_heads={kv_heads}, "
                             f"max_len={max_len}, head_dim={head_dim}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        B, H, d = self.batch, self.kv_heads, self.head_dim
        if k_new.ndim != 4 or k_new.shape[0] != B or k_new.shape[1] != H or k_new.shape[3] != d:
            raise ValueError(f"k_new: expected shape (B={B}, Hkv={H}, T, d={d}), got {k_new.shape}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new: expected shape {k_new.shape} (same as k_new), got {v_new.shape}")
        n_new = _n_new(n_new, B, k_new.shape[2])
        after = self.lens + n_new
        too_big = np.flatnonzero(after > self.max_len)
        if too_big.size:
            b = int(too_big[0])
            raise ValueError(f"append: row {b} would hold {after[b]} tokens, max_len is {self.max_len}")
        for b in range(B):
            if n_new[b]:
                self.k[b, :, self.lens[b]:after[b]] = k_new[b, :, :n_new[b]]
                self.v[b, :, self.lens[b]:after[b]] = v_new[b, :, :n_new[b]]
        self.lens[:] = after


def _n_new(n_new, B, T):
    n = np.asarray(n_new)
    if n.shape != (B,):
        raise ValueError(f"n_new: expected shape ({B},), got {n.shape}")
    if B and n.dtype.kind not in "iu":
        raise TypeError(f"n_new: expected an integer array, got dtype {n.dtype}")
    n = n.astype(np.int64)
    if np.any(n < 0) or np.any(n > T):
        raise ValueError(f"n_new: values must be in [0, T={T}], got {n.tolist()}")
    return n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: expected shape (B, Hq, T, d), got {q.shape}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: shape {q.shape} does not match the cache (batch={cache.batch}, head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q: Hq={Hq} must be a multiple of Hkv={cache.kv_heads}")
    n_new = _n_new(n_new, B, T)
    if np.any(n_new > cache.lens):
        raise ValueError(f"n_new: {n_new.tolist()} exceeds cache lens {cache.lens.tolist()}")
    if B == 0 or T == 0 or cache.max_len == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv, G, S = cache.kv_heads, Hq // cache.kv_heads, cache.max_len
    qg = q.reshape(B, Hkv, G, T, d)
    scores = qg @ cache.k[:, :, None].swapaxes(-1, -2)       # [B, Hkv, G, T, S]
    scores *= 1.0 / math.sqrt(d)

    # query t of row b is token lens[b] - n_new[b] + t; it sees keys 0..that token
    last_key = cache.lens[:, None] - n_new[:, None] + np.arange(T)[None, :]    # [B, T]
    is_real = np.arange(T)[None, :] < n_new[:, None]
    visible = np.arange(S)[None, None, :] <= last_key[:, :, None]
    visible &= is_real[:, :, None]
    visible = visible[:, None, None]                          # broadcast over heads

    scores[~np.broadcast_to(visible, scores.shape)] = -np.inf
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max[~np.isfinite(row_max)] = 0
    weights = np.exp(scores - row_max)
    norm = weights.sum(axis=-1, keepdims=True)
    norm[norm == 0] = 1
    out = (weights / norm) @ cache.v[:, :, None]             # [B, Hkv, G, T, d]
    return out.reshape(B, Hq, T, d).astype(q.dtype)
