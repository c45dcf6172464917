"""KV cache with a causal-mask table of max_len x max_len entries, made with the cache (NumPy).

Which public design this imitates
---------------------------------
gpt-fast sets up, next to each layer's K/V buffers, one boolean lower-triangular
table of ``max_seq_length x max_seq_length`` entries when the caches are made,
and each step picks the rows of its query positions from it as the attention
mask over the whole reservation.

What this file does
-------------------
* ``KVCache``: ``k``/``v`` ``[B, Hkv, max_len, d]`` allocated once and written
  in place at ``lens[b]``; ``causal`` is the ``[max_len, max_len]`` bool table
  (``causal[p, s]``: position ``p`` may see key ``s``), made in ``__init__``.
* ``gqa_attention``: query ``t`` of row ``b`` sits at ``lens[b] - n_new[b] + t``;
  its mask is that row of the table, and-ed with ``s < lens[b]``; scores span
  every ``max_len`` key. Head ``h`` reads KV head ``h // G`` through a broadcast
  view. Padded slots are exact zeros.

Outputs are right everywhere. The table costs ``max_len^2`` bytes whatever the
heads (64 MiB at 8,192 tokens, 16 GiB at 131,072), and each call reads the whole
reservation: the grader reports ``max_len_scan``.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _count_array(n_new, batch, slots):
    n = np.asarray(n_new)
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"n_new must hold integers, got dtype {n.dtype}")
    n = n.astype(np.int64, copy=False)
    if n.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {n.shape}")
    if n.size and (n.min() < 0 or n.max() > slots):
        raise ValueError(f"n_new must be within 0 .. T = {slots}, got {n.tolist()}")
    return n


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("max_len", max_len), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"invalid cache dims batch={batch}, kv_heads={kv_heads}, "
                             f"max_len={max_len}, head_dim={head_dim}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = int(batch), int(kv_heads), int(max_len), int(head_dim)
        self.k = np.zeros((self.batch, self.kv_heads, self.max_len, self.head_dim), dtype=dtype)
        self.v = np.zeros((self.batch, self.kv_heads, self.max_len, self.head_dim), dtype=dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)
        # Made once, with the cache: a step only picks the rows of its positions.
        self.causal = np.tril(np.ones((self.max_len, self.max_len), dtype=bool))

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != want:
                raise ValueError(f"{name} must be [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have the same shape")
        n = _count_array(n_new, self.batch, k_new.shape[2])
        after = self.lens + n
        if np.any(after > self.max_len):
            b = int(np.flatnonzero(after > self.max_len)[0])
            raise ValueError(f"row {b} would reach {after[b]} tokens, past max_len={self.max_len} (nothing written)")
        for b in np.flatnonzero(n):
            s0 = int(self.lens[b])
            self.k[b, :, s0:s0 + n[b]] = k_new[b, :, :n[b]]
            self.v[b, :, s0:s0 + n[b]] = v_new[b, :, :n[b]]
        self.lens += n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Hq, T, d], got {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q must be floating point, got {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q {q.shape} does not match the cache (batch={cache.batch}, head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q has Hq={Hq}, not a multiple of Hkv={cache.kv_heads}")
    n = _count_array(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} exceeds what the rows hold ({cache.lens.tolist()})")
    L = cache.max_len                                   # the whole reservation, every call
    if B == 0 or T == 0 or L == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G, T, d)
    scores = qg @ cache.k[:, :, None].swapaxes(-1, -2)  # [B, Hkv, G, T, max_len]
    scores *= 1.0 / math.sqrt(d)

    t = np.arange(T)
    pos = (cache.lens - n)[:, None] + t                 # [B, T]
    rows = cache.causal[np.clip(pos, 0, L - 1)]         # [B, T, max_len]: the table's rows for these positions
    keep = rows & (np.arange(L) < cache.lens[:, None, None]) & (t < n[:, None])[:, :, None]
    keep = keep[:, None, None]

    scores = np.where(keep, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore"):
        p = np.exp(scores - top)
    total = p.sum(axis=-1, keepdims=True)
    p /= np.where(total > 0, total, 1.0)
    out = p @ cache.v[:, :, None]
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
