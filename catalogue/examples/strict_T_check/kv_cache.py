"""KV cache that writes whole fixed-width chunks, and refuses a chunk wider than the room left (NumPy).

Which public design this imitates
---------------------------------
Decoding caches in JAX/Flax-style code (MaxText, Flax's ``decode`` caches) copy
the whole incoming chunk of ``T`` slots into the cache at the row's index with
``lax.dynamic_update_slice``, padding included, and advance the index by the
real tokens only.  XLA clamps a start index whose slice would run off the end,
which silently shifts the write; a careful port checks instead, up front.

What this file does
-------------------
* ``k``/``v``: ``[B, Hkv, max_len, d]``, allocated once.  ``append`` copies all
  ``T`` slots of row ``b`` into ``k[b, :, lens[b] : lens[b] + T]`` (the padded
  slots land past the row's length, which is not state) and then advances
  ``lens[b]`` by ``n_new[b]``.
* Checks run before any write: a row that would pass ``max_len`` with its real
  tokens raises ``ValueError`` (an overflow); a chunk whose ``T`` is wider than
  the room left in some row also raises ``ValueError``, saying which row and
  how wide a chunk fits.  Either way nothing is written.
* ``gqa_attention``: live keys only (``0 .. lens.max()``), grouped query heads
  ``[B, Hkv, G, T, d]`` against a broadcast view of the cache (head ``h`` reads
  KV head ``h // G``), bottom-right causal mask per row, exact zeros in padded
  query slots, no NaN.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _counts(n_new, batch, width):
    n = np.asarray(n_new)
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"n_new must be integer counts, got dtype {n.dtype}")
    n = n.astype(np.int64, copy=False)
    if n.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {n.shape}")
    bad = np.flatnonzero((n < 0) | (n > width))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"n_new[{b}] = {n[b]} is outside 0 .. T = {width}")
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
        T = k_new.shape[2]
        n = _counts(n_new, self.batch, T)

        room = self.max_len - self.lens
        over = np.flatnonzero(n > room)
        if over.size:
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: it holds {self.lens[b]} of max_len={self.max_len} "
                             f"and n_new[{b}] = {n[b]} more were given (nothing was written)")
        narrow = np.flatnonzero(T > room)
        if narrow.size:
            b = int(narrow[0])
            raise ValueError(f"k_new has T = {T} slots (shape {k_new.shape}) but row {b} has room for only "
                             f"{room[b]} of max_len={self.max_len}; this cache writes whole chunks, padding "
                             f"included: pass at most {int(room.min())} slots (nothing was written)")

        for b in range(self.batch):
            start = int(self.lens[b])
            self.k[b, :, start:start + T] = k_new[b]
            self.v[b, :, start:start + T] = v_new[b]
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
    n = _counts(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} is more than the rows hold ({cache.lens.tolist()})")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    grouped = q.reshape(B, Hkv, G, T, d)
    scores = grouped @ cache.k[:, :, None, :S].swapaxes(-1, -2)
    scores *= 1.0 / math.sqrt(d)                                  # [B, Hkv, G, T, S]

    t = np.arange(T)
    key = np.arange(S)
    pos = (cache.lens - n)[:, None] + t                           # [B, T]
    mask = (key <= pos[:, :, None]) & (key < cache.lens[:, None, None]) & (t < n[:, None])[:, :, None]
    mask = mask[:, None, None]                                    # [B, 1, 1, T, S]

    scores = np.where(mask, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(under="ignore"):
        w = np.exp(scores - peak)
    norm = w.sum(axis=-1, keepdims=True)
    w /= np.where(norm > 0, norm, 1.0)
    out = w @ cache.v[:, :, None, :S]
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
