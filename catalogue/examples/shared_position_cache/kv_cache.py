"""KV cache with one write position shared by the whole batch (NumPy).

Which public design this imitates
---------------------------------
Meta's reference Llama code passes a single ``start_pos`` to every layer, and
gpt-fast passes one ``input_pos`` vector for the batch (FlashAttention's
``cache_seqlens`` is often filled with one value the same way).  The cache is
preallocated, and every row of the batch is written at that one position and
moves forward by the same number of tokens.

What this file does
-------------------
* ``k``/``v`` are ``[B, Hkv, max_len, d]``, allocated once; appends write in
  place.  ``lens`` is kept per row as the contract asks, but all of its entries
  are always equal: they are the batch's one position.
* ``append`` writes the first ``n = max(n_new)`` slots of every row at that
  position and advances every row by ``n``.  The overflow check runs before any
  write, so a refused append changes nothing.
* ``gqa_attention`` builds one bottom-right causal mask ``[T, S]`` for the whole
  batch (query ``t`` sits at ``S - n + t``), reads KV head ``h // G`` through a
  broadcast (no copy), scans only the live ``S`` keys, and returns exact zeros
  for padded query slots.

The limitation, on purpose: this is right whenever every row has always
received the same number of tokens (the batched-generation case these designs
serve).  Rows that move by different amounts (ragged rows, zero-token rows) are
not modelled: a shorter row gets the padding slots written as if they were
tokens.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _check_counts(n_new, rows: int, slots: int) -> np.ndarray:
    counts = np.asarray(n_new)
    if counts.size and counts.dtype.kind not in "iu":
        raise TypeError(f"n_new must be integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64, copy=False)
    if counts.shape != (rows,):
        raise ValueError(f"n_new must have shape ({rows},), got {counts.shape}")
    if counts.size and (counts.min() < 0 or counts.max() > slots):
        raise ValueError(f"n_new must lie in 0 .. T = {slots}, got {counts.tolist()}")
    return counts


class KVCache:
    """Preallocated cache whose rows all share one write position."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        for name, value in (("batch", batch), ("kv_heads", kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"bad cache shape: batch={batch}, kv_heads={kv_heads}, "
                             f"max_len={max_len}, head_dim={head_dim}")
        self.batch, self.kv_heads = int(batch), int(kv_heads)
        self.max_len, self.head_dim = int(max_len), int(head_dim)
        shape = (self.batch, self.kv_heads, self.max_len, self.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    @property
    def position(self) -> int:
        """The batch's one write position (``start_pos``)."""
        return int(self.lens[0]) if self.batch else 0

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, arr in (("k_new", k_new), ("v_new", v_new)):
            if arr.ndim != 4 or (arr.shape[0], arr.shape[1], arr.shape[3]) != want:
                raise ValueError(f"{name} must be [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {arr.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have the same shape")
        counts = _check_counts(n_new, self.batch, k_new.shape[2])

        start = self.position
        step = int(counts.max(initial=0))           # the batch moves together
        if start + step > self.max_len:
            raise ValueError(f"append would pass max_len={self.max_len}: the batch is at position {start} "
                             f"and {step} more tokens were given (nothing was written)")
        if step:
            self.k[:, :, start:start + step] = k_new[:, :, :step]
            self.v[:, :, start:start + step] = v_new[:, :, :step]
            self.lens[:] = start + step


def gqa_attention(q, cache: KVCache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Hq, T, d], got shape {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q must be floating point, got dtype {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q {q.shape} does not match the cache (batch={cache.batch}, head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a multiple of Hkv={cache.kv_heads}")
    counts = _check_counts(n_new, B, T)
    S = cache.position
    step = int(counts.max(initial=0))
    if step > S:
        raise ValueError(f"n_new {counts.tolist()} asks for more tokens than the cache holds ({S})")
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    grouped = q.reshape(B, Hkv, G, T, d)             # head h = kv * G + g
    keys = cache.k[:, :, None, :S]                   # [B, Hkv, 1, S, d], a view
    values = cache.v[:, :, None, :S]
    scores = grouped @ keys.swapaxes(-1, -2)
    scores *= 1.0 / math.sqrt(d)                     # [B, Hkv, G, T, S]

    # One mask for the batch: query t sits at start_pos + t = S - step + t.
    t = np.arange(T)
    causal = np.arange(S)[None, :] <= (S - step + t)[:, None]      # [T, S]
    real = t[None, :] < counts[:, None]                            # [B, T]
    visible = causal[None, :, :] & real[:, :, None]                # [B, T, S]
    visible = visible[:, None, None]                               # [B, 1, 1, T, S]

    scores = np.where(visible, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(under="ignore"):
        weights = np.exp(scores - top)
    norm = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(norm > 0, norm, 1.0)         # padded slots stay all-zero
    out = weights @ values
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
