"""The PyTorch port of ``kv_cache.py``: the same contract over torch tensors, on any device.

What changes from NumPy is where copies hide. Buffers are allocated once and
written by ``copy_``; nothing grows by ``torch.cat``. And the group axis is
folded into the query rows, ``[B, Hkv, G * T, d] @ [B, Hkv, d, S]``, because the
broadcasting form ``q.view(B, Hkv, G, T, d) @ k.unsqueeze(2)...`` makes
``torch.matmul`` expand K and materialise G copies of it before ``bmm``.
"""
from __future__ import annotations

import math

import torch


def _as_counts(n_new, batch: int, limit: int, device, name: str = "n_new") -> torch.Tensor:
    """Validate a per-row token count: int ``[batch]`` with ``0 <= n <= limit``, as int64 on ``device``."""
    n = torch.as_tensor(n_new)
    if tuple(n.shape) != (batch,):
        raise ValueError(f"{name} must have shape [B]=({batch},), got {tuple(n.shape)}")
    if batch and (n.dtype.is_floating_point or n.dtype.is_complex or n.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got dtype {n.dtype}")
    n = n.to(device=device, dtype=torch.int64)
    bad = torch.nonzero((n < 0) | (n > limit)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"{name}[{b}]={int(n[b])} is outside 0..T={limit}")
    return n


class KVCache:
    """Per-layer K/V buffers ``[B, Hkv, max_len, d]``, allocated once on ``device``.

    Attributes:
        k, v: ``[batch, kv_heads, max_len, head_dim]`` tensors of ``dtype``; never replaced.
        lens: int64 tensor ``[batch]`` on the same device.

    Raises:
        ValueError: a negative size, or ``kv_heads``/``head_dim`` of zero.
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
        """Write ``n_new[b]`` new tokens of each row at ``lens[b]``, in place.

        Args:
            k_new, v_new: ``[B, Hkv, T, d]`` tensors; slots ``t >= n_new[b]`` are padding.
            n_new: int ``[B]`` (tensor or sequence), ``0 <= n_new[b] <= T``.

        Raises:
            ValueError: shapes that do not match, ``n_new`` out of range, or a row
                that would pass ``max_len``; all rows are checked first, so on
                error nothing changes.
        """
        B, Hkv, max_len, d = self.k.shape
        if k_new.dim() != 4 or tuple(k_new.shape[:2]) != (B, Hkv) or k_new.shape[3] != d:
            raise ValueError(f"k_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}], got {list(k_new.shape)}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {list(k_new.shape)}, got {list(v_new.shape)}")
        n_new = _as_counts(n_new, B, k_new.shape[2], self.lens.device)
        end = self.lens + n_new
        over = torch.nonzero(end > max_len).flatten()
        if over.numel():
            b = int(over[0])
            raise ValueError(f"append would overflow row {b}: lens[{b}]={int(self.lens[b])} + "
                             f"n_new[{b}]={int(n_new[b])} > max_len={max_len}; nothing was written")
        for b, (start, stop) in enumerate(zip(self.lens.tolist(), end.tolist())):
            self.k[b, :, start:stop].copy_(k_new[b, :, : stop - start])
            self.v[b, :, start:stop].copy_(v_new[b, :, : stop - start])
        self.lens.copy_(end)  # only after every row is stored


def gqa_attention(q: torch.Tensor, cache: KVCache, n_new) -> torch.Tensor:
    """Causal GQA of the tokens just appended, bottom-right mask, no KV repeat.

    Args:
        q: ``[B, Hq, T, d]`` on the cache's device, ``Hq = G * Hkv``.
        cache: the ``KVCache`` the matching K/V were appended to.
        n_new: int ``[B]``, the real tokens of each row in this call.

    Returns:
        ``[B, Hq, T, d]`` in q's dtype; padded slots exactly 0.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``, B or d not the cache's,
            ``n_new`` out of range, or more new tokens than a row holds.
    """
    B, Hkv, _, d = cache.k.shape
    if q.dim() != 4 or q.shape[0] != B or q.shape[3] != d:
        raise ValueError(f"q must be [B, Hq, T, d] with B={B}, d={d}, got {list(q.shape)}")
    Hq, T = q.shape[1], q.shape[2]
    if Hq == 0 or Hq % Hkv:
        raise ValueError(f"q has Hq={Hq} heads, not a positive multiple of the cache's Hkv={Hkv}")
    G = Hq // Hkv
    lens = cache.lens
    n_new = _as_counts(n_new, B, T, lens.device)
    short = torch.nonzero(n_new > lens).flatten()
    if short.numel():
        b = int(short[0])
        raise ValueError(f"n_new[{b}]={int(n_new[b])} but row {b} holds only lens[{b}]={int(lens[b])} tokens")

    out = torch.zeros_like(q)
    S = int(lens.max()) if B else 0  # the live length, not max_len
    if T == 0 or S == 0:
        return out

    k = cache.k[:, :, :S]  # views into the buffers
    v = cache.v[:, :, :S]
    # Fold the group into the rows: row g * T + t of KV head j is query head
    # j * G + g at slot t. One bmm per (b, j), no expanded copy of K or V.
    qf = (q * (1.0 / math.sqrt(d))).reshape(B, Hkv, G * T, d)  # scale the small q, not the scores
    # K times q^T streams K rows in storage order; q @ K^T runs a transposed gemm about 2x slower on CPU.
    scores = (k @ qf.transpose(-1, -2)).transpose(-1, -2)  # [B, Hkv, G*T, S] (a transposed view)

    t = torch.arange(T, device=lens.device)
    pos = (lens - n_new)[:, None] + t  # [B, T]
    real = t < n_new[:, None]
    visible = (torch.arange(S, device=lens.device) <= pos[:, :, None]) & real[:, :, None]  # [B, T, S]
    visible = visible[:, None, None]  # [B, 1, 1, T, S]: broadcast over Hkv and G

    hidden = ~visible
    scores = scores.reshape(B, Hkv, G, T, S).masked_fill_(hidden, float("-inf"))
    # Padded rows are all -inf and softmax gives them NaN: zero them explicitly.
    weights = torch.softmax(scores, dim=-1).masked_fill_(hidden, 0.0)
    out = (weights.view(B, Hkv, G * T, S) @ v).reshape(B, Hq, T, d)
    return out
