# KV cache with grouped-query attention.
#
# Each KV head is shared by G = Hq / Hkv query heads.  Query heads are spread
# round-robin over the KV heads, so head h uses KV head h % Hkv (no copy of K/V:
# every head just reads its slice of the cache).
import numpy as np


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if kv_heads < 1 or head_dim < 1 or batch < 0 or max_len < 0:
            raise ValueError(f"KVCache: bad sizes ({batch}, {kv_heads}, {max_len}, {head_dim})")
        self.batch = batch
        self.kv_heads = kv_heads
        self.max_len = max_len
        self.head_dim = head_dim
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros_like(self.k)
        self.lens = np.zeros(batch, dtype=np.int64)

    def append(self, k_new, v_new, n_new):
        k_new = np.asarray(k_new)
        v_new = np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[0] != self.batch or k_new.shape[1] != self.kv_heads \
                or k_new.shape[3] != self.head_dim:
            raise ValueError(f"k_new: got {k_new.shape}, want ({self.batch}, {self.kv_heads}, T, {self.head_dim})")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new: got {v_new.shape}, want {k_new.shape} like k_new")
        n_new = _as_counts(n_new, self.batch, k_new.shape[2])
        room = self.max_len - self.lens
        for b in range(self.batch):
            if n_new[b] > room[b]:
                raise ValueError(f"append: row {b} has room for {room[b]} tokens, got n_new[{b}]={n_new[b]}")
        for b in range(self.batch):
            s, n = self.lens[b], n_new[b]
            self.k[b, :, s:s + n] = k_new[b, :, :n]
            self.v[b, :, s:s + n] = v_new[b, :, :n]
        self.lens += n_new


def _as_counts(n_new, B, T):
    arr = np.asarray(n_new)
    if arr.shape != (B,):
        raise ValueError(f"n_new: got shape {arr.shape}, want ({B},)")
    if B > 0 and arr.dtype.kind not in "iu":
        raise TypeError(f"n_new: integer counts expected, got {arr.dtype}")
    arr = arr.astype(np.int64)
    if (arr < 0).any() or (arr > T).any():
        raise ValueError(f"n_new: counts must be between 0 and T={T}, got {arr.tolist()}")
    return arr


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q: got shape {q.shape}, want (B, Hq, T, d)")
    B, Hq, T, d = q.shape
    if B != cache.batch or d != cache.head_dim:
        raise ValueError(f"q: got shape {q.shape}, cache has batch {cache.batch} and head_dim {cache.head_dim}")
    if Hq % cache.kv_heads != 0:
        raise ValueError(f"q: {Hq} query heads can't be split over {cache.kv_heads} KV heads")
    n_new = _as_counts(n_new, B, T)
    if (n_new > cache.lens).any():
        raise ValueError(f"n_new: {n_new.tolist()} exceeds tokens in cache {cache.lens.tolist()}")

    out = np.zeros(q.shape, dtype=q.dtype)
    S = int(cache.lens.max()) if B else 0
    if S == 0 or T == 0:
        return out

    # mask[b, t, j]: query t of row b may look at key j
    qpos = (cache.lens - n_new)[:, None] + np.arange(T)[None, :]
    j = np.arange(S)
    mask = (j[None, None, :] <= qpos[:, :, None]) & (j[None, None, :] < cache.lens[:, None, None])
    mask &= (np.arange(T)[None, :] < n_new[:, None])[:, :, None]
    any_key = mask.any(-1, keepdims=True)

    for h in range(Hq):
        kv = h % cache.kv_heads
        K = cache.k[:, kv, :S]                      # [B, S, d]
        V = cache.v[:, kv, :S]
        s = q[:, h] @ K.transpose(0, 2, 1) / np.sqrt(d)   # [B, T, S]
        s = np.where(mask, s, -np.inf)
        s_max = np.where(any_key, s.max(-1, keepdims=True), 0.0)
        e = np.exp(s - s_max)
        total = np.where(any_key, e.sum(-1, keepdims=True), 1.0)
        out[:, h] = (e / total) @ V
    return out
