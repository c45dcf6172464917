"""The PyTorch port of solutions/kv_cache.py: the same contract over torch tensors, on any device.

docs/contract.md ("PyTorch") is the contract; the rule functions are the NumPy
file's, stated again with torch (this file stands alone: it is also handed to
the grader as a submission's ``kv_cache_torch.py``). Two of them change shape,
because torch hides copies where NumPy does not:

* ``group_queries`` folds the group into the query rows, ``[B, Hkv, G * T, d]``.
  The NumPy form, ``q.view(B, Hkv, G, T, d) @ k.unsqueeze(2).transpose(-1, -2)``,
  makes ``torch.matmul`` expand K over the group axis and copy it G times before
  it calls ``bmm``.
* ``softmax_visible`` runs ``torch.softmax`` and then zeroes the hidden weights:
  a row with no visible key comes out of it as NaN.

The buffers are allocated once and written with ``copy_``; nothing grows by ``torch.cat``.
The classroom notebook (notebooks/kv_cache.pct.py) holds this code in its port
cell, each name with a ``_torch`` (``Torch`` for the class) suffix.
"""
from __future__ import annotations

import math

import torch


def check_counts(n_new, batch: int, limit: int, device, name: str = "n_new") -> torch.Tensor:
    """``n_new`` (a tensor, array or sequence) as an int64 tensor ``[batch]`` on ``device``, each count in ``0 .. limit``.

    Raises:
        ValueError: ``n_new`` is not of shape ``[batch]``, or a count is outside ``0 .. limit``.
        TypeError: the counts are not integers.
    """
    counts = torch.as_tensor(n_new)
    if tuple(counts.shape) != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {tuple(counts.shape)}")
    if batch and (counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got dtype {counts.dtype}")
    counts = counts.to(device=device, dtype=torch.int64)
    bad = torch.nonzero((counts < 0) | (counts > limit)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(counts[b])} is outside 0..T={limit}")
    return counts


class KVCache:
    """The keys and values of one attention layer for ``batch`` rows, in tensors allocated once on ``device``.

    Args:
        batch, kv_heads, max_len, head_dim: ``B``, ``Hkv``, the most tokens a row
            can hold, ``d``.
        dtype: the buffers' element type (default float32).
        device: where the buffers live (default: torch's default device).

    Attributes:
        k, v: ``[B, Hkv, max_len, d]`` tensors of ``dtype``, zero-filled here and
            only written into afterwards, never replaced.
        lens: int64 tensor ``[B]`` on the buffers' device, the tokens each row holds.

    Raises:
        ValueError: a size that is not an integer, a negative size, or no KV head
            or a head dimension of 0.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None):
        for name, value, low in (("batch", batch, 0), ("kv_heads", kv_heads, 1),
                                 ("max_len", max_len, 0), ("head_dim", head_dim, 1)):
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        shape = (int(batch), int(kv_heads), int(max_len), int(head_dim))
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = torch.zeros(int(batch), dtype=torch.int64, device=self.k.device)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, n_new) -> None:
        """Write the first ``n_new[b]`` tokens of each row ``b`` at ``lens[b]``, in place (rule 1).

        Args:
            k_new, v_new: ``[B, Hkv, T, d]`` tensors on the cache's device; slots
                ``t >= n_new[b]`` are padding and are not stored.
            n_new: int ``[B]`` (tensor or sequence), ``0 <= n_new[b] <= T``.

        Raises:
            ValueError: ``k_new`` not ``[B, Hkv, T, d]`` for this cache, ``v_new``
                not of ``k_new``'s shape, ``n_new`` not ``[B]`` or a count outside
                ``0 .. T``, or a row that would pass ``max_len``. Every row is
                checked before any is written, so then nothing changes.
            TypeError: ``n_new`` does not hold integers.
        """
        B, Hkv, max_len, d = self.k.shape
        if k_new.dim() != 4 or tuple(k_new.shape[:2]) != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = check_counts(n_new, B, k_new.shape[2], self.lens.device)
        end = self.lens + n_new
        over = torch.nonzero(end > max_len).flatten()
        if over.numel():
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        # Every row fits, so no write below can fail half-way through the batch.
        for b, (start, stop) in enumerate(zip(self.lens.tolist(), end.tolist())):
            self.k[b, :, start:stop].copy_(k_new[b, :, :stop - start])
            self.v[b, :, start:stop].copy_(v_new[b, :, :stop - start])
        # Last, so that no row ever claims a token it has not stored.
        self.lens.copy_(end)


def group_queries(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``q`` ``[B, Hq, T, d]`` as ``[B, Hkv, G * T, d]``: row ``g * T + t`` of KV head ``j`` is query head ``j * G + g`` at slot ``t`` (rule 2).

    Then ``Q K^T`` is one ``bmm`` per row and KV head against K as it is stored,
    and query head ``h`` reads KV head ``h // G``.

    Raises:
        ValueError: ``Hq`` is not a positive multiple of ``kv_heads``.
    """
    B, Hq, T, d = q.shape
    if Hq == 0 or Hq % kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={kv_heads}")
    return q.reshape(B, kv_heads, Hq // kv_heads * T, d)


def visible_keys(lens: torch.Tensor, n_new: torch.Tensor, T: int, S: int) -> torch.Tensor:
    """Which of the ``S`` live keys each query slot sees: bool ``[B, T, S]`` on ``lens``' device (rule 3).

    Args:
        lens: int64 tensor ``[B]``, the row lengths after the append.
        n_new: int64 tensor ``[B]`` on the same device, the real tokens each row got in this call.
        T: query slots per row. S: live keys, ``lens.max()``.

    Slot ``t < n_new[b]`` of row ``b`` is the token at ``lens[b] - n_new[b] + t``
    and sees keys ``0 ..`` that position; slots ``t >= n_new[b]`` see nothing.
    Not ``is_causal=True``, which aligns the triangle to the top left when ``T != S``.
    """
    t = torch.arange(T, device=lens.device)
    # Positions count from the start of the row, not of the chunk: the cached keys are visible too.
    position = (lens - n_new)[:, None] + t
    real = t < n_new[:, None]
    return (torch.arange(S, device=lens.device) <= position[:, :, None]) & real[:, :, None]


def softmax_visible(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` ``[..., S]`` over the entries where ``visible`` (broadcastable) is True.

    Returns:
        Weights of ``scores``' shape and dtype; a row with no visible entry (a
        padded slot) is exactly 0, never NaN.
    """
    hidden = ~visible
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    # torch.softmax of a row that is all -inf is NaN; its weights are 0 by the contract.
    return weights.masked_fill(hidden, 0.0)


def gqa_attention(q: torch.Tensor, cache: KVCache, n_new) -> torch.Tensor:
    """Causal GQA of the tokens just appended against everything their rows hold, on the cache's device.

    Args:
        q: ``[B, Hq, T, d]`` on the cache's device and of its dtype, ``Hq = G * Hkv``.
        cache: the ``KVCache`` their K/V were appended to.
        n_new: int ``[B]`` (tensor or sequence), the counts given to that ``append``.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype: ``softmax(q k^T / sqrt(d)) v`` over the keys
        ``visible_keys`` allows, query head ``h`` reading KV head ``h // G``, with no
        copy of K or V per query head. Padded slots and empty inputs are exactly 0.

    Raises:
        ValueError: ``q`` not ``[B, Hq, T, d]`` with the cache's ``B`` and ``d``, ``Hq``
            not a multiple of ``Hkv``, ``n_new`` not ``[B]`` or a count outside
            ``0 .. T``, or ``n_new[b] > lens[b]``.
        TypeError: ``n_new`` does not hold integers.
    """
    B, Hkv, _, d = cache.k.shape
    if q.dim() != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    Hq, T = q.shape[1], q.shape[2]
    qf = group_queries(q, Hkv)
    n_new = check_counts(n_new, B, T, cache.lens.device)
    short = torch.nonzero(n_new > cache.lens).flatten()
    if short.numel():
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(cache.lens[b])} tokens")

    # The live length, not max_len: keys past the longest row are empty for every row.
    S = int(cache.lens.max()) if B else 0
    if T == 0 or S == 0:
        return torch.zeros_like(q)
    k, v = cache.k[:, :, :S], cache.v[:, :, :S]
    G = Hq // Hkv
    scores = (qf @ k.transpose(-1, -2) / math.sqrt(d)).view(B, Hkv, G, T, S)
    visible = visible_keys(cache.lens, n_new, T, S)[:, None, None]
    weights = softmax_visible(scores, visible).view(B, Hkv, G * T, S)
    return (weights @ v).reshape(B, Hq, T, d)
