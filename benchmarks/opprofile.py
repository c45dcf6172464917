"""Where a decode step's time goes, op by op, for the NumPy reference and the PyTorch port.

PyTorch: ``torch.profiler`` (self CPU time per ``aten`` op, grouped by input shapes).
NumPy has no op profiler, so ``profile_numpy`` lends the cache an ndarray subclass
whose ``__array_ufunc__``/``__array_function__`` time every NumPy operation that
touches the cache's K/V or anything computed from them (``matmul`` is a ufunc, so
``@`` is seen; so are ``where``, ``exp``, reductions, in-place ``/=``). Operands are
unwrapped before the real call, so nothing is counted twice. What the subclass
does not see (validation, building the mask from ``lens``, slicing, Python) is
reported as ``other``: the step's wall time less the ops'.

Both return a list of ``(op, seconds per step, operand shapes or None)``, largest
first, ``other`` last; ``breakdown`` sorts them into the two products and the rest.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np


class _Timed(np.ndarray):
    """An ndarray view that times the NumPy operations it takes part in (into ``_Timed.acc``)."""

    acc: dict[tuple, float] = defaultdict(float)

    @staticmethod
    def _plain(x):
        if isinstance(x, _Timed):
            return x.view(np.ndarray)
        if isinstance(x, (list, tuple)):
            return type(x)(_Timed._plain(y) for y in x)
        return x

    @staticmethod
    def _wrap(x):
        if type(x) is np.ndarray:
            return x.view(_Timed)
        if isinstance(x, tuple):
            return tuple(_Timed._wrap(y) for y in x)
        return x

    @staticmethod
    def _label(name: str, arrays) -> tuple:
        if name == "matmul":
            return name, tuple(tuple(a.shape) for a in arrays if isinstance(a, np.ndarray))
        return name, None

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = self._plain(inputs)
        if out is not None:
            kwargs["out"] = self._plain(out)
        start = time.perf_counter()
        result = getattr(ufunc, method)(*plain, **kwargs)
        elapsed = time.perf_counter() - start
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        _Timed.acc[self._label(name, plain)] += elapsed
        if out is not None:
            return out[0] if len(out) == 1 else out
        return self._wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        plain_args, plain_kwargs = self._plain(args), {k: self._plain(v) for k, v in kwargs.items()}
        start = time.perf_counter()
        result = func(*plain_args, **plain_kwargs)
        _Timed.acc[(func.__name__, None)] += time.perf_counter() - start
        return self._wrap(result)


def profile_numpy(step: Callable[[], object], cache, calls: int = 5) -> list[tuple]:
    """Op-by-op seconds of the fastest of ``calls`` calls of ``step`` (a NumPy decode step over ``cache``).

    ``cache.k``/``cache.v`` are replaced by timed views of the same memory for the
    duration and restored after. Returns ``(op, seconds, shapes)`` triples.
    """
    k, v = cache.k, cache.v
    cache.k, cache.v = k.view(_Timed), v.view(_Timed)
    best = (math.inf, {})
    try:
        step()  # warm
        for _ in range(calls):
            _Timed.acc = defaultdict(float)
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
            if wall < best[0]:
                best = (wall, dict(_Timed.acc))
    finally:
        cache.k, cache.v = k, v
    wall, acc = best
    ops = sorted(((name, t, shapes) for (name, shapes), t in acc.items()), key=lambda p: -p[1])
    return ops + [("other", max(0.0, wall - sum(t for _, t, _ in ops)), None)]


@contextlib.contextmanager
def _native_stderr_silenced():
    """Send file descriptor 2 to /dev/null for the block (the profiler's native start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_torch(step: Callable[[], object], calls: int = 5) -> list[tuple]:
    """Self CPU seconds of each ``aten`` op (grouped by input shapes) in the fastest of ``calls`` calls of ``step``.

    ``other`` is that call's wall time less the ops' self time (Python, dispatch).
    """
    from torch.profiler import ProfilerActivity, profile

    step()  # warm
    best = (math.inf, None)
    for _ in range(calls):
        with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
        if wall < best[0]:
            best = (wall, prof)
    wall, prof = best
    ops: dict[tuple, float] = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        seconds = event.self_cpu_time_total / 1e6
        if seconds <= 0:
            continue
        shapes = None
        if event.key in ("aten::bmm", "aten::mm") and event.input_shapes:
            shapes = tuple(tuple(s) for s in event.input_shapes[:2])
        ops[(event.key, shapes)] += seconds
    ranked = sorted(((name, t, shapes) for (name, shapes), t in ops.items()), key=lambda p: -p[1])
    return ranked + [("other", max(0.0, wall - sum(ops.values())), None)]


def breakdown(ops: list[tuple], live: int) -> dict[str, float]:
    """Seconds per step in four parts: ``qk`` (the scores product, contracting over d),
    ``pv`` (the weights-times-V product, contracting over the ``live`` keys),
    ``passes`` (every other timed op: scale, mask, softmax, copies) and ``other``
    (untimed: Python, validation, building the mask from ``lens``).
    """
    parts = {"qk": 0.0, "pv": 0.0, "passes": 0.0, "other": 0.0}
    for name, seconds, shapes in ops:
        if name == "other":
            parts["other"] += seconds
        elif shapes and len(shapes) == 2 and shapes[0]:
            parts["pv" if shapes[0][-1] == live else "qk"] += seconds
        else:
            parts["passes"] += seconds
    return parts
