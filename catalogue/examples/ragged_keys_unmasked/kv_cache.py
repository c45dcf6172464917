"""KVCache + gqa_attention, NumPy version.

Attention is batched over the whole batch: keys 0..S-1 with S = lens.max(),
query heads grouped as [B, Hkv, G, T, d] so each group shares one KV head.
"""
import math

import numpy as np


def _check_counts(n_new, batch, T):
    n_new = np.asarray(n_new)
    if n_new.shape != (batch,):
        raise ValueError(f"n_new has shape {n_new.shape}; expected ({batch},)")
    if batch and n_new.dtype.kind not in "iu":
        raise TypeError(f"n_new has dtype {n_new.dtype}; expected integers")
    n_new = n_new.astype(np.int64)
    if np.any(n_new < 0) or np.any(n_new > T):
        raise ValueError(f"n_new={n_new.tolist()} must be between 0 and T={T}")
    return n_new


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError("need batch >= 0, max_len >= 0, kv_heads >= 1, head_dim >= 1")
        self.batch, self.kv_heads = batch, kv_heads
        self.max_len, self.head_dim = max_len, head_dim
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or (k_new.shape[0], k_new.shape[1], k_new.shape[3]) != (self.batch, self.kv_heads, self.head_dim):
            raise ValueError(f"k_new has shape {k_new.shape}; expected ({self.batch}, {self.kv_heads}, T, {self.head_dim})")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new has shape {v_new.shape}; expected {k_new.shape}")
        n_new = _check_counts(n_new, self.batch, k_new.shape[2])
        over = self.lens + n_new > self.max_len
        if over.any():
            b = int(np.argmax(over))
            raise ValueError(f"append overflows row {b}: {self.lens[b]} + {n_new[b]} > max_len={self.max_len}")
        for b in range(self.batch):
            lo, n = self.lens[b], n_new[b]
            self.k[b, :, lo:lo + n] = k_new[b, :, :n]
            self.v[b, :, lo:lo + n] = v_new[b, :, :n]
        self.lens += n_new


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q has shape {q.shape}; expected (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q has shape {q.shape}; cache has batch={cache.batch}, head_dim={cache.head_dim}")
    if Hq % cache.kv_heads:
        raise ValueError(f"q has {Hq} heads; must be a multiple of kv_heads={cache.kv_heads}")
    n_new = _check_counts(n_new, B, T)
    if np.any(n_new > cache.lens):
        raise ValueError(f"n_new={n_new.tolist()} is more than lens={cache.lens.tolist()}")
    Hkv = cache.kv_heads
    G = Hq // Hkv
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    K = cache.k[:, :, None, :S]                 # [B, Hkv, 1, S, d]
    V = cache.v[:, :, None, :S]
    logits = q.reshape(B, Hkv, G, T, d) @ K.swapaxes(-1, -2) / math.sqrt(d)

    # The new tokens are the last n_new[b] tokens before column S, so query t
    # of row b is at column S - n_new[b] + t and sees columns up to there.
    col = S - n_new[:, None] + np.arange(T)[None, :]                 # [B, T]
    causal = np.arange(S)[None, None, :] <= col[:, :, None]          # [B, T, S]
    real = (np.arange(T)[None, :] < n_new[:, None])[:, :, None]      # [B, T, 1]
    keep = (causal & real)[:, None, None]                            # [B, 1, 1, T, S]

    logits = np.where(keep, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    top = np.where(np.isneginf(top), 0.0, top)
    p = np.exp(logits - top)
    z = p.sum(-1, keepdims=True)
    p = p / np.where(z == 0, 1.0, z)
    return (p @ V).reshape(B, Hq, T, d).astype(q.dtype)
