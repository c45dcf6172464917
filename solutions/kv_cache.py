"""Grouped-query attention over a KV cache allocated once and written in place (NumPy).

The kit's answer, written to be read; docs/contract.md is the contract it keeps.
Its three rules are named functions:

1. ``KVCache.append`` writes each row's new tokens once, at the row's current
   length, into buffers allocated in ``__init__``; nothing is moved afterwards.
2. ``group_queries``: query head ``h`` reads KV head ``h // G``.
3. ``visible_keys``: query ``t`` of row ``b`` sits at ``lens[b] - n_new[b] + t``
   (lens after the append) and sees keys ``0 ..`` that position, the causal mask
   aligned to the bottom right; ``softmax_visible`` weighs those keys only and
   gives exactly 0 to a query that sees none (a padded slot).

Shapes: ``B`` rows, ``Hkv`` KV heads (``kv_heads``), ``G`` query heads per KV
head, ``Hq = G * Hkv``, ``d`` the head dimension (``head_dim``), ``T`` slots per
call, ``S = lens.max()`` live keys. The classroom notebook
(notebooks/kv_cache.pct.py) holds this code in its answer cells, function for
function.
"""
from __future__ import annotations

import math

import numpy as np


def check_counts(n_new, batch: int, limit: int, name: str = "n_new") -> np.ndarray:
    """``n_new`` as int64 ``[batch]``, each count in ``0 .. limit``.

    Raises:
        ValueError: ``n_new`` is not of shape ``[batch]``, or a count is outside ``0 .. limit``.
        TypeError: the counts are not integers.
    """
    counts = np.asarray(n_new)
    if counts.shape != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {counts.shape}")
    if batch and not np.issubdtype(counts.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64)
    bad = np.flatnonzero((counts < 0) | (counts > limit))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(counts[b])} is outside 0..T={limit}")
    return counts


class KVCache:
    """The keys and values of one attention layer for ``batch`` rows, in buffers allocated once.

    Args:
        batch, kv_heads, max_len, head_dim: ``B``, ``Hkv``, the most tokens a row
            can hold, ``d``.
        dtype: the buffers' element type (default float32).

    Attributes:
        k, v: ``[B, Hkv, max_len, d]`` arrays of ``dtype``, zero-filled here and
            only written into afterwards, never replaced.
        lens: int64 ``[B]``, the tokens each row holds.

    Raises:
        ValueError: a size that is not an integer, a negative size, or no KV head
            or a head dimension of 0.
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
        """Write the first ``n_new[b]`` tokens of each row ``b`` at ``lens[b]``, in place (rule 1).

        Args:
            k_new, v_new: ``[B, Hkv, T, d]``; slots ``t >= n_new[b]`` are padding
                and are not stored.
            n_new: int ``[B]``, ``0 <= n_new[b] <= T``.

        Raises:
            ValueError: ``k_new`` not ``[B, Hkv, T, d]`` for this cache, ``v_new``
                not of ``k_new``'s shape, ``n_new`` not ``[B]`` or a count outside
                ``0 .. T``, or a row that would pass ``max_len``. Every row is
                checked before any is written, so then nothing changes.
            TypeError: ``n_new`` does not hold integers.
        """
        B, Hkv, max_len, d = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = check_counts(n_new, B, k_new.shape[2])
        end = self.lens + n_new
        over = np.flatnonzero(end > max_len)
        if over.size:
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        # Every row fits, so no write below can fail half-way through the batch.
        for b in range(B):
            start, stop = int(self.lens[b]), int(end[b])
            self.k[b, :, start:stop] = k_new[b, :, :stop - start]
            self.v[b, :, start:stop] = v_new[b, :, :stop - start]
        # Last, so that no row ever claims a token it has not stored.
        self.lens[:] = end


def group_queries(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """``q`` ``[B, Hq, T, d]`` as ``[B, Hkv, G, T, d]``: query head ``h = j * G + g`` at ``[j, g]`` (rule 2).

    Groups are contiguous, so ``j = h // G`` is the KV head that query head reads,
    the layout of released GQA checkpoints and of PyTorch's ``enable_gqa``. K and V
    keep their ``[B, Hkv, S, d]`` shape; matmul broadcasts them over the group axis.

    Raises:
        ValueError: ``Hq`` is not a positive multiple of ``kv_heads``.
    """
    B, Hq, T, d = q.shape
    if Hq == 0 or Hq % kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={kv_heads}")
    return q.reshape(B, kv_heads, Hq // kv_heads, T, d)


def visible_keys(lens, n_new, T: int, S: int) -> np.ndarray:
    """Which of the ``S`` live keys each query slot sees: bool ``[B, T, S]`` (rule 3).

    Args:
        lens: int ``[B]``, the row lengths after the append.
        n_new: int ``[B]``, the real tokens each row got in this call.
        T: query slots per row. S: live keys, ``lens.max()``.

    Slot ``t < n_new[b]`` of row ``b`` is the token at ``lens[b] - n_new[b] + t``
    and sees keys ``0 ..`` that position; slots ``t >= n_new[b]`` see nothing.
    """
    lens, n_new = np.asarray(lens), np.asarray(n_new)
    # Positions count from the start of the row, not of the chunk: a chunk after
    # cached tokens sees them all (a top-left mask would hide them), and as every
    # position is below lens[b], a shorter row never sees the empty slots past its end.
    position = (lens - n_new)[:, None] + np.arange(T)
    real = np.arange(T) < n_new[:, None]
    return (np.arange(S) <= position[:, :, None]) & real[:, :, None]


def softmax_visible(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Softmax of ``scores`` ``[..., S]`` over the entries where ``visible`` (broadcastable) is True.

    Returns:
        Weights of ``scores``' shape and dtype; a row with no visible entry (a
        padded slot) is exactly 0, never NaN, with no floating-point warning.
    """
    scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    # Subtracting the peak keeps exp from overflowing; with nothing visible the peak is
    # -inf, and -inf - -inf would be NaN.
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    # Hidden entries weigh exp(-inf) = 0, so a row that sees nothing sums to 0: divide it by 1.
    return weights / np.where(total > 0, total, 1.0)


def gqa_attention(q: np.ndarray, cache: KVCache, n_new) -> np.ndarray:
    """Causal GQA of the tokens just appended against everything their rows hold.

    Args:
        q: ``[B, Hq, T, d]``, the queries of the ``T`` slots just appended, ``Hq = G * Hkv``.
        cache: the ``KVCache`` their K/V were appended to.
        n_new: int ``[B]``, the counts given to that ``append``; slots ``t >= n_new[b]``
            are padding.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype: ``softmax(q k^T / sqrt(d)) v`` over the keys
        ``visible_keys`` allows, query head ``h`` reading KV head ``h // G``. Padded
        slots, rows with ``n_new[b] = 0``, and the whole result when ``B``, ``T`` or
        the cache is empty, are exactly 0.

    Raises:
        ValueError: ``q`` not ``[B, Hq, T, d]`` with the cache's ``B`` and ``d``, ``Hq``
            not a multiple of ``Hkv``, ``n_new`` not ``[B]`` or a count outside
            ``0 .. T``, or ``n_new[b] > lens[b]``.
        TypeError: ``n_new`` does not hold integers.
    """
    q = np.asarray(q)
    B, Hkv, _, d = cache.k.shape
    if q.ndim != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    T = q.shape[2]
    qg = group_queries(q, Hkv)
    n_new = check_counts(n_new, B, T)
    short = np.flatnonzero(n_new > cache.lens)
    if short.size:
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(cache.lens[b])} tokens")

    out = np.zeros(q.shape, dtype=q.dtype)
    # The live length, not max_len: keys past the longest row are empty for every row,
    # and decode reads every byte of K and V it attends over.
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return out
    # Slices of the buffers are views; the new axis lets matmul reuse each KV head
    # for its G query heads by strides instead of copying it G times.
    k = cache.k[:, :, None, :S]
    v = cache.v[:, :, None, :S]
    scores = qg @ k.swapaxes(-1, -2) / math.sqrt(d)
    visible = visible_keys(cache.lens, n_new, T, S)[:, None, None]
    out[...] = (softmax_visible(scores, visible) @ v).reshape(q.shape)
    return out
