"""Grouped-query attention over a KV cache allocated once and written in place (NumPy).

The reference a learner reads after finishing. Three rules (docs/contract.md):

1. K/V are written once, at the row's current length, and never moved afterwards.
2. Query head ``h`` reads KV head ``h // G`` (contiguous groups, the layout of
   released GQA checkpoints and of PyTorch's ``enable_gqa``).
3. Query ``t`` of a chunk of ``n_new[b]`` tokens sits at absolute position
   ``lens[b] - n_new[b] + t`` (lens after the append) and sees keys ``0 ..`` that
   position: the bottom-right aligned causal mask.

Shapes: ``B`` rows, ``Hkv`` KV heads (``kv_heads``), ``Hq = G * Hkv`` query heads,
``d`` = ``head_dim``, ``T`` query/new-token slots per call, ``S`` live keys.
"""
from __future__ import annotations

import math

import numpy as np


def _as_counts(n_new, batch: int, limit: int, name: str = "n_new") -> np.ndarray:
    """Validate a per-row token count: int ``[batch]`` with ``0 <= n <= limit``."""
    arr = np.asarray(n_new)
    if arr.shape != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {arr.shape}")
    if batch and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero((arr < 0) | (arr > limit))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(arr[b])} is outside 0..T={limit}")
    return arr


class KVCache:
    """Per-layer K/V buffers ``[B, Hkv, max_len, d]``, allocated once.

    Attributes:
        k, v: ``[batch, kv_heads, max_len, head_dim]`` arrays of ``dtype``; never
            replaced, only written into.
        lens: int64 ``[batch]``, the number of valid tokens in each row.

    Raises:
        ValueError: a negative size, or ``kv_heads``/``head_dim`` of zero.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=np.float32):
        for name, value, low in (("batch", batch, 0), ("kv_heads", kv_heads, 1),
                                 ("max_len", max_len, 0), ("head_dim", head_dim, 1)):
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        shape = (int(batch), int(kv_heads), int(max_len), int(head_dim))
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(int(batch), dtype=np.int64)

    def append(self, k_new: np.ndarray, v_new: np.ndarray, n_new) -> None:
        """Write ``n_new[b]`` new tokens of each row at position ``lens[b]``.

        Args:
            k_new, v_new: ``[B, Hkv, T, d]``; slots ``t >= n_new[b]`` are padding
                and are not stored.
            n_new: int ``[B]``, ``0 <= n_new[b] <= T``.

        Raises:
            ValueError: shapes that do not match the cache, ``n_new`` out of range,
                or a row that would pass ``max_len``. Every row is checked before
                any is written, so on error nothing changes (not ``lens``, not data).
        """
        B, Hkv, max_len, d = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = _as_counts(n_new, B, k_new.shape[2])
        end = self.lens + n_new
        over = np.flatnonzero(end > max_len)
        if over.size:
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        for b in range(B):
            start, stop = int(self.lens[b]), int(end[b])
            self.k[b, :, start:stop] = k_new[b, :, : stop - start]
            self.v[b, :, start:stop] = v_new[b, :, : stop - start]
        # Lengths move only after every row is stored (rule 1, and all-or-nothing).
        self.lens[:] = end


def gqa_attention(q: np.ndarray, cache: KVCache, n_new) -> np.ndarray:
    """Causal GQA of the tokens just appended against everything in the cache.

    Args:
        q: ``[B, Hq, T, d]`` queries of the ``T`` slots just appended, ``Hq = G * Hkv``.
        cache: the ``KVCache`` the matching K/V were appended to.
        n_new: int ``[B]``, the real tokens of each row in this call (as given to
            ``append``); slots ``t >= n_new[b]`` are padding.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype, softmax(q k^T / sqrt(d)) v under the
        bottom-right causal mask; padded slots are exactly 0.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``, B or d not the cache's,
            ``n_new`` out of range, or more new tokens than a row holds.
    """
    q = np.asarray(q)
    B, Hkv, _, d = cache.k.shape
    if q.ndim != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    Hq, T = q.shape[1], q.shape[2]
    if Hq == 0 or Hq % Hkv:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={Hkv}")
    G = Hq // Hkv
    n_new = _as_counts(n_new, B, T)
    short = np.flatnonzero(n_new > cache.lens)
    if short.size:
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(cache.lens[b])} tokens")

    out = np.zeros(q.shape, dtype=q.dtype)
    S = int(cache.lens.max()) if B else 0  # the live length, not max_len
    if T == 0 or S == 0:
        return out

    k = cache.k[:, :, :S]  # views into the buffers: no copy of the cache
    v = cache.v[:, :, :S]
    # Head h = j * G + g reads KV head j = h // G: split the query heads into
    # [Hkv, G] and let matmul broadcast K over the group axis by strides.
    qg = (q * (1.0 / math.sqrt(d))).reshape(B, Hkv, G, T, d)  # scale the small q, not the scores
    scores = qg @ k[:, :, None].swapaxes(-1, -2)  # [B, Hkv, G, T, S]

    pos = (cache.lens - n_new)[:, None] + np.arange(T)  # [B, T] absolute position of each query
    real = np.arange(T) < n_new[:, None]  # [B, T] padded slots see nothing
    visible = (np.arange(S) <= pos[:, :, None]) & real[:, :, None]  # [B, T, S]
    visible = visible[:, None, None]  # broadcast over Hkv and G

    # Softmax over visible keys only. A query with no visible key (padding) gets
    # an all-zero row: exp(-inf) is an exact 0 and its sum is replaced by 1, so
    # no 0/0 and no floating-point warning.
    np.copyto(scores, -np.inf, where=~visible)  # in place: no new [B, Hkv, G, T, S] array
    peak = scores.max(axis=-1, keepdims=True)
    peak[~np.isfinite(peak)] = 0.0
    weights = np.exp(np.subtract(scores, peak, out=scores), out=scores)
    total = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)

    # Fold the group into the rows for the second product: one [G*T, S] @ [S, d]
    # per KV head instead of G vector-matrix products.
    out[...] = (weights.reshape(B, Hkv, G * T, S) @ v).reshape(B, Hq, T, d)
    return out
