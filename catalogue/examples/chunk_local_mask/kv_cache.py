"""Preallocated KV cache and GQA attention (NumPy).

Causal masking: during prefill a token may only see itself and the tokens
before it (lower-triangular mask); during decode (one new token) the new
token is the last one in the row, so it can see the whole cache.
"""
import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"KVCache got batch={batch}, kv_heads={kv_heads}, max_len={max_len}, head_dim={head_dim}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        expect = f"[{self.batch}, {self.kv_heads}, T, {self.head_dim}]"
        for name, arr in [("k_new", k_new), ("v_new", v_new)]:
            if arr.ndim != 4 or arr.shape[:2] != (self.batch, self.kv_heads) or arr.shape[3] != self.head_dim:
                raise ValueError(f"{name} should be {expect}, got {arr.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} vs v_new {v_new.shape}")
        n_new = validate_n_new(n_new, self.batch, k_new.shape[2])
        end = self.lens + n_new
        if (end > self.max_len).any():
            bad = int(np.flatnonzero(end > self.max_len)[0])
            raise ValueError(f"row {bad} would grow to {end[bad]} tokens, max_len is {self.max_len}")
        for b in np.flatnonzero(n_new):
            self.k[b, :, self.lens[b]:end[b]] = k_new[b, :, :n_new[b]]
            self.v[b, :, self.lens[b]:end[b]] = v_new[b, :, :n_new[b]]
        self.lens[:] = end


def validate_n_new(n_new, batch, T):
    n_new = np.asarray(n_new)
    if n_new.shape != (batch,):
        raise ValueError(f"n_new should have shape ({batch},), got {n_new.shape}")
    if batch and not np.issubdtype(n_new.dtype, np.integer):
        raise TypeError(f"n_new should be integers, got {n_new.dtype}")
    n_new = n_new.astype(np.int64)
    if (n_new < 0).any() or (n_new > T).any():
        raise ValueError(f"n_new should be within [0, {T}], got {n_new.tolist()}")
    return n_new


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q should be [B, Hq, T, d], got {q.shape}")
    B, Hq, T, d = q.shape
    Hkv = cache.kv_heads
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q {q.shape} does not match cache batch {cache.batch} / head_dim {cache.head_dim}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads; must be a multiple of Hkv={Hkv}")
    n_new = validate_n_new(n_new, B, T)
    if (n_new > cache.lens).any():
        raise ValueError(f"n_new {n_new.tolist()} exceeds cache.lens {cache.lens.tolist()}")
    G = Hq // Hkv
    S = int(cache.lens.max(initial=0))
    if T == 0 or S == 0:
        return np.zeros(q.shape, q.dtype)

    keys = cache.k[:, :, :S]
    vals = cache.v[:, :, :S]
    scores = np.einsum("bkgtd,bksd->bkgts", q.reshape(B, Hkv, G, T, d), keys) / np.sqrt(d)

    if T > 1:
        causal = np.tril(np.ones((T, S), dtype=bool))     # prefill: token t sees 0..t
    else:
        causal = np.ones((1, S), dtype=bool)              # decode: sees the whole row
    in_row = np.arange(S)[None, :] < cache.lens[:, None]  # [B, S]
    real_q = np.arange(T)[None, :] < n_new[:, None]       # [B, T]
    mask = causal[None] & in_row[:, None, :] & real_q[:, :, None]   # [B, T, S]
    mask = mask[:, None, None]

    neg = np.finfo(scores.dtype).min
    scores = np.where(mask, scores, neg)
    scores -= scores.max(axis=-1, keepdims=True)
    with np.errstate(under="ignore"):                     # exp(very negative) -> 0 is intended
        probs = np.exp(scores) * mask
    denom = probs.sum(axis=-1, keepdims=True)
    probs = np.divide(probs, denom, out=np.zeros_like(probs), where=denom > 0)
    out = np.einsum("bkgts,bksd->bkgtd", probs, vals)
    return out.reshape(B, Hq, T, d).astype(q.dtype)
