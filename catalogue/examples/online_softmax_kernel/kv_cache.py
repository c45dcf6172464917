"""KV cache + grouped-query attention with a block-wise online softmax (NumPy).

Which public design this imitates
---------------------------------
The forward pass of FlashAttention (and of flash-decoding kernels): keys and
values are visited in fixed blocks, and each query keeps a running maximum
``m``, a running normaliser ``l`` and an unnormalised output ``acc``.  When a
block raises the maximum, the old ``l`` and ``acc`` are rescaled by
``exp(m_old - m_new)``; the output is ``acc / l`` at the end.  The full score
row is never held at once.

What this file does
-------------------
* ``KVCache``: ``k``/``v`` ``[B, Hkv, max_len, d]`` allocated once, written in
  place at ``lens[b]``; every row is checked against ``max_len`` before any
  write.
* ``gqa_attention``: query heads grouped as ``[B, Hkv, G, T, d]`` (head ``h``
  reads KV head ``h // G`` through a broadcast view of each key block, no
  copy); key blocks of ``BLOCK = 16`` keys over the live length ``lens.max()``
  only; the bottom-right causal mask per row (query ``t`` at
  ``lens[b] - n_new[b] + t``); blocks no query can see are skipped.  The
  running statistics are kept in float64.  A query that sees no key (a padded
  slot, a zero-token row) ends with ``l = 0`` and ``acc = 0`` and returns exact
  zeros, never NaN.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention", "BLOCK"]

BLOCK = 16  # keys per block


def _n_new(n_new, batch, slots):
    n = np.asarray(n_new)
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"n_new must hold integers, got dtype {n.dtype}")
    n = n.astype(np.int64, copy=False)
    if n.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {n.shape}")
    if n.size and (n.min() < 0 or n.max() > slots):
        raise ValueError(f"n_new must lie in 0 .. T = {slots}, got {n.tolist()}")
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
        shape = (self.batch, self.kv_heads, self.max_len, self.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != want:
                raise ValueError(f"{name} must be [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have the same shape")
        n = _n_new(n_new, self.batch, k_new.shape[2])
        end = self.lens + n
        if np.any(end > self.max_len):
            b = int(np.flatnonzero(end > self.max_len)[0])
            raise ValueError(f"append would overflow row {b}: {self.lens[b]} held + {n[b]} new > "
                             f"max_len={self.max_len} (nothing was written)")
        for b in np.flatnonzero(n):
            lo = int(self.lens[b])
            self.k[b, :, lo:lo + n[b]] = k_new[b, :, :n[b]]
            self.v[b, :, lo:lo + n[b]] = v_new[b, :, :n[b]]
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
    n = _n_new(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} exceeds the tokens held ({cache.lens.tolist()})")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G, T, d)
    scale = 1.0 / math.sqrt(d)

    # Last key each query may see (its own position), or -1 for a padded slot.
    t = np.arange(T)
    last = np.where(t[None, :] < n[:, None], (cache.lens - n)[:, None] + t[None, :], -1)   # [B, T]
    newest = int(last.max())

    m = np.full((B, Hkv, G, T, 1), -np.inf)     # running max of the scores seen
    l = np.zeros((B, Hkv, G, T, 1))             # running sum of exp(score - m)
    acc = np.zeros((B, Hkv, G, T, d))           # running sum of exp(score - m) * v
    for start in range(0, newest + 1, BLOCK):
        stop = min(start + BLOCK, S)
        seen = np.arange(start, stop)[None, None, :] <= last[:, :, None]               # [B, T, blk]
        if not seen.any():
            continue
        kb = cache.k[:, :, None, start:stop]                                            # [B, Hkv, 1, blk, d]
        vb = cache.v[:, :, None, start:stop]
        s = (qg @ kb.swapaxes(-1, -2)) * scale                                          # [B, Hkv, G, T, blk]
        s = np.where(seen[:, None, None], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        base = np.where(m_new > -np.inf, m_new, 0.0)                                    # nothing seen yet: 0
        with np.errstate(under="ignore"):
            p = np.exp(s - base)
            rescale = np.exp(m - base)
        l = l * rescale + p.sum(axis=-1, keepdims=True)
        acc = acc * rescale + p @ vb
        m = m_new

    out = acc / np.where(l > 0, l, 1.0)          # l == 0 only where acc == 0: exact zeros
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
