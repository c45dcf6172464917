"""The direct reference the grader trusts: written for obviousness, never for speed.

Everything is upcast to float64, KV heads are repeated outright, and each query
position is handled on its own (all heads at once) with a plain softmax over
keys ``0 .. its position``. No masks to get wrong: if this and an
implementation disagree, the implementation is wrong.
"""
from __future__ import annotations

import math

import numpy as np


def attention_ref(q, k, v, lens, n_new) -> np.ndarray:
    """Expected GQA output for the tokens just appended.

    Args:
        q: ``[B, Hq, T, d]`` queries.
        k, v: ``[B, Hkv, L, d]`` cache contents with ``L >= max(lens)``; row ``b``
            is valid in ``[:lens[b]]`` (anything past it is ignored).
        lens: int ``[B]``, row lengths after the append.
        n_new: int ``[B]``, tokens appended to each row in this call.

    Returns:
        float64 ``[B, Hq, T, d]``; slots ``t >= n_new[b]`` are 0.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Hq, T, d = q.shape
    Hkv = k.shape[1]
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    G = Hq // Hkv
    # Query head h reads KV head h // G: repeat each KV head G times in a row.
    k = np.repeat(k, G, axis=1)
    v = np.repeat(v, G, axis=1)
    out = np.zeros((B, Hq, T, d))
    for b in range(B):
        for t in range(int(n_new[b])):
            pos = int(lens[b]) - int(n_new[b]) + t
            keys, values = k[b, :, : pos + 1], v[b, :, : pos + 1]  # [Hq, pos + 1, d]: keys 0 .. pos
            scores = np.einsum("hkd,hd->hk", keys, q[b, :, t]) / math.sqrt(d)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights /= weights.sum(axis=1, keepdims=True)
            out[b, :, t] = np.einsum("hk,hkd->hd", weights, values)
    return out


class ReferenceHistory:
    """What a cache should hold: each row's tokens kept as a plain list.

    The oracle side of a trial replays every append here (concatenating freely:
    speed does not matter) and asks ``expected`` for each step's output.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int):
        self.rows_k = [[] for _ in range(batch)]
        self.rows_v = [[] for _ in range(batch)]
        self.kv_heads, self.head_dim = kv_heads, head_dim

    def append(self, k_new, v_new, n_new) -> None:
        """Record ``k_new[b, :, :n_new[b]]`` (``[B, Hkv, T, d]``) for every row."""
        for b, n in enumerate(np.asarray(n_new)):
            for t in range(int(n)):
                self.rows_k[b].append(np.asarray(k_new[b, :, t], dtype=np.float64))
                self.rows_v[b].append(np.asarray(v_new[b, :, t], dtype=np.float64))

    @property
    def lens(self) -> np.ndarray:
        """int64 ``[B]``: tokens recorded per row."""
        return np.array([len(r) for r in self.rows_k], dtype=np.int64)

    def dense(self):
        """``(k, v)`` as float64 ``[B, Hkv, max(lens), d]``, zero past each row's length."""
        B, L = len(self.rows_k), int(self.lens.max()) if self.rows_k else 0
        k = np.zeros((B, self.kv_heads, L, self.head_dim))
        v = np.zeros_like(k)
        for b in range(B):
            n = len(self.rows_k[b])
            if n:  # tokens [n, Hkv, d] into [Hkv, n, d]
                k[b, :, :n] = np.stack(self.rows_k[b], axis=1)
                v[b, :, :n] = np.stack(self.rows_v[b], axis=1)
        return k, v

    def expected(self, q, n_new) -> np.ndarray:
        """Oracle output of ``q`` ``[B, Hq, T, d]`` after the latest append."""
        k, v = self.dense()
        return attention_ref(q, k, v, self.lens, n_new)


class OracleCache:
    """The cache contract (docs/contract.md) kept the plainest way, for mistakes planted in this process.

    Diagnosis plants the catalogue's mistakes (``catalogue.mutants.plant``) around this class and
    ``oracle_attention``, so that the grader needs no reference solution: the Gradescope bundle ships none.

    Args:
        batch, kv_heads, max_len, head_dim: ``B``, ``Hkv``, the most tokens a row holds, ``d``.
        dtype: the buffers' element type.

    Attributes:
        k, v: ``[B, Hkv, max_len, d]`` buffers of ``dtype``; ``lens``: int64 ``[B]``.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=np.float32):
        shape = (int(batch), int(kv_heads), int(max_len), int(head_dim))
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(int(batch), dtype=np.int64)

    def append(self, k_new, v_new, n_new) -> None:
        """Store token ``t < n_new[b]`` of row ``b`` at ``lens[b] + t``, one token at a time.

        Raises:
            ValueError: a row would pass ``max_len``; then nothing is written.
        """
        counts = np.asarray(n_new).astype(np.int64)
        end = self.lens + counts
        if np.any(end > self.k.shape[2]):
            raise ValueError(f"append would overflow: lens + n_new = {end.tolist()} > max_len = {self.k.shape[2]}")
        for b in range(len(counts)):
            for t in range(int(counts[b])):
                self.k[b, :, int(self.lens[b]) + t] = k_new[b, :, t]
                self.v[b, :, int(self.lens[b]) + t] = v_new[b, :, t]
        self.lens = end


def oracle_attention(q, cache: OracleCache, n_new) -> np.ndarray:
    """``attention_ref`` of ``q`` over ``cache``'s live keys, in ``q``'s dtype (the contract's ``gqa_attention``)."""
    q = np.asarray(q)
    live = int(cache.lens.max()) if len(cache.lens) else 0
    return attention_ref(q, cache.k[:, :, :live], cache.v[:, :, :live], cache.lens, np.asarray(n_new)).astype(q.dtype)
