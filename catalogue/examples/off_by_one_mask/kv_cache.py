import numpy as np


class KVCache:
    """Preallocated cache: k, v are [batch, kv_heads, max_len, head_dim]."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0:
            raise ValueError(f"batch and max_len must be >= 0 (got {batch}, {max_len})")
        if kv_heads <= 0 or head_dim <= 0:
            raise ValueError(f"kv_heads and head_dim must be > 0 (got {kv_heads}, {head_dim})")
        self.max_len = max_len
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        B, H, _, D = self.k.shape
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[0] != B or k_new.shape[1] != H or k_new.shape[3] != D:
            raise ValueError(f"k_new must be [B={B}, Hkv={H}, T, d={D}], got {k_new.shape}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new must have k_new's shape {k_new.shape}, got {v_new.shape}")
        counts = get_counts(n_new, B, k_new.shape[2])
        for row in range(B):
            if self.lens[row] + counts[row] > self.max_len:
                raise ValueError(f"row {row} is full: lens={self.lens[row]}, n_new={counts[row]}, max_len={self.max_len}")
        for row in range(B):
            c, L = counts[row], self.lens[row]
            if c:
                self.k[row, :, L:L + c] = k_new[row, :, :c]
                self.v[row, :, L:L + c] = v_new[row, :, :c]
                self.lens[row] = L + c


def get_counts(n_new, B, T):
    counts = np.asarray(n_new)
    if counts.shape != (B,):
        raise ValueError(f"n_new must have shape ({B},), got {counts.shape}")
    if B and counts.dtype.kind not in "iu":
        raise TypeError(f"n_new must be an integer array, got {counts.dtype}")
    counts = counts.astype(np.int64)
    if B and (counts.min() < 0 or counts.max() > T):
        raise ValueError(f"n_new entries must be in [0, T={T}], got {counts.tolist()}")
    return counts


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Hq, T, d], got {q.shape}")
    B, Hq, T, D = q.shape
    Hkv = cache.k.shape[1]
    if B != cache.k.shape[0] or D != cache.k.shape[3]:
        raise ValueError(f"q {q.shape} incompatible with cache k {cache.k.shape}")
    if Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    counts = get_counts(n_new, B, T)
    if np.any(counts > cache.lens):
        raise ValueError(f"n_new {counts.tolist()} > lens {cache.lens.tolist()}")
    G = Hq // Hkv
    scale = D ** -0.5
    result = np.zeros(q.shape, dtype=q.dtype)

    for row in range(B):
        L, c = int(cache.lens[row]), int(counts[row])
        if c == 0:
            continue
        K = cache.k[row, :, :L]                      # [Hkv, L, D]
        V = cache.v[row, :, :L]
        Q = q[row, :, :c].reshape(Hkv, G, c, D)      # heads grouped by the KV head they use
        logits = np.einsum("hgtd,hsd->hgts", Q, K) * scale

        # query t is token number L - c + t of the row; it may look up to the
        # next position (the row has already been written up to L - 1)
        pos = np.arange(L - c, L)
        visible = np.arange(L)[None, :] <= np.minimum(pos + 1, L - 1)[:, None]   # [c, L]
        logits = np.where(visible, logits, -1e30)

        logits -= logits.max(-1, keepdims=True)
        with np.errstate(under="ignore"):    # the -1e30 entries underflow to 0
            w = np.exp(logits)
        w /= w.sum(-1, keepdims=True)
        result[row, :, :c] = np.einsum("hgts,hsd->hgtd", w, V).reshape(Hq, c, D)
    return result
