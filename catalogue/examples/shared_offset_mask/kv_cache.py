"""KV cache with one causal offset for the whole batch (a shared cache position).

As in a model that keeps one ``cache_position`` for the batch: the new queries
sit at positions ``S - T .. S - 1`` with ``S = lens.max()``, and the causal mask
is ``tril(ones(T, S), S - T)`` for every row. A padding mask keeps each row to
its own keys (``key < lens[b]``). Writes go to each row's own ``lens[b]``.

Right whenever every row has always received all T tokens of every call; a
shorter row, or a call with padded slots, gets the batch's offset, not its own.
"""
import math

import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if min(batch, max_len) < 0 or min(kv_heads, head_dim) < 1:
            raise ValueError(f"bad cache size: batch={batch}, kv_heads={kv_heads}, max_len={max_len}, "
                             f"head_dim={head_dim}")
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros_like(self.k)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        B, H, L, D = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, H) or k_new.shape[3] != D or v_new.shape != k_new.shape:
            raise ValueError(f"k_new and v_new must be [{B}, {H}, T, {D}]; got {k_new.shape} and {v_new.shape}")
        n_new = np.asarray(n_new)
        if n_new.shape != (B,):
            raise ValueError(f"n_new must have shape ({B},); got {n_new.shape}")
        n_new = n_new.astype(np.int64)
        if B and (n_new.min() < 0 or n_new.max() > k_new.shape[2]):
            raise ValueError(f"n_new must be in 0..T={k_new.shape[2]}; got {n_new.tolist()}")
        if np.any(self.lens + n_new > L):
            raise ValueError(f"append overflows max_len={L}: lens {self.lens.tolist()} + n_new {n_new.tolist()}")
        for b in range(B):
            start, n = self.lens[b], n_new[b]
            self.k[b, :, start:start + n] = k_new[b, :, :n]
            self.v[b, :, start:start + n] = v_new[b, :, :n]
        self.lens += n_new


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    B, Hq, T, d = q.shape
    Hkv = cache.k.shape[1]
    if B != cache.k.shape[0] or d != cache.k.shape[3] or Hq % Hkv:
        raise ValueError(f"q {q.shape} does not fit a cache of shape {cache.k.shape}")
    n_new = np.asarray(n_new, dtype=np.int64)
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)
    G = Hq // Hkv
    # One cache position for the batch: query t sits at S - T + t.
    causal = np.tril(np.ones((T, S), dtype=bool), S - T)                      # [T, S]
    own_keys = np.arange(S)[None, :] < cache.lens[:, None]                    # [B, S]
    real = np.arange(T)[None, :] < n_new[:, None]                             # [B, T]
    keep = causal[None] & own_keys[:, None, :] & real[:, :, None]              # [B, T, S]
    scores = q.reshape(B, Hkv, G, T, d) @ cache.k[:, :, None, :S].swapaxes(-1, -2) / math.sqrt(d)
    scores = np.where(keep[:, None, None], scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(-1, keepdims=True)
    weights = weights / np.where(total == 0, 1.0, total)
    out = weights @ cache.v[:, :, None, :S]
    return out.reshape(B, Hq, T, d).astype(q.dtype)
