"""PyTorch port of kv_cache.py: same names, torch tensors, any device.

* Buffers are allocated once; appends write with ``copy_`` into slices of them.
* No K/V repeat of any kind.  The group axis is folded into the query rows,
  ``q.reshape(B, Hkv, G * T, d) @ k.transpose(-1, -2)``, which is one ``bmm``
  over ``B * Hkv`` batches.  (The tempting ``q.view(B, Hkv, G, T, d) @
  k.unsqueeze(2).transpose(-1, -2)`` makes torch.matmul expand K and copy it G
  times before the bmm.)
* Bottom-right causal mask; padded query slots come back as zeros.
"""
from __future__ import annotations

import math

import torch

__all__ = ["KVCache", "gqa_attention"]


def _counts(n_new, batch: int, width: int, device) -> tuple[torch.Tensor, list[int]]:
    counts = torch.as_tensor(n_new)
    if counts.numel() and (counts.dtype.is_floating_point or counts.dtype.is_complex
                           or counts.dtype == torch.bool):
        raise TypeError(f"n_new must hold integers, got dtype {counts.dtype}")
    if tuple(counts.shape) != (batch,):
        raise ValueError(f"n_new must have shape ({batch},) (one count per row), got {tuple(counts.shape)}")
    as_list = [int(c) for c in counts.tolist()]
    for b, c in enumerate(as_list):
        if c < 0 or c > width:
            raise ValueError(f"n_new[{b}] = {c} is out of range: each row takes 0 .. T = {width} tokens")
    return torch.tensor(as_list, dtype=torch.int64, device=device), as_list


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        for name, value in (("batch", batch), ("kv_heads", kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if kv_heads < 1 or head_dim < 1:
            raise ValueError(f"kv_heads and head_dim must be positive, got {kv_heads} and {head_dim}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(batch, dtype=torch.int64, device=self.k.device)

    @property
    def device(self):
        return self.k.device

    def append(self, k_new, v_new, n_new):
        B, H, d = self.batch, self.kv_heads, self.head_dim
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4 or t.shape[0] != B or t.shape[1] != H or t.shape[3] != d:
                raise ValueError(f"{name} must have shape [B={B}, Hkv={H}, T, d={d}], got {tuple(t.shape)}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have the same shape, got {tuple(k_new.shape)} and {tuple(v_new.shape)}")
        counts, count_list = _counts(n_new, B, k_new.shape[2], self.device)

        lens = self.lens.tolist()
        for b, (held, n) in enumerate(zip(lens, count_list)):
            if held + n > self.max_len:
                raise ValueError(
                    f"append would overflow row {b}: it holds {held} of max_len={self.max_len} "
                    f"tokens and n_new[{b}] = {n} more were given (nothing was written)")

        for b, (start, n) in enumerate(zip(lens, count_list)):
            if n:
                self.k[b, :, start:start + n].copy_(k_new[b, :, :n])
                self.v[b, :, start:start + n].copy_(v_new[b, :, :n])
        self.lens.add_(counts)


def gqa_attention(q, cache: KVCache, n_new):
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [B, Hq, T, d], got shape {tuple(q.shape)}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be floating point, got {q.dtype}")
    B, Hq, T, d = q.shape
    Hkv = cache.kv_heads
    if B != cache.batch:
        raise ValueError(f"q has batch {B} but the cache has batch {cache.batch} (q.shape={tuple(q.shape)})")
    if d != cache.head_dim:
        raise ValueError(f"q has head_dim {d} but the cache has head_dim {cache.head_dim} (q.shape={tuple(q.shape)})")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, not a multiple of the cache's {Hkv} KV heads")
    counts, count_list = _counts(n_new, B, T, cache.device)
    lens_list = cache.lens.tolist()
    for b, (n, held) in enumerate(zip(count_list, lens_list)):
        if n > held:
            raise ValueError(f"n_new[{b}] = {n} but row {b} only holds {held} tokens; append before attending")

    G = Hq // Hkv
    S = max(lens_list, default=0)                  # live keys only
    if B == 0 or T == 0 or S == 0:
        return torch.zeros_like(q)

    dev = cache.device
    work = torch.promote_types(q.dtype, cache.k.dtype)
    k = cache.k[:, :, :S].to(work)                 # views unless a cast is needed
    v = cache.v[:, :, :S].to(work)
    rows = q.to(device=dev, dtype=work).reshape(B, Hkv, G * T, d)   # row g*T + t of KV head kv

    scores = (rows @ k.transpose(-1, -2)).mul_(1.0 / math.sqrt(d))  # [B, Hkv, G*T, S]
    scores = scores.view(B, Hkv, G, T, S)

    t = torch.arange(T, device=dev)
    key = torch.arange(S, device=dev)
    pos = (cache.lens - counts)[:, None] + t[None, :]               # [B, T]
    visible = ((key[None, None, :] <= pos[:, :, None])
               & (key[None, None, :] < cache.lens[:, None, None])
               & (t[None, :, None] < counts[:, None, None]))        # [B, T, S]
    visible = visible[:, None, None]                                # [B, 1, 1, T, S]

    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    weights = weights.masked_fill(~visible, 0.0)   # rows with no visible key were NaN
    out = weights.view(B, Hkv, G * T, S) @ v      # [B, Hkv, G*T, d]
    return out.view(B, Hq, T, d).to(device=q.device, dtype=q.dtype)
