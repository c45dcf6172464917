# Hostile submission: forge_results.
#
# Repeats K/V (honestly Weak) and tries to rewrite the harness's answers in .kvkit/: from a
# thread that races the harness all run long, and from a finalizer at interpreter exit.
# Expected: every write under the job folder refused by the guard, the finalizer never run; Weak.
import json as _json
import os as _os
import threading as _threading
import time as _time
import weakref as _weakref

_JOB = _os.path.join(_os.getcwd(), ".kv" + "kit")


def _forge():
    try:
        with open(_os.path.join(_JOB, "results" + ".json"), "w") as f:
            _json.dump({"numpy": {"import": None}, "tampered": [], "done": True}, f)
    except OSError:
        pass
    try:
        _os.remove(_os.path.join(_JOB, "out.npy"))
    except OSError:
        pass


def _race():
    for _ in range(200):
        _forge()
        _time.sleep(0.01)


class _Anchor:
    pass


_anchor = _Anchor()
_weakref.finalize(_anchor, _forge)
_threading.Thread(target=_race, daemon=True).start()

import math

import numpy as np

NEG = -1e9  # "minus infinity" for masked scores


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        if batch < 0 or max_len < 0 or kv_heads <= 0 or head_dim <= 0:
            raise ValueError("batch/max_len must be >= 0 and kv_heads/head_dim > 0")
        self.max_len = max_len
        self.k = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.v = np.zeros((batch, kv_heads, max_len, head_dim), dtype)
        self.lens = np.zeros((batch,), np.int64)

    @property
    def shape(self):
        return self.k.shape

    def append(self, k_new, v_new, n_new):
        B, H, _, D = self.k.shape
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        if k_new.ndim != 4 or k_new.shape[:2] != (B, H) or k_new.shape[-1] != D:
            raise ValueError(f"k_new has shape {k_new.shape}, expected ({B}, {H}, T, {D})")
        if v_new.shape != k_new.shape:
            raise ValueError(f"v_new has shape {v_new.shape}, expected {k_new.shape}")
        n = check_n_new(n_new, B, k_new.shape[2])
        too_long = np.nonzero(self.lens + n > self.max_len)[0]
        if len(too_long):
            r = too_long[0]
            raise ValueError(f"row {r}: {self.lens[r]} + {n[r]} tokens exceeds max_len={self.max_len}")
        for r in range(B):
            self.k[r, :, self.lens[r]:self.lens[r] + n[r]] = k_new[r, :, :n[r]]
            self.v[r, :, self.lens[r]:self.lens[r] + n[r]] = v_new[r, :, :n[r]]
        self.lens += n


def check_n_new(n_new, B, T):
    n = np.asarray(n_new)
    if n.shape != (B,):
        raise ValueError(f"n_new has shape {n.shape}, expected ({B},)")
    if B and not np.issubdtype(n.dtype, np.integer):
        raise TypeError(f"n_new must be integer, got {n.dtype}")
    n = n.astype(np.int64)
    if ((n < 0) | (n > T)).any():
        raise ValueError(f"n_new={n.tolist()} must lie in [0, T={T}]")
    return n


def gqa_attention(q, cache, n_new):
    """Causal GQA for the T newest tokens of each row."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q has shape {q.shape}, expected (B, Hq, T, d)")
    B, Hq, T, D = q.shape
    Bc, Hkv, _, Dc = cache.k.shape
    if (B, D) != (Bc, Dc):
        raise ValueError(f"q has shape {q.shape} but cache is {cache.k.shape}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, not divisible by Hkv={Hkv}")
    n = check_n_new(n_new, B, T)
    if (n > cache.lens).any():
        raise ValueError(f"n_new={n.tolist()} more than cache.lens={cache.lens.tolist()}")
    S = int(cache.lens.max()) if B else 0
    out = np.zeros_like(q)
    if T == 0 or S == 0:
        return out

    # one KV head per query head so the shapes line up with q
    G = Hq // Hkv
    K = np.repeat(cache.k[:, :, :S], G, axis=1)   # [B, Hq, S, D]
    V = np.repeat(cache.v[:, :, :S], G, axis=1)

    att = q @ K.transpose(0, 1, 3, 2) / math.sqrt(D)   # [B, Hq, T, S]

    offset = (cache.lens - n)[:, None, None]          # absolute position of query 0
    qi = np.arange(T)[None, :, None]
    kj = np.arange(S)[None, None, :]
    allowed = (kj <= offset + qi) & (kj < cache.lens[:, None, None])   # [B, T, S]
    att = np.where(allowed[:, None], att, NEG)

    att = att - att.max(-1, keepdims=True)
    with np.errstate(under="ignore"):   # masked scores underflow to exactly 0
        p = np.exp(att)
    p /= p.sum(-1, keepdims=True)
    res = p @ V

    real = np.arange(T)[None, :] < n[:, None]          # [B, T]
    out[:] = np.where(real[:, None, :, None], res, 0.0)
    return out
