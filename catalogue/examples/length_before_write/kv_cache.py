"""GQA with a preallocated KV cache.

append() writes every row's new tokens at lens[b] in the existing buffers.
gqa_attention() groups the Hq query heads into Hkv groups of G heads each;
group i uses KV head i (so head h -> KV head h // G).
"""
import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads <= 0 or head_dim <= 0:
            raise ValueError(f"invalid KVCache dims: batch={batch} kv_heads={kv_heads} "
                             f"max_len={max_len} head_dim={head_dim}")
        self.batch = batch
        self.kv_heads = kv_heads
        self.max_len = max_len
        self.head_dim = head_dim
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (self.batch, self.kv_heads) or k_new.shape[3] != self.head_dim:
            raise ValueError(f"k_new: shape {k_new.shape}, expected ({self.batch}, {self.kv_heads}, T, {self.head_dim})")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new: shape {v_new.shape} differs from k_new {k_new.shape}")
        n_new = _token_counts(n_new, self.batch, k_new.shape[2])

        for b in range(self.batch):
            start = self.lens[b]
            self.lens[b] += n_new[b]
            if self.lens[b] > self.max_len:
                raise ValueError(f"row {b} overflows the cache: {start} + {n_new[b]} > max_len {self.max_len}")
            self.k[b, :, start:self.lens[b]] = k_new[b, :, :n_new[b]]
            self.v[b, :, start:self.lens[b]] = v_new[b, :, :n_new[b]]


def _token_counts(n_new, batch, T):
    n_new = np.asarray(n_new)
    if n_new.shape != (batch,):
        raise ValueError(f"n_new: shape {n_new.shape}, expected ({batch},)")
    if batch and not np.issubdtype(n_new.dtype, np.integer):
        raise TypeError(f"n_new: dtype {n_new.dtype}, expected integers")
    n_new = n_new.astype(np.int64)
    if (n_new < 0).any() or (n_new > T).any():
        raise ValueError(f"n_new: {n_new.tolist()} not within 0..{T}")
    return n_new


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: shape {q.shape}, expected (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: shape {q.shape} vs cache batch {cache.batch}, head_dim {cache.head_dim}")
    if Hq % cache.kv_heads:
        raise ValueError(f"q: Hq={Hq} is not divisible by Hkv={cache.kv_heads}")
    n_new = _token_counts(n_new, B, T)
    if (n_new > cache.lens).any():
        raise ValueError(f"n_new: {n_new.tolist()} larger than cached lens {cache.lens.tolist()}")
    G = Hq // cache.kv_heads
    S = int(cache.lens.max()) if B else 0
    out = np.zeros(q.shape, dtype=q.dtype)
    if S == 0 or T == 0:
        return out

    k = cache.k[:, :, :S]
    v = cache.v[:, :, :S]
    qg = q.reshape(B, cache.kv_heads, G, T, d)
    att = np.einsum("bhgtd,bhsd->bhgts", qg, k) / np.sqrt(d)

    # absolute position of each query; keys beyond it (or beyond lens) are
    # hidden, and padded query slots (t >= n_new[b]) see nothing at all
    qpos = (cache.lens - n_new)[:, None] + np.arange(T)
    keys = np.arange(S)[None, None, :]
    hidden = (keys > qpos[:, :, None]) | (keys >= cache.lens[:, None, None])
    hidden |= (np.arange(T)[None, :] >= n_new[:, None])[:, :, None]
    att = np.where(hidden[:, None, None], -np.inf, att)

    peak = att.max(-1, keepdims=True)
    peak[np.isneginf(peak)] = 0.0           # all hidden: avoid -inf - -inf
    w = np.exp(att - peak)
    total = w.sum(-1, keepdims=True)
    np.divide(w, total, out=w, where=total > 0)
    ctx = np.einsum("bhgts,bhsd->bhgtd", w, v)
    out[:] = ctx.reshape(B, cache.kv_heads * G, T, d)
    return out
