import math

import numpy as np


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


class KVCache:
    """Per-row KV storage, allocated once; append writes at each row's length."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads < 1 or head_dim < 1:
            raise ValueError(f"KVCache({batch}, {kv_heads}, {max_len}, {head_dim}): invalid size")
        self.max_len = max_len
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        B, H, _, D = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        for nm, a in (("k_new", k_new), ("v_new", v_new)):
            if a.ndim != 4 or a.shape[0] != B or a.shape[1] != H or a.shape[3] != D:
                raise ValueError(f"{nm}.shape={a.shape}, expected ({B}, {H}, T, {D})")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new.shape={k_new.shape} != v_new.shape={v_new.shape}")
        n_new = counts_from(n_new, B, k_new.shape[2])
        target = self.lens + n_new
        if (target > self.max_len).any():
            b = int(np.flatnonzero(target > self.max_len)[0])
            raise ValueError(f"row {b}: lens {self.lens[b]} + n_new {n_new[b]} > max_len {self.max_len}")
        for b in range(B):
            self.k[b, :, self.lens[b]:target[b]] = k_new[b, :, :n_new[b]]
            self.v[b, :, self.lens[b]:target[b]] = v_new[b, :, :n_new[b]]
        self.lens[:] = target


def counts_from(n_new, B, T):
    n = np.asarray(n_new)
    if n.shape != (B,):
        raise ValueError(f"n_new.shape={n.shape}, expected ({B},)")
    if B and n.dtype.kind not in "iu":
        raise TypeError(f"n_new.dtype={n.dtype}, expected an integer dtype")
    n = n.astype(np.int64)
    if (n < 0).any() or (n > T).any():
        raise ValueError(f"n_new={n.tolist()} outside [0, T={T}]")
    return n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q.shape={q.shape}, expected (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    _, Hkv, _, dk = cache.k.shape
    if B != cache.k.shape[0] or d != dk:
        raise ValueError(f"q.shape={q.shape} does not match cache.k.shape={cache.k.shape}")
    if Hq % Hkv:
        raise ValueError(f"q has Hq={Hq} heads, not a multiple of Hkv={Hkv}")
    n = counts_from(n_new, B, T)
    if (n > cache.lens).any():
        raise ValueError(f"n_new={n.tolist()} > lens={cache.lens.tolist()}")
    S = int(cache.lens.max()) if B else 0
    if S == 0 or T == 0:
        return np.zeros_like(q)

    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G, T, d)
    k = cache.k[:, :, np.newaxis, :S]
    v = cache.v[:, :, np.newaxis, :S]
    s = qg @ np.swapaxes(k, -1, -2) / math.sqrt(d)              # [B, Hkv, G, T, S]

    pos = cache.lens[:, None] - n[:, None] + np.arange(T)       # absolute query positions
    key = np.arange(S)
    allowed = (key <= pos[..., None]) & (key < cache.lens[:, None, None])
    allowed &= (np.arange(T) < n[:, None])[..., None]           # only real queries
    s = np.where(allowed[:, None, None], s, -np.inf)

    out = softmax(s) @ v
    return out.reshape(B, Hq, T, d).astype(q.dtype)
