"""KV cache + grouped-query attention (NumPy), with a PyTorch port in kv_cache_torch.py.

Which public design this imitates
---------------------------------
The NumPy side is the plain preallocated design of most inference servers: a
cache ``[B, Hkv, max_len, d]`` reserved once, a per-row length, and grouped
query heads read straight from the shared KV heads.  The port
(``kv_cache_torch.py``) adds the Hugging Face ``generate`` habit of carrying a
boolean attention mask that grows with ``torch.cat`` as tokens arrive.

What this file does
-------------------
* ``KVCache.append`` validates, checks every row against ``max_len`` before
  writing anything, then copies each row's ``n_new[b]`` real tokens to
  ``k[b, :, lens[b]:]`` / ``v[b, :, lens[b]:]`` and advances ``lens``.
* ``gqa_attention`` works on the live keys ``0 .. lens.max()``: query heads are
  viewed as ``[B, Hkv, G * T, d]`` (row ``g * T + t`` of KV head ``kv`` is query
  head ``kv * G + g``), so one matmul per KV head serves its whole group and
  head ``h`` reads KV head ``h // G`` with no copy of K/V.  The key-validity
  mask (``key < lens[b]``) and the bottom-right causal mask (query ``t`` at
  ``lens[b] - n_new[b] + t``) are built from ``lens``; padded query slots come
  back as exact zeros, never NaN.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _token_counts(n_new, batch, slots):
    arr = np.asarray(n_new)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"n_new must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > slots):
        raise ValueError(f"n_new must be in 0 .. T = {slots}, got {arr.tolist()}")
    return arr


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
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != want:
                raise ValueError(f"{name} must be [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have the same shape")
        n = _token_counts(n_new, self.batch, k_new.shape[2])
        full = np.flatnonzero(self.lens + n > self.max_len)
        if full.size:
            b = int(full[0])
            raise ValueError(f"append would overflow row {b}: it holds {self.lens[b]} of max_len={self.max_len} "
                             f"and n_new[{b}] = {n[b]} more were given (nothing was written)")
        for b in range(self.batch):
            c = int(n[b])
            if c:
                at = int(self.lens[b])
                self.k[b, :, at:at + c] = k_new[b, :, :c]
                self.v[b, :, at:at + c] = v_new[b, :, :c]
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
        raise ValueError(f"q has Hq={Hq} heads, not a multiple of Hkv={cache.kv_heads}")
    n = _token_counts(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} exceeds the tokens held ({cache.lens.tolist()})")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    rows = q.reshape(B, Hkv, G * T, d)
    k = cache.k[:, :, :S]                                   # views of the live prefix
    v = cache.v[:, :, :S]
    scores = (rows @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(d))
    scores = scores.reshape(B, Hkv, G, T, S)

    t = np.arange(T)
    key = np.arange(S)
    pos = (cache.lens - n)[:, None] + t                     # [B, T]
    valid = key[None, :] < cache.lens[:, None]              # [B, S]
    visible = (key <= pos[:, :, None]) & valid[:, None, :] & (t < n[:, None])[:, :, None]
    visible = visible[:, None, None]                        # [B, 1, 1, T, S]

    scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(under="ignore"):
        w = np.exp(scores - peak)
    norm = w.sum(axis=-1, keepdims=True)
    w /= np.where(norm > 0, norm, 1.0)
    out = w.reshape(B, Hkv, G * T, S) @ v
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
