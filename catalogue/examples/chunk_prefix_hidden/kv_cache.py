"""GQA over a preallocated KV cache, NumPy.

Prefill is self-attention over the prompt: a call with several tokens attends
over the tokens it brings (causal inside the chunk). Decode (one token) attends
over the whole row, every cached token included.
"""
import math

import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"invalid cache dims: {(batch, kv_heads, max_len, head_dim)}")
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        B, Hkv, max_len, d = self.k.shape
        if k_new.shape != v_new.shape or k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new/v_new: expected [{B}, {Hkv}, T, {d}], got {k_new.shape}, {v_new.shape}")
        n_new = np.asarray(n_new)
        if n_new.shape != (B,) or np.any(n_new < 0) or np.any(n_new > k_new.shape[2]):
            raise ValueError(f"n_new: expected {B} counts in 0..{k_new.shape[2]}, got {n_new}")
        n_new = n_new.astype(np.int64)
        end = self.lens + n_new
        if np.any(end > max_len):
            raise ValueError(f"overflow: lens {self.lens.tolist()} + n_new {n_new.tolist()} > max_len {max_len}")
        for b in range(B):
            self.k[b, :, self.lens[b]:end[b]] = k_new[b, :, :n_new[b]]
            self.v[b, :, self.lens[b]:end[b]] = v_new[b, :, :n_new[b]]
        self.lens[:] = end


def _attend(q, k, v, causal):
    """q [G, n, d], k/v [L, d]: softmax(q k^T / sqrt(d)) v, causal over the last n keys if asked."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def gqa_attention(q, cache, n_new):
    B, Hq, T, d = q.shape
    Hkv = cache.k.shape[1]
    if Hq % Hkv or B != cache.k.shape[0] or d != cache.k.shape[3]:
        raise ValueError(f"q {q.shape} does not fit cache {cache.k.shape}")
    G = Hq // Hkv
    n_new = np.asarray(n_new, dtype=np.int64)
    out = np.zeros(q.shape, dtype=q.dtype)
    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        for j in range(Hkv):
            heads = slice(j * G, (j + 1) * G)
            if T == 1:  # decode: the new token sees the whole row
                out[b, heads, :1] = _attend(q[b, heads, :1], cache.k[b, j, :L], cache.v[b, j, :L], False)
            else:       # prefill: self-attention over this call's tokens
                out[b, heads, :n] = _attend(q[b, heads, :n], cache.k[b, j, L - n:L], cache.v[b, j, L - n:L], True)
    return out
