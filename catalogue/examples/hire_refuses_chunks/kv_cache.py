"""KV cache for decode and whole-prompt prefill.

I did not get to chunked prefill (a chunk of several tokens appended after
tokens already cached): append refuses it with a clear error rather than
computing something I have not checked.
"""
import math

import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or kv_heads < 1 or max_len < 0 or head_dim < 1:
            raise ValueError(f"invalid cache size ({batch}, {kv_heads}, {max_len}, {head_dim})")
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.lens = np.zeros(batch, np.int64)

    def append(self, k_new, v_new, n_new):
        B, H, L, D = self.k.shape
        if k_new.shape[:2] != (B, H) or k_new.shape[3] != D or v_new.shape != k_new.shape:
            raise ValueError(f"k_new/v_new must be [{B}, {H}, T, {D}], got {k_new.shape} and {v_new.shape}")
        n_new = np.asarray(n_new)
        if n_new.shape != (B,) or (B and (n_new.min() < 0 or n_new.max() > k_new.shape[2])):
            raise ValueError(f"n_new must be [{B}] ints in 0..T={k_new.shape[2]}, got {n_new}")
        n_new = n_new.astype(np.int64)
        if np.any((n_new > 1) & (self.lens > 0)):
            raise ValueError("chunked prefill (1 < T < S) is not supported: append a whole prompt "
                             "to an empty row, or one token at a time")
        if np.any(self.lens + n_new > L):
            b = int(np.argmax(self.lens + n_new > L))
            raise ValueError(f"row {b} would overflow: {self.lens[b]} + {n_new[b]} > max_len {L}")
        for b in range(B):
            n = n_new[b]
            self.k[b, :, self.lens[b]:self.lens[b] + n] = k_new[b, :, :n]
            self.v[b, :, self.lens[b]:self.lens[b] + n] = v_new[b, :, :n]
        self.lens += n_new


def gqa_attention(q, cache, n_new):
    B, Hq, T, D = q.shape
    Hkv = cache.k.shape[1]
    if B != cache.k.shape[0] or D != cache.k.shape[3] or Hq % Hkv:
        raise ValueError(f"q {q.shape} does not fit a cache of {cache.k.shape}")
    G = Hq // Hkv
    n_new = np.asarray(n_new, dtype=np.int64)
    out = np.zeros_like(q)
    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        # Either decode (n == 1) or a whole prompt (n == L): the last n positions.
        pos = np.arange(L - n, L)
        allowed = np.arange(L)[None, :] <= pos[:, None]
        for h in range(Hq):
            j = h // G
            scores = q[b, h, :n] @ cache.k[b, j, :L].T / math.sqrt(D)
            scores = np.where(allowed, scores, -np.inf)
            w = np.exp(scores - scores.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            out[b, h, :n] = w @ cache.v[b, j, :L]
    return out
