"""Grouped-query attention over a KV cache that doubles its capacity as it fills (NumPy).

A design common in dynamic arrays (Python lists, std::vector): the cache starts with room for
16 tokens and, when an append would not fit, allocates twice the room and copies what it holds
(never past ``max_len``). Appends cost amortised O(1), but every doubling copies the whole cache:
this is the reallocate-and-copy growth the kit names ``concat_growth``.

Original design notes (the attention is unchanged):

Design notes
------------
* ``KVCache`` allocates ``k`` and ``v`` once, ``[B, Hkv, max_len, d]``, and every
  append writes the new tokens in place at the row's current length.  Nothing
  is ever moved or copied after it is written.
* ``gqa_attention`` never materialises K/V per query head.  Query heads are
  contiguous groups, so ``q`` is reshaped to ``[B, Hkv, G, T, d]`` and NumPy's
  matmul broadcasts the cache slice ``[B, Hkv, 1, S, d]`` across the group axis
  by strides: head ``h`` reads KV head ``h // G``.
* Only the live prefix ``0 .. lens.max()`` of the cache is scanned.
* The causal mask is bottom-right aligned per row: query ``t`` of a chunk of
  ``n_new[b]`` tokens sits at absolute position ``lens[b] - n_new[b] + t``.
* Padded query slots (``t >= n_new[b]``) come back as exact zeros; the softmax
  is written so that fully masked rows never produce NaN or a floating point
  warning.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["KVCache", "gqa_attention"]


def _token_counts(n_new, batch: int, width: int) -> np.ndarray:
    """Validate ``n_new`` and return it as an int64 array of shape [batch]."""
    counts = np.asarray(n_new)
    if counts.size and counts.dtype.kind not in "iu":
        raise TypeError(f"n_new must hold integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64, copy=False)
    if counts.shape != (batch,):
        raise ValueError(f"n_new must have shape ({batch},) (one count per row), got {counts.shape}")
    bad = np.flatnonzero((counts < 0) | (counts > width))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"n_new[{b}] = {counts[b]} is out of range: each row takes 0 .. T = {width} tokens")
    return counts


class KVCache:
    """K/V cache allocated once; rows fill independently (ragged lengths)."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        for name, value in (("batch", batch), ("kv_heads", kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if kv_heads < 1 or head_dim < 1:
            raise ValueError(f"kv_heads and head_dim must be positive, got {kv_heads} and {head_dim}")
        self.batch, self.kv_heads = int(batch), int(kv_heads)
        self.max_len, self.head_dim = int(max_len), int(head_dim)
        self.dtype = dtype
        self.capacity = min(16, self.max_len)
        shape = (self.batch, self.kv_heads, self.capacity, self.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(self.batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        """Write ``n_new[b]`` tokens of ``k_new[b]``/``v_new[b]`` at ``lens[b]``.

        ``k_new``/``v_new`` are ``[B, Hkv, T, d]``; slots ``t >= n_new[b]`` are
        padding and ignored.  If any row would pass ``max_len`` nothing at all
        is written and ``ValueError`` is raised.
        """
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        B, H, d = self.batch, self.kv_heads, self.head_dim
        for name, arr in (("k_new", k_new), ("v_new", v_new)):
            if arr.ndim != 4 or arr.shape[0] != B or arr.shape[1] != H or arr.shape[3] != d:
                raise ValueError(f"{name} must have shape [B={B}, Hkv={H}, T, d={d}], got {arr.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have the same shape, got {k_new.shape} and {v_new.shape}")
        counts = _token_counts(n_new, B, k_new.shape[2])

        # Check every row before touching any of them.
        space_left = self.max_len - self.lens
        full = np.flatnonzero(counts > space_left)
        if full.size:
            b = int(full[0])
            raise ValueError(
                f"append would overflow row {b}: it holds {self.lens[b]} of max_len={self.max_len} "
                f"tokens and n_new[{b}] = {counts[b]} more were given (nothing was written)")

        # One scatter for all rows: (row, slot in chunk) pairs of real tokens.
        need = int((self.lens + counts).max()) if B else 0
        while need > self.capacity:  # double the room, copying what the cache holds
            grown = min(2 * self.capacity, self.max_len)
            extra = np.zeros((B, H, grown - self.capacity, d), dtype=self.k.dtype)
            self.k = np.concatenate([self.k, extra], axis=2)
            self.v = np.concatenate([self.v, extra], axis=2)
            self.capacity = grown

        rows = np.repeat(np.arange(B), counts)
        if rows.size:
            slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
            dest = self.lens[rows] + slot
            self.k[rows, :, dest] = k_new[rows, :, slot]
            self.v[rows, :, dest] = v_new[rows, :, slot]
        self.lens += counts


def gqa_attention(q, cache: KVCache, n_new):
    """Attention of the queries of the tokens just appended over ``cache``.

    ``q`` is ``[B, Hq, T, d]`` with ``Hq = G * Hkv``; returns ``[B, Hq, T, d]``
    in ``q``'s dtype.  Padded query slots are exactly zero.
    """
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D [B, Hq, T, d], got shape {q.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"q must be a floating point array, got dtype {q.dtype}")
    B, Hq, T, d = q.shape
    Hkv = cache.kv_heads
    if B != cache.batch:
        raise ValueError(f"q has batch {B} but the cache has batch {cache.batch} (q.shape={q.shape})")
    if d != cache.head_dim:
        raise ValueError(f"q has head_dim {d} but the cache has head_dim {cache.head_dim} (q.shape={q.shape})")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, not a multiple of the cache's {Hkv} KV heads")
    counts = _token_counts(n_new, B, T)
    if np.any(counts > cache.lens):
        b = int(np.flatnonzero(counts > cache.lens)[0])
        raise ValueError(f"n_new[{b}] = {counts[b]} but row {b} only holds {cache.lens[b]} tokens; append before attending")

    G = Hq // Hkv
    S = int(cache.lens.max()) if B else 0        # live keys only, not max_len
    if B == 0 or T == 0 or S == 0:
        return np.zeros(q.shape, dtype=q.dtype)

    k = cache.k[:, :, None, :S, :]                 # [B, Hkv, 1, S, d] (view)
    v = cache.v[:, :, None, :S, :]
    qg = q.reshape(B, Hkv, G, T, d)                # head h = kv * G + g
    scores = (qg @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(d))   # [B, Hkv, G, T, S]

    # Bottom-right causal mask, per row.
    t = np.arange(T)
    key = np.arange(S)
    first = cache.lens - counts                    # absolute position of query 0
    pos = first[:, None] + t[None, :]              # [B, T]
    is_query = t[None, :] < counts[:, None]        # [B, T]; False = padding
    visible = ((key[None, None, :] <= pos[:, :, None])
               & (key[None, None, :] < cache.lens[:, None, None])
               & is_query[:, :, None])             # [B, T, S]
    visible = visible[:, None, None]               # [B, 1, 1, T, S]

    scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)  # fully masked rows: no -inf - -inf
    with np.errstate(under="ignore"):              # exp of very negative scores -> 0 is fine
        weights = np.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)     # masked rows stay all-zero
    out = weights @ v                              # [B, Hkv, G, T, d]
    return out.reshape(B, Hq, T, d).astype(q.dtype, copy=False)
