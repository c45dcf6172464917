"""Figure 1: growing the cache by concatenation against writing into a preallocated one.

A scaled-down model (``SMALL_MODEL``: 2 layers, 2 KV heads, head_dim 64,
float32, one row: 2,048 B of K and V per token, against Llama 3.1 8B's 131,072 B
in bf16) generates ``n`` tokens one at a time; each step appends one token's K
and V to every layer's cache. Two caches take exactly the same inputs:

- ``ConcatKVCache``, the ``concat_growth`` mistake on purpose:
  ``self.k = np.concatenate([self.k, k_new], axis=2)``;
- ``solutions.kv_cache.KVCache``, allocated once for ``n`` tokens, written in place.

Only the cache work is timed: attention is the same in both and, reading every
live key at every step, would be quadratic in both.

Bytes copied are measured, not computed from shapes: ``tracemalloc`` sees every
NumPy data allocation (NumPy reports them to it), and each ``np.concatenate``
allocates the grown array. Step ``i`` (from 0) allocates ``i + 1`` tokens: the
``i`` already there, copied, and the new one, which a preallocated cache writes
too. The formula (``solutions.cost.concat_bytes_copied``) counts the copy of the
existing tokens, ``0 + 1 + ... + (n - 1)`` tokens, so the measured figure is
``sum(bytes allocated by each np.concatenate) - sum(bytes of the tokens appended)``;
both parts come from the run (the second from the arrays handed to ``append``).
The allocation sum also holds each new array's small header (about 200 B a call),
which is why it is not exact to the byte.
"""
from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from solutions import cost
from solutions.kv_cache import KVCache

SMALL_MODEL = dict(layers=2, kv_heads=2, head_dim=64, dtype=np.float32, batch=1)


def bytes_per_token(model: dict = SMALL_MODEL) -> int:
    """K and V bytes one token adds across all layers of ``model`` (2,048 B for ``SMALL_MODEL``)."""
    return cost.kv_bytes_per_token(model["layers"], model["kv_heads"], model["head_dim"],
                                   np.dtype(model["dtype"]).itemsize) * model["batch"]


class ConcatKVCache:
    """A cache that grows by concatenation: the ``concat_growth`` mistake, on purpose.

    Attributes:
        k, v: ``[batch, kv_heads, L, head_dim]`` arrays, replaced at every append
            by a new array one step longer (``L`` = tokens so far).

    Every row takes the same number of tokens per call (decode of equal rows), so
    ``lens`` is just ``L``.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int, dtype=np.float32):
        self.k = np.zeros((batch, kv_heads, 0, head_dim), dtype=dtype)
        self.v = np.zeros((batch, kv_heads, 0, head_dim), dtype=dtype)

    @property
    def lens(self) -> np.ndarray:
        """int64 ``[batch]``: tokens in each row (all equal here)."""
        return np.full(self.k.shape[0], self.k.shape[2], dtype=np.int64)

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Grow K and V by ``k_new``/``v_new`` (``[batch, kv_heads, T, head_dim]``), copying all of both."""
        if k_new.shape[:2] != self.k.shape[:2] or k_new.shape[3] != self.k.shape[3] or v_new.shape != k_new.shape:
            raise ValueError(f"k_new/v_new must be [B, Hkv, T, d] = {list(self.k.shape[:2])} + [T, "
                             f"{self.k.shape[3]}], got {list(k_new.shape)} and {list(v_new.shape)}")
        self.k = self._grow(self.k, k_new)
        self.v = self._grow(self.v, v_new)

    def _grow(self, old: np.ndarray, new: np.ndarray) -> np.ndarray:
        """The concatenation: a new ``[B, Hkv, L + T, d]`` array holding ``old`` then ``new``."""
        return np.concatenate([old, new], axis=2)


class _TracedConcatKVCache(ConcatKVCache):
    """``ConcatKVCache`` that measures, with ``tracemalloc``, what each concatenation allocates.

    ``tracemalloc`` must be tracing. Attributes (bytes, summed over every call):
        allocated: the bytes each ``np.concatenate`` allocated (peak traced memory
            during the call minus traced memory before it).
        appended: the bytes of the new tokens handed in (``new.nbytes``).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocated = 0
        self.appended = 0

    def _grow(self, old, new):
        parts = [old, new]
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        grown = np.concatenate(parts, axis=2)
        self.allocated += tracemalloc.get_traced_memory()[1] - before
        self.appended += new.nbytes
        return grown


def _token(model: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One token's K and V for every layer: two ``[batch, kv_heads, 1, head_dim]`` arrays."""
    rng = np.random.default_rng(seed)
    shape = (model["batch"], model["kv_heads"], 1, model["head_dim"])
    return (rng.standard_normal(shape).astype(model["dtype"]),
            rng.standard_normal(shape).astype(model["dtype"]))


def measure_bytes_copied(n: int, model: dict = SMALL_MODEL, seed: int = 0) -> dict:
    """Generate ``n`` tokens with ``ConcatKVCache`` under ``tracemalloc``; bytes copied after each step.

    Args:
        n: tokens generated (steps).
        model: the scaled-down model (``SMALL_MODEL``).

    Returns:
        dict with ``measured`` (list of ``n`` ints: bytes of existing tokens copied,
        cumulative after each step, as defined in the module docstring),
        ``allocated`` (cumulative bytes the concatenations allocated, ``n`` ints),
        ``formula`` (``solutions.cost.concat_bytes_copied(step + 1, bytes_per_token)``,
        ``n`` ints) and ``bytes_per_token``.
    """
    k_tok, v_tok = _token(model, seed)
    caches = [_TracedConcatKVCache(model["batch"], model["kv_heads"], model["head_dim"], model["dtype"])
              for _ in range(model["layers"])]
    per_token = bytes_per_token(model)
    measured, allocated, formula = [], [], []
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        for step in range(n):
            for c in caches:
                c.append(k_tok, v_tok)
            alloc = sum(c.allocated for c in caches)
            allocated.append(alloc)
            measured.append(alloc - sum(c.appended for c in caches))
            formula.append(cost.concat_bytes_copied(step + 1, per_token))
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return {"measured": measured, "allocated": allocated, "formula": formula, "bytes_per_token": per_token}


@dataclass
class GrowthTimes:
    """Cumulative seconds to generate ``1 .. n`` tokens, fastest of the rounds at each n.

    Attributes:
        concat, prealloc: lists of ``n`` floats; element ``i`` is the seconds the
            first ``i + 1`` steps took (min over rounds, taken per step count).
    """

    concat: list[float]
    prealloc: list[float]


def _generate(cache_kind: str, n: int, model: dict, k_tok: np.ndarray, v_tok: np.ndarray) -> list[float]:
    """Run ``n`` steps with one kind of cache; cumulative seconds after each step."""
    B, H, d, dtype = model["batch"], model["kv_heads"], model["head_dim"], model["dtype"]
    one = np.ones(B, dtype=np.int64)
    if cache_kind == "concat":
        caches = [ConcatKVCache(B, H, d, dtype) for _ in range(model["layers"])]
        steps = [lambda c=c: c.append(k_tok, v_tok) for c in caches]
    else:
        caches = [KVCache(B, H, n, d, dtype) for _ in range(model["layers"])]
        steps = [lambda c=c: c.append(k_tok, v_tok, one) for c in caches]
    out = []
    clock = time.perf_counter
    start = clock()
    for _ in range(n):
        for step in steps:
            step()
        out.append(clock() - start)
    return out


def time_growth(n: int, rounds: int, model: dict = SMALL_MODEL, seed: int = 0) -> GrowthTimes:
    """Time generating ``n`` tokens with each cache, interleaved (concat, prealloc, concat, ...).

    Returns cumulative seconds per step count, the minimum over ``rounds`` at each count
    (a cache allocation is part of the preallocated run, as it would be in a server).
    """
    k_tok, v_tok = _token(model, seed)
    best = {"concat": [float("inf")] * n, "prealloc": [float("inf")] * n}
    for _ in range(rounds):
        for kind in ("concat", "prealloc"):
            best[kind] = [min(a, b) for a, b in zip(best[kind], _generate(kind, n, model, k_tok, v_tok))]
    return GrowthTimes(best["concat"], best["prealloc"])


def growth_exponent(ns: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(n): about 2 for quadratic, 1 for linear."""
    x, y = np.log(np.asarray(ns, float)), np.log(np.asarray(seconds, float))
    return float(np.polyfit(x, y, 1)[0])


def concat_figures(n: int, rounds: int, seed: int = 0) -> dict:
    """Figure 1, for ``n`` tokens of ``SMALL_MODEL``.

    Returns a dict (bytes are ints, seconds floats):
        ``concat_bytes_measured``/``concat_bytes_formula``: bytes of existing tokens
        copied over ``n`` steps, measured with tracemalloc / from
        ``solutions.cost.concat_bytes_copied``; ``concat_bytes_ratio`` their ratio;
        ``concat_time_ratio``: concatenating over preallocated seconds at ``n``;
        ``concat_exponent``/``prealloc_exponent``: log-log slopes of time against
        n over the upper three quarters of the run; and ``series`` (per-step curves
        for the plot).
    """
    traced = measure_bytes_copied(n, seed=seed)
    times = time_growth(n, rounds, seed=seed)
    ns = list(range(1, n + 1))
    upper = [i for i in range(n) if ns[i] >= n // 4]
    pick = upper[:: max(1, len(upper) // 64)]
    measured, formula = traced["measured"][-1], traced["formula"][-1]
    return {
        "concat_n": n,
        "concat_bytes_per_token": traced["bytes_per_token"],
        "concat_bytes_measured": measured,
        "concat_bytes_formula": formula,
        "concat_bytes_ratio": measured / formula,
        "concat_bytes_allocated": traced["allocated"][-1],
        "concat_seconds": times.concat[-1],
        "prealloc_seconds": times.prealloc[-1],
        "concat_time_ratio": times.concat[-1] / times.prealloc[-1],
        "concat_exponent": growth_exponent([ns[i] for i in pick], [times.concat[i] for i in pick]),
        "prealloc_exponent": growth_exponent([ns[i] for i in pick], [times.prealloc[i] for i in pick]),
        "concat_model": {k: (np.dtype(v).name if k == "dtype" else v) for k, v in SMALL_MODEL.items()},
        "series": {"n": ns, "bytes_measured": traced["measured"], "bytes_formula": traced["formula"],
                   "concat_seconds": times.concat, "prealloc_seconds": times.prealloc},
    }
