"""KV cache + grouped-query attention.

The cache keeps k/v as [B, Hkv, L, d] where L is the longest row so far and
grows with every append (max_len is the limit a row may not pass).  Shorter
rows are zero-padded at the end; lens says how much of each row is real.
"""
import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or kv_heads < 1 or max_len < 0 or head_dim < 1:
            raise ValueError(f"invalid cache dims batch={batch}, kv_heads={kv_heads}, "
                             f"max_len={max_len}, head_dim={head_dim}")
        self.batch, self.kv_heads, self.max_len, self.head_dim = batch, kv_heads, max_len, head_dim
        self.dtype = np.dtype(dtype)
        self.k = np.zeros((batch, kv_heads, 0, head_dim), dtype=self.dtype)
        self.v = np.zeros((batch, kv_heads, 0, head_dim), dtype=self.dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        want = (self.batch, self.kv_heads, self.head_dim)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if x.ndim != 4 or (x.shape[0], x.shape[1], x.shape[3]) != want:
                raise ValueError(f"{name}: expected [B={want[0]}, Hkv={want[1]}, T, d={want[2]}], got {x.shape}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} differ")
        n_new = _counts(n_new, self.batch, k_new.shape[2])

        new_lens = self.lens + n_new
        if np.any(new_lens > self.max_len):
            b = int(np.argmax(new_lens > self.max_len))
            raise ValueError(f"row {b} would hold {new_lens[b]} tokens > max_len {self.max_len}")

        # grow the time axis to fit the longest row, then drop each row's new
        # tokens in right after its old ones
        extra = int(new_lens.max(initial=0)) - self.k.shape[2]
        if extra > 0:
            pad = np.zeros((self.batch, self.kv_heads, extra, self.head_dim), dtype=self.dtype)
            self.k = np.concatenate([self.k, pad], axis=2)
            self.v = np.concatenate([self.v, pad], axis=2)
        for b in range(self.batch):
            lo, hi = self.lens[b], new_lens[b]
            self.k[b, :, lo:hi] = k_new[b, :, :n_new[b]]
            self.v[b, :, lo:hi] = v_new[b, :, :n_new[b]]
        self.lens = new_lens


def _counts(n_new, batch, T):
    n = np.asarray(n_new)
    if n.shape != (batch,):
        raise ValueError(f"n_new: expected shape ({batch},), got {n.shape}")
    if n.size and n.dtype.kind not in "iu":
        raise TypeError(f"n_new: expected integers, got {n.dtype}")
    n = n.astype(np.int64)
    if np.any(n < 0) or np.any(n > T):
        raise ValueError(f"n_new: every entry must be in 0..{T}, got {n.tolist()}")
    return n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: expected [B, Hq, T, d], got {q.shape}")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: shape {q.shape} does not fit cache batch={cache.batch}, head_dim={cache.head_dim}")
    if Hq % cache.kv_heads:
        raise ValueError(f"q: {Hq} heads is not a multiple of kv_heads={cache.kv_heads}")
    n_new = _counts(n_new, B, T)
    if np.any(n_new > cache.lens):
        raise ValueError(f"n_new {n_new.tolist()} exceeds cache lens {cache.lens.tolist()}")
    G = Hq // cache.kv_heads
    S = int(cache.lens.max(initial=0))
    if T == 0 or S == 0:
        return np.zeros_like(q)

    qg = q.reshape(B, cache.kv_heads, G, T, d)
    scores = np.einsum("bhgtd,bhsd->bhgts", qg, cache.k[:, :, :S]) / np.sqrt(d)

    start = cache.lens - n_new                                  # position of query 0
    qpos = start[:, None] + np.arange(T)                        # [B, T]
    kpos = np.arange(S)
    ok = (kpos[None, None, :] <= qpos[:, :, None]) & (kpos[None, None, :] < cache.lens[:, None, None])
    ok &= (np.arange(T)[None, :] < n_new[:, None])[:, :, None]  # padding queries see nothing
    ok = ok[:, None, None]                                      # [B, 1, 1, T, S]

    scores = np.where(ok, scores, -np.inf)
    m = np.max(scores, axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    w = np.where(ok, np.exp(scores - m), 0.0)
    denom = w.sum(-1, keepdims=True)
    w = w / np.maximum(denom, np.finfo(w.dtype).tiny)
    out = np.einsum("bhgts,bhsd->bhgtd", w, cache.v[:, :, :S])
    return out.reshape(B, Hq, T, d).astype(q.dtype)
