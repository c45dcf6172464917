import numpy as np

MASKED = -1.0e9


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"bad KVCache arguments: {batch=}, {kv_heads=}, {max_len=}, {head_dim=}")
        self.max_len = max_len
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        """Store the first n_new[b] tokens of k_new[b], v_new[b] after row b's last token."""
        B, H, _, D = self.k.shape
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[0] != B or k_new.shape[1] != H or k_new.shape[3] != D:
            raise ValueError(f"k_new must be (B={B}, Hkv={H}, T, d={D}); got {k_new.shape}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must be {k_new.shape} like k_new; got {v_new.shape}")
        n_new = parse_n_new(n_new, B, k_new.shape[2])
        new_lens = self.lens + n_new
        for b in range(B):
            if new_lens[b] > self.max_len:
                raise ValueError(f"row {b} would overflow: {self.lens[b]} + {n_new[b]} > {self.max_len}")
        for b in range(B):
            self.k[b, :, self.lens[b]:new_lens[b]] = k_new[b, :, :n_new[b]]
            self.v[b, :, self.lens[b]:new_lens[b]] = v_new[b, :, :n_new[b]]
        self.lens[:] = new_lens


def parse_n_new(n_new, B, T):
    arr = np.asarray(n_new)
    if arr.shape != (B,):
        raise ValueError(f"n_new must have shape ({B},); got {arr.shape}")
    if B and arr.dtype.kind not in "iu":
        raise TypeError(f"n_new must contain ints; got {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any((arr < 0) | (arr > T)):
        raise ValueError(f"n_new must be in [0, {T}]; got {arr.tolist()}")
    return arr


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be (B, Hq, T, d); got {q.shape}")
    B, Hq, T, D = q.shape
    _, Hkv, _, Dk = cache.k.shape
    if B != cache.k.shape[0] or D != Dk:
        raise ValueError(f"q {q.shape} doesn't fit cache {cache.k.shape}")
    if Hq % Hkv != 0:
        raise ValueError(f"q has {Hq} heads which is not a multiple of {Hkv} KV heads")
    n_new = parse_n_new(n_new, B, T)
    if np.any(n_new > cache.lens):
        raise ValueError(f"n_new {n_new.tolist()} > cache lens {cache.lens.tolist()}")
    G = Hq // Hkv
    out = np.zeros_like(q)

    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        # causal mask for the n new tokens (positions L-n .. L-1) over keys 0..L-1
        mask = np.arange(L)[None, :] > np.arange(L - n, L)[:, None]
        for g in range(Hkv):
            K = cache.k[b, g, :L]
            V = cache.v[b, g, :L]
            Q = q[b, g * G:(g + 1) * G, :n]          # the G query heads that share KV head g
            scores = Q @ K.T                          # [G, n, L]
            scores[:, mask] = MASKED
            scores -= scores.max(axis=-1, keepdims=True)
            with np.errstate(under="ignore"):   # masked entries -> exactly 0
                probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[b, g * G:(g + 1) * G, :n] = probs @ V
    return out
