"""KV cache + grouped-query attention, with K/V repeated by broadcast-then-reshape (NumPy).

Which public design this imitates
---------------------------------
The ``repeat_kv`` helper found in many Hugging Face model files (Llama, Mistral,
Qwen and others): K/V of shape ``[B, Hkv, S, d]`` get a new group axis, are
expanded to ``[B, Hkv, G, S, d]`` and reshaped to ``[B, Hq, S, d]`` so that the
ordinary multi-head attention code can run unchanged.

What this file does
-------------------
* ``KVCache`` is allocated once (``[B, Hkv, max_len, d]``) and written in place
  at each row's length; an overflow is checked for every row before any write.
* ``gqa_attention`` takes the live keys ``0 .. lens.max()``, turns K and V into
  one head per query head with ``np.broadcast_to`` + ``reshape`` (head ``h``
  gets KV head ``h // G``), and runs plain per-head attention with the
  bottom-right causal mask, a key-length mask per row, and exact zeros for
  padded query slots.

The cost of the idiom: the expanded view has a zero stride on the group axis,
and merging that axis with the head axis cannot be expressed as a view once
``Hkv >= 2`` and ``G >= 2``, so ``reshape`` copies: K and V are materialised G
times (only ``Hkv == 1`` or ``G == 1`` stays free).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _as_counts(n_new, batch, width):
    arr = np.asarray(n_new)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"n_new must hold integers, got {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {arr.shape}")
    if np.any(arr < 0) or np.any(arr > width):
        raise ValueError(f"n_new must be between 0 and T = {width}, got {arr.tolist()}")
    return arr


def repeat_kv(x: np.ndarray, n_rep: int) -> np.ndarray:
    """[B, Hkv, S, d] -> [B, Hkv * n_rep, S, d]: expand a group axis, then fold it into the heads."""
    B, Hkv, S, d = x.shape
    if n_rep == 1:
        return x
    expanded = np.broadcast_to(x[:, :, None, :, :], (B, Hkv, n_rep, S, d))
    return expanded.reshape(B, Hkv * n_rep, S, d)


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
        self.v = np.zeros_like(self.k)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        expect = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != expect:
                raise ValueError(f"{name}: expected [B={expect[0]}, Hkv={expect[1]}, T, d={expect[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} differ in shape")
        n = _as_counts(n_new, self.batch, k_new.shape[2])
        end = self.lens + n
        over = np.flatnonzero(end > self.max_len)
        if over.size:
            b = int(over[0])
            raise ValueError(f"row {b} would hold {end[b]} tokens, past max_len={self.max_len} (nothing written)")
        for b in range(self.batch):
            start, count = int(self.lens[b]), int(n[b])
            if count:
                self.k[b, :, start:start + count] = k_new[b, :, :count]
                self.v[b, :, start:start + count] = v_new[b, :, :count]
        self.lens += n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: expected [B, Hq, T, d], got {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q must be floating point, got {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: shape {q.shape} does not match the cache (batch={cache.batch}, head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q: Hq={Hq} is not a multiple of Hkv={cache.kv_heads}")
    n = _as_counts(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} exceeds the tokens held, lens {cache.lens.tolist()}")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    G = Hq // cache.kv_heads
    k = repeat_kv(cache.k[:, :, :S], G)             # [B, Hq, S, d]
    v = repeat_kv(cache.v[:, :, :S], G)
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(d)   # [B, Hq, T, S]

    key = np.arange(S)[None, None, :]
    query_pos = (cache.lens - n)[:, None] + np.arange(T)[None, :]          # [B, T]
    allowed = (key <= query_pos[:, :, None]) & (key < cache.lens[:, None, None])
    allowed &= (np.arange(T)[None, :] < n[:, None])[:, :, None]           # padded slots see nothing
    allowed = allowed[:, None]                                             # [B, 1, T, S]

    scores = np.where(allowed, scores, -np.inf)
    best = scores.max(axis=-1, keepdims=True)
    best[~np.isfinite(best)] = 0.0
    with np.errstate(under="ignore"):
        p = np.exp(scores - best)
    total = p.sum(axis=-1, keepdims=True)
    total[total == 0] = 1.0
    out = (p / total) @ v
    return out.astype(q.dtype, copy=False)
