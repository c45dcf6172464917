"""The same cache in PyTorch, on any device: buffers allocated once, written with copy_, no K/V repeat.

Like the NumPy version, append refuses chunked prefill with NotImplementedError.
"""
import math

import torch


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"bad cache size ({batch}, {kv_heads}, {max_len}, {head_dim})")
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lens = torch.zeros(batch, dtype=torch.int64, device=self.k.device)

    def append(self, k_new, v_new, n_new):
        B, H, L, D = self.k.shape
        if k_new.dim() != 4 or tuple(k_new.shape[:2]) != (B, H) or k_new.shape[3] != D or v_new.shape != k_new.shape:
            raise ValueError(f"k_new/v_new must be [{B}, {H}, T, {D}], got {tuple(k_new.shape)} and {tuple(v_new.shape)}")
        counts = [int(c) for c in torch.as_tensor(n_new).reshape(-1).tolist()]
        if len(counts) != B or any(c < 0 or c > k_new.shape[2] for c in counts):
            raise ValueError(f"n_new must be {B} counts in 0..T={k_new.shape[2]}, got {counts}")
        lens = self.lens.tolist()
        if any(held + c > L for held, c in zip(lens, counts)):
            raise ValueError(f"append would overflow max_len {L}: lens {lens} + n_new {counts}")
        if any(held > 0 and c > 1 for held, c in zip(lens, counts)):
            raise NotImplementedError("chunked prefill (a chunk appended to a row that holds tokens already) is "
                                      "not supported: prefill a whole prompt into an empty row, then decode")
        for b, (lo, n) in enumerate(zip(lens, counts)):
            if n:
                self.k[b, :, lo:lo + n].copy_(k_new[b, :, :n])
                self.v[b, :, lo:lo + n].copy_(v_new[b, :, :n])
        self.lens += torch.tensor(counts, dtype=torch.int64, device=self.lens.device)


def gqa_attention(q, cache, n_new):
    B, Hq, T, d = q.shape
    Hkv = cache.k.shape[1]
    if B != cache.k.shape[0] or d != cache.k.shape[3] or Hq % Hkv:
        raise ValueError(f"q {tuple(q.shape)} does not fit a cache of {tuple(cache.k.shape)}")
    G = Hq // Hkv
    counts = [int(c) for c in torch.as_tensor(n_new).reshape(-1).tolist()]
    out = torch.zeros_like(q)
    for b, (n, L) in enumerate(zip(counts, cache.lens.tolist())):
        if n == 0:
            continue
        dev = cache.k.device
        pos = torch.arange(L - n, L, device=dev)
        allowed = torch.arange(L, device=dev)[None, :] <= pos[:, None]           # [n, L]
        rows = q[b, :, :n].to(device=dev, dtype=cache.k.dtype).reshape(Hkv, G * n, d)
        s = (rows @ cache.k[b, :, :L].transpose(-1, -2) / math.sqrt(d)).view(Hkv, G, n, L)
        w = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).view(Hkv, G * n, L)
        out[b, :, :n] = (w @ cache.v[b, :, :L]).reshape(Hq, n, d).to(q.device, q.dtype)
    return out
