"""Grouped-query attention over a preallocated KV cache (NumPy).

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
        shape = (self.batch, self.kv_heads, self.max_len, self.head_dim)
        # zeros, not empty: slots past a row's length take part in the (masked)
        # products, and uninitialised memory could hold NaN or inf.
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


# ---------------------------------------------------------------- exploration, run at import
# A candidate's working file: a self-check against a loop reference, and a timed decode at 4,096 tokens.
# It runs whenever the module is imported; the answer above is unchanged.

def _loop_reference(q, k, v, lens, n_new):
    """Every query, one at a time: repeat the KV heads, bottom-right mask, plain softmax (float64)."""
    B, Hq, T, d = q.shape
    G = Hq // k.shape[1]
    out = np.zeros((B, Hq, T, d))
    for b in range(B):
        for h in range(Hq):
            for t in range(int(n_new[b])):
                pos = int(lens[b]) - int(n_new[b]) + t
                s = k[b, h // G, :pos + 1] @ q[b, h, t] / math.sqrt(d)
                w = np.exp(s - s.max())
                out[b, h, t] = (w / w.sum()) @ v[b, h // G, :pos + 1]
    return out


def _self_check(seed=0):
    rng = np.random.default_rng(seed)
    cache = KVCache(2, 2, 24, 8, dtype=np.float64)
    for n in ([5, 3], [1, 1], [4, 0], [2, 6]):
        T = max(n)
        k, v = rng.standard_normal((2, 2, T, 8)), rng.standard_normal((2, 2, T, 8))
        q = rng.standard_normal((2, 8, T, 8))
        cache.append(k, v, np.array(n))
        got = gqa_attention(q, cache, np.array(n))
        want = _loop_reference(q, cache.k, cache.v, cache.lens, n)
        assert np.allclose(got, want, atol=1e-10), "self-check failed"


def _timed_decode(tokens=4096, steps=32):
    import time

    rng = np.random.default_rng(1)
    cache = KVCache(1, 8, tokens + steps, 128)
    cache.append(rng.standard_normal((1, 8, tokens, 128), dtype=np.float32),
                 rng.standard_normal((1, 8, tokens, 128), dtype=np.float32), np.array([tokens]))
    q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)
    start = time.perf_counter()
    for _ in range(steps):
        one = rng.standard_normal((1, 8, 1, 128), dtype=np.float32)
        cache.append(one, one, np.array([1]))
        gqa_attention(q, cache, np.array([1]))
    return (time.perf_counter() - start) / steps


_self_check()
DECODE_SECONDS = _timed_decode()
print(f"decode at 4,096 tokens (32/8, d = 128): {DECODE_SECONDS * 1e3:.2f} ms a step")
