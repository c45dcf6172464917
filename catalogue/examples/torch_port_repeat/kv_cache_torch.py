"""Torch version of kv_cache.py (CPU or CUDA)."""
import math

import torch


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"KVCache: got {batch}, {kv_heads}, {max_len}, {head_dim}")
        self.max_len = max_len
        self.k = torch.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(batch, dtype=torch.long, device=self.k.device)

    def append(self, k_new, v_new, n_new):
        B, Hkv, _, d = self.k.shape
        for label, x in (("k_new", k_new), ("v_new", v_new)):
            if x.dim() != 4 or tuple(x.shape[:2]) != (B, Hkv) or x.shape[3] != d:
                raise ValueError(f"{label} has shape {tuple(x.shape)}; want ({B}, {Hkv}, T, {d})")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} differ")
        n = _counts(n_new, B, k_new.shape[2])
        lens = self.lens.tolist()
        for r in range(B):
            if lens[r] + n[r] > self.max_len:
                raise ValueError(f"no room in row {r}: lens={lens[r]}, n_new={n[r]}, max_len={self.max_len}")
        for r in range(B):
            if n[r]:
                self.k[r, :, lens[r]:lens[r] + n[r]].copy_(k_new[r, :, :n[r]])
                self.v[r, :, lens[r]:lens[r] + n[r]].copy_(v_new[r, :, :n[r]])
        self.lens += torch.tensor(n, dtype=torch.long, device=self.lens.device)


def _counts(n_new, B, T):
    n = torch.as_tensor(n_new)
    if tuple(n.shape) != (B,):
        raise ValueError(f"n_new has shape {tuple(n.shape)}; want ({B},)")
    if B and n.dtype.is_floating_point:
        raise TypeError(f"n_new has dtype {n.dtype}; want integers")
    n = [int(x) for x in n.tolist()]
    if any(x < 0 or x > T for x in n):
        raise ValueError(f"n_new = {n}; each must be in [0, {T}]")
    return n


def gqa_attention(q, cache, n_new):
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; want (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    _, Hkv, _, dc = cache.k.shape
    if B != cache.k.shape[0] or d != dc:
        raise ValueError(f"q has shape {tuple(q.shape)}; cache k is {tuple(cache.k.shape)}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads; not a multiple of the {Hkv} KV heads")
    n = _counts(n_new, B, T)
    lens = cache.lens.tolist()
    if any(a > b for a, b in zip(n, lens)):
        raise ValueError(f"n_new = {n} but lens = {lens}")
    S = max(lens, default=0)
    if T == 0 or S == 0:
        return torch.zeros_like(q)
    G = Hq // Hkv
    dev = cache.k.device

    # give every query head its own copy of its KV head so plain SDPA-style math works
    k = cache.k[:, :, :S].repeat_interleave(G, dim=1).to(q.dtype)   # [B, Hq, S, d]
    v = cache.v[:, :, :S].repeat_interleave(G, dim=1).to(q.dtype)

    scores = q.to(dev) @ k.transpose(-2, -1) / math.sqrt(d)         # [B, Hq, T, S]
    lens_t = cache.lens.view(B, 1, 1)
    n_t = torch.tensor(n, device=dev).view(B, 1, 1)
    t = torch.arange(T, device=dev).view(1, T, 1)
    j = torch.arange(S, device=dev).view(1, 1, S)
    ok = (j <= lens_t - n_t + t) & (j < lens_t) & (t < n_t)        # [B, T, S]
    scores = scores.masked_fill(~ok[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)           # fully masked rows -> 0
    return (probs @ v).to(q.device)
