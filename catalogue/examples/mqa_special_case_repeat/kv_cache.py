"""KV cache + attention that broadcasts for MQA and repeats K/V for GQA (NumPy).

Which public design this imitates
---------------------------------
Code written when multi-query attention (one shared KV head, as in Falcon-7B
or SantaCoder) was the special case: a single KV head is simply broadcast to
every query head, and everything else goes through a generic "repeat each KV
head G times" step (``torch.repeat_interleave`` in many PyTorch GQA ports,
``np.repeat`` here) before ordinary multi-head attention.

What this file does
-------------------
* ``KVCache``: ``k``/``v`` ``[B, Hkv, max_len, d]`` allocated once, each row
  written in place at ``lens[b]``; every row is checked against ``max_len``
  before any write.
* ``gqa_attention``: over the live keys ``0 .. lens.max()`` only.  With
  ``kv_heads == 1`` K and V are broadcast views (free).  With more KV heads they
  are copied to ``Hq`` heads by ``np.repeat(..., G, axis=1)`` (head ``h`` gets
  KV head ``h // G``), i.e. G times the live K/V is written per call.  Then
  bottom-right causal mask per row, key-length mask, softmax that never
  produces NaN, exact zeros in padded query slots.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _counts(n_new, B, T):
    c = np.asarray(n_new)
    if c.size and c.dtype.kind not in "iu":
        raise TypeError(f"n_new: integer counts expected, got dtype {c.dtype}")
    c = c.astype(np.int64, copy=False)
    if c.shape != (B,):
        raise ValueError(f"n_new: expected shape ({B},), got {c.shape}")
    if c.size and (c.min() < 0 or c.max() > T):
        raise ValueError(f"n_new: every count must be in [0, T={T}], got {c.tolist()}")
    return c


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        dims = {"batch": batch, "kv_heads": kv_heads, "max_len": max_len, "head_dim": head_dim}
        for name, value in dims.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name}: int expected, got {type(value).__name__}")
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"cache dims out of range: {dims}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = map(int, (batch, kv_heads, max_len, head_dim))
        self.k = np.zeros((self.batch, self.kv_heads, self.max_len, self.head_dim), dtype=dtype)
        self.v = np.zeros((self.batch, self.kv_heads, self.max_len, self.head_dim), dtype=dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or x.shape[0] != self.batch or x.shape[1] != self.kv_heads or x.shape[3] != self.head_dim:
                raise ValueError(f"{name}: expected [B={self.batch}, Hkv={self.kv_heads}, T, d={self.head_dim}], "
                                 f"got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must match")
        c = _counts(n_new, self.batch, k_new.shape[2])
        room = self.max_len - self.lens
        if np.any(c > room):
            b = int(np.argmax(c > room))
            raise ValueError(f"append overflows row {b}: {self.lens[b]} held + {c[b]} new > max_len={self.max_len}")
        for b in np.flatnonzero(c):
            lo, hi = self.lens[b], self.lens[b] + c[b]
            self.k[b, :, lo:hi] = k_new[b, :, :c[b]]
            self.v[b, :, lo:hi] = v_new[b, :, :c[b]]
        self.lens += c


def _per_query_head(x, G):
    """[B, Hkv, S, d] -> something that indexes as [B, Hq, S, d]."""
    if x.shape[1] == 1:
        return x                                   # MQA: broadcasts against every query head for free
    return np.repeat(x, G, axis=1)                 # GQA: copy each KV head G times


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: expected [B, Hq, T, d], got {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q: floating point expected, got {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: shape {q.shape} vs cache batch={cache.batch}, head_dim={cache.head_dim}")
    if Hq % cache.kv_heads:
        raise ValueError(f"q: Hq={Hq} must be a multiple of Hkv={cache.kv_heads}")
    c = _counts(n_new, B, T)
    if np.any(c > cache.lens):
        raise ValueError(f"n_new {c.tolist()} is more than the cache holds (lens {cache.lens.tolist()})")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    G = Hq // cache.kv_heads
    k = _per_query_head(cache.k[:, :, :S], G)
    v = _per_query_head(cache.v[:, :, :S], G)
    scores = q @ k.swapaxes(-1, -2)
    scores *= 1.0 / math.sqrt(d)                   # [B, Hq, T, S]

    pos = (cache.lens - c)[:, None] + np.arange(T)              # [B, T]
    keys = np.arange(S)
    ok = keys[None, None, :] <= pos[:, :, None]
    ok &= keys[None, None, :] < cache.lens[:, None, None]
    ok &= (np.arange(T)[None, :] < c[:, None])[:, :, None]
    ok = ok[:, None]                                            # [B, 1, T, S]

    scores[~np.broadcast_to(ok, scores.shape)] = -np.inf
    m = scores.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0.0
    with np.errstate(under="ignore"):
        w = np.exp(scores - m)
    z = w.sum(axis=-1, keepdims=True)
    w /= np.where(z == 0, 1.0, z)
    return (w @ v).astype(q.dtype, copy=False)
