"""PyTorch port of kv_cache.py, with a boolean key mask that grows by torch.cat.

Which public design this imitates
---------------------------------
Hugging Face ``generate`` keeps a boolean/0-1 ``attention_mask`` next to the
cache and extends it each step with ``torch.cat([mask, new_columns], dim=-1)``.
This port does the same for its key-validity mask, while K and V themselves
are reserved once and written in place.

What this file does
-------------------
* ``KVCache``: ``k``/``v`` ``[B, Hkv, max_len, d]`` allocated once on the chosen
  device (CUDA when present and no device is given, else CPU); ``append``
  checks every row against ``max_len`` first, then ``copy_``s each row's real
  tokens to ``lens[b]`` and advances ``lens``.
* ``key_mask``: bool ``[B, W]`` with ``W = lens.max()``; ``key_mask[b, j]`` is
  True when row ``b`` holds token ``j``.  When the longest row gets longer,
  ``append`` widens it with ``torch.cat`` of False columns, then marks the new
  tokens True.  It costs one byte per row per token, next to the
  ``2 * Hkv * d`` elements per row per token of K/V.
* ``gqa_attention``: queries folded to ``[B, Hkv, G * T, d]`` (one ``bmm`` per
  KV head; no expand, repeat or repeat_interleave of K/V), scores masked by
  ``key_mask``, the bottom-right causal mask (query ``t`` at
  ``lens[b] - n_new[b] + t``) and the padded slots; masked rows are zeroed
  after the softmax so padded slots are exactly 0.
"""
from __future__ import annotations

import math

import torch

__all__ = ["KVCache", "gqa_attention"]


def _counts(n_new, batch, slots, device):
    counts = torch.as_tensor(n_new)
    if counts.numel() and (counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool):
        raise TypeError(f"n_new must hold integers, got dtype {counts.dtype}")
    if tuple(counts.shape) != (batch,):
        raise ValueError(f"n_new must have shape ({batch},), got {tuple(counts.shape)}")
    values = [int(c) for c in counts.tolist()]
    for b, c in enumerate(values):
        if c < 0 or c > slots:
            raise ValueError(f"n_new[{b}] = {c} is outside 0 .. T = {slots}")
    return torch.tensor(values, dtype=torch.int64, device=device), values


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("max_len", max_len), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"invalid cache dims batch={batch}, kv_heads={kv_heads}, "
                             f"max_len={max_len}, head_dim={head_dim}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(batch, dtype=torch.int64, device=self.k.device)
        self.key_mask = torch.zeros(batch, 0, dtype=torch.bool, device=self.k.device)

    @property
    def device(self):
        return self.k.device

    def append(self, k_new, v_new, n_new):
        B, H, d = self.batch, self.kv_heads, self.head_dim
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if x.dim() != 4 or x.shape[0] != B or x.shape[1] != H or x.shape[3] != d:
                raise ValueError(f"{name} must be [B={B}, Hkv={H}, T, d={d}], got {tuple(x.shape)}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} must have the same shape")
        counts, values = _counts(n_new, B, k_new.shape[2], self.device)

        held = self.lens.tolist()
        for b, (have, c) in enumerate(zip(held, values)):
            if have + c > self.max_len:
                raise ValueError(f"append would overflow row {b}: it holds {have} of max_len={self.max_len} "
                                 f"and n_new[{b}] = {c} more were given (nothing was written)")

        widest = max((have + c for have, c in zip(held, values)), default=0)
        extra = widest - self.key_mask.shape[1]
        if extra > 0:
            self.key_mask = torch.cat([self.key_mask, self.key_mask.new_zeros(B, extra)], dim=1)
        for b, (at, c) in enumerate(zip(held, values)):
            if c:
                self.k[b, :, at:at + c].copy_(k_new[b, :, :c])
                self.v[b, :, at:at + c].copy_(v_new[b, :, :c])
                self.key_mask[b, at:at + c] = True
        self.lens.add_(counts)


def gqa_attention(q, cache, n_new):
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, Hq, T, d], got {tuple(q.shape)}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be floating point, got {q.dtype}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q {tuple(q.shape)} does not match the cache (batch={cache.batch}, "
                         f"head_dim={cache.head_dim})")
    if Hq % cache.kv_heads:
        raise ValueError(f"q has Hq={Hq} heads, not a multiple of Hkv={cache.kv_heads}")
    counts, values = _counts(n_new, B, T, cache.device)
    held = cache.lens.tolist()
    for b, (c, have) in enumerate(zip(values, held)):
        if c > have:
            raise ValueError(f"n_new[{b}] = {c} but row {b} holds only {have} tokens")
    S = max(held, default=0)
    if B == 0 or T == 0 or S == 0:
        return torch.zeros_like(q)

    Hkv = cache.kv_heads
    G = Hq // Hkv
    dev = cache.device
    work = torch.promote_types(q.dtype, cache.k.dtype)
    k = cache.k[:, :, :S].to(work)                 # views unless a cast is needed
    v = cache.v[:, :, :S].to(work)
    rows = q.to(device=dev, dtype=work).reshape(B, Hkv, G * T, d)

    scores = torch.matmul(rows, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(d)).view(B, Hkv, G, T, S)

    t = torch.arange(T, device=dev)
    key = torch.arange(S, device=dev)
    pos = (cache.lens - counts)[:, None] + t[None, :]                       # [B, T]
    visible = ((key[None, None, :] <= pos[:, :, None])
               & cache.key_mask[:, None, :S]
               & (t[None, :, None] < counts[:, None, None]))                 # [B, T, S]
    visible = visible[:, None, None]                                        # [B, 1, 1, T, S]

    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    weights = weights.masked_fill(~visible, 0.0)   # a row with nothing visible was NaN: now zeros
    out = torch.matmul(weights.view(B, Hkv, G * T, S), v)
    return out.view(B, Hq, T, d).to(device=q.device, dtype=q.dtype)
