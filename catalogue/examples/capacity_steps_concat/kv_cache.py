"""KV cache that grows its capacity in 256-token steps by concatenation (NumPy).

Which public design this imitates
---------------------------------
The step-growing cache of mlx-lm (``KVCache`` with ``step = 256``) and, more
loosely, Hugging Face's ``DynamicCache``: storage starts small, tokens are
written into spare capacity in place, and when an append would run past the
capacity a new zero block (a whole number of 256-token steps) is concatenated
onto the time axis.

What this file does
-------------------
* ``k``/``v`` start as ``[B, Hkv, min(256, max_len), d]``.  ``append`` writes
  each row's ``n_new[b]`` tokens at ``lens[b]``; if the longest row would pass
  the capacity, both buffers are rebuilt with ``np.concatenate`` of the old
  buffer and a zero block (capacity rounded up to a multiple of 256, never past
  ``max_len``).  The new K and V are built before either is swapped in.
  ``max_len`` is still the hard limit: a row that would pass it raises
  ``ValueError`` before anything is written or grown.
* ``gqa_attention``: live keys ``0 .. lens.max()`` only, query heads folded as
  ``[B, Hkv, G, T, d]`` so K/V are read by broadcasting (head ``h`` reads KV
  head ``h // G``), bottom-right causal mask per row, exact zeros in padded
  query slots.

The cost: every growth copies the whole cache and briefly holds the old and the
new buffers at once, and ``k.shape[2]`` is the current capacity, not
``max_len``.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]

STEP = 256  # tokens of capacity added per growth step


def _counts(n_new, batch, width):
    n = np.asarray(n_new)
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"n_new must contain integers, got dtype {n.dtype}")
    n = n.astype(np.int64, copy=False)
    if n.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {n.shape}")
    if n.size and (n.min() < 0 or n.max() > width):
        raise ValueError(f"n_new values must be in [0, T={width}], got {n.tolist()}")
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
        self.dtype = np.dtype(dtype)
        first = min(STEP, self.max_len)
        self.k = np.zeros((self.batch, self.kv_heads, first, self.head_dim), dtype=self.dtype)
        self.v = np.zeros((self.batch, self.kv_heads, first, self.head_dim), dtype=self.dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def _grow_to(self, needed: int) -> None:
        """Concatenate zero blocks until ``needed`` tokens fit (whole steps, capped at max_len)."""
        steps = -(-(needed - self.capacity) // STEP)
        new_capacity = min(self.capacity + steps * STEP, self.max_len)
        block = (self.batch, self.kv_heads, new_capacity - self.capacity, self.head_dim)
        new_k = np.concatenate([self.k, np.zeros(block, dtype=self.dtype)], axis=2)
        new_v = np.concatenate([self.v, np.zeros(block, dtype=self.dtype)], axis=2)
        self.k, self.v = new_k, new_v

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != want:
                raise ValueError(f"{name}: expected [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have one shape")
        n = _counts(n_new, self.batch, k_new.shape[2])

        end = self.lens + n
        if np.any(end > self.max_len):
            b = int(np.flatnonzero(end > self.max_len)[0])
            raise ValueError(f"row {b} would hold {end[b]} tokens > max_len={self.max_len} (nothing written)")
        needed = int(end.max(initial=0))
        if needed > self.capacity:
            self._grow_to(needed)
        for b in np.flatnonzero(n):
            start = int(self.lens[b])
            self.k[b, :, start:start + n[b]] = k_new[b, :, :n[b]]
            self.v[b, :, start:start + n[b]] = v_new[b, :, :n[b]]
        self.lens += n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Hq, T, d], got {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q must be floating point, got {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q {q.shape} does not fit the cache (batch={cache.batch}, head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q has Hq={Hq}, not a multiple of Hkv={cache.kv_heads}")
    n = _counts(n_new, B, T)
    if np.any(n > cache.lens):
        raise ValueError(f"n_new {n.tolist()} exceeds the tokens held ({cache.lens.tolist()})")
    S = int(cache.lens.max()) if B else 0
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G, T, d)
    k = cache.k[:, :, None, :S]
    v = cache.v[:, :, None, :S]
    s = (qg @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(d))      # [B, Hkv, G, T, S]

    t = np.arange(T)
    j = np.arange(S)
    last = (cache.lens - n)[:, None] + t[None, :]              # [B, T]: the query's own position
    see = (j[None, None, :] <= last[:, :, None]) & (j[None, None, :] < cache.lens[:, None, None])
    see &= (t[None, :] < n[:, None])[:, :, None]
    see = see[:, None, None]

    s = np.where(see, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(under="ignore"):
        e = np.exp(s - mx)
    den = e.sum(axis=-1, keepdims=True)
    e /= np.where(den > 0, den, 1.0)
    return (e @ v).reshape(B, Hq, T, d).astype(q.dtype, copy=False)
