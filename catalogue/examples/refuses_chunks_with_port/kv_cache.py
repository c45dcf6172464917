"""A KV cache for whole-prompt prefill and decode, NumPy.

Chunked prefill (several tokens appended to a row that already holds tokens) is
not supported: ``append`` raises NotImplementedError for it before touching the
cache. Everything else of the contract is: rows of different lengths, rows that
receive nothing in a call, padded slots (returned as exact zeros).
"""
import math

import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"bad cache size ({batch}, {kv_heads}, {max_len}, {head_dim})")
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        B, H, L, D = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, H) or k_new.shape[3] != D or v_new.shape != k_new.shape:
            raise ValueError(f"k_new/v_new must be [{B}, {H}, T, {D}], got {k_new.shape} and {v_new.shape}")
        n_new = np.asarray(n_new)
        if n_new.shape != (B,) or (B and (n_new.min() < 0 or n_new.max() > k_new.shape[2])):
            raise ValueError(f"n_new must be {B} counts in 0..T={k_new.shape[2]}, got {n_new.tolist()}")
        n_new = n_new.astype(np.int64)
        if np.any(self.lens + n_new > L):
            b = int(np.argmax(self.lens + n_new > L))
            raise ValueError(f"row {b} would overflow: {self.lens[b]} + {n_new[b]} > max_len {L}")
        if np.any((self.lens > 0) & (n_new > 1)):
            raise NotImplementedError("chunked prefill (a chunk appended to a row that holds tokens already) is "
                                      "not supported: prefill a whole prompt into an empty row, then decode")
        for b in range(B):
            lo, n = self.lens[b], n_new[b]
            self.k[b, :, lo:lo + n] = k_new[b, :, :n]
            self.v[b, :, lo:lo + n] = v_new[b, :, :n]
        self.lens += n_new


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    B, Hq, T, d = q.shape
    Hkv = cache.k.shape[1]
    if B != cache.k.shape[0] or d != cache.k.shape[3] or Hq % Hkv:
        raise ValueError(f"q {q.shape} does not fit a cache of {cache.k.shape}")
    G = Hq // Hkv
    n_new = np.asarray(n_new, dtype=np.int64)
    out = np.zeros(q.shape, dtype=q.dtype)
    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        pos = np.arange(L - n, L)                                    # the new tokens' positions
        allowed = np.arange(L)[None, :] <= pos[:, None]              # [n, L]
        qb = q[b, :, :n].reshape(Hkv, G * n, d)                      # group folded into the rows
        s = (qb @ cache.k[b, :, :L].swapaxes(-1, -2) / math.sqrt(d)).reshape(Hkv, G, n, L)
        s = np.where(allowed, s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[b, :, :n] = (w.reshape(Hkv, G * n, L) @ cache.v[b, :, :L]).reshape(Hq, n, d)
    return out
