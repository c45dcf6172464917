"""The harness that runs INSIDE the sandboxed child, next to a submission.

Self-contained on purpose: it imports NumPy (and torch for a port) and nothing
of the kit, and is run by path: ``python -I -S harness.py JOBDIR SITEDIR...``.
It reads trial inputs from ``JOBDIR/job.json`` + ``JOBDIR/data.npy``, drives the
submission's ``kv_cache`` (and ``kv_cache_torch``) through them, takes the
measurements the parent asked for, and writes ``results.json`` and
``out.npy``/``out_torch.npy``. It judges nothing: every comparison with the
oracle happens in the parent, which loads these files with
``allow_pickle=False`` and trusts none of them.

The same functions run in-process for the notebook's and the learner's checks
(``run_trials``), where the code under test is the learner's own.
"""
from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
import traceback

# Taken before the submission is imported, so a later monkeypatch is visible.
_ORIGINAL = {
    "tracemalloc.start": tracemalloc.start,
    "tracemalloc.get_traced_memory": tracemalloc.get_traced_memory,
    "tracemalloc.reset_peak": tracemalloc.reset_peak,
    "tracemalloc.stop": tracemalloc.stop,
    "time.perf_counter": time.perf_counter,
}

MESSAGE_LIMIT = 300


def _error(exc: BaseException) -> dict:
    """An exception as data: its type, whether it is a ValueError/TypeError, a short message."""
    try:
        message = str(exc)[:MESSAGE_LIMIT]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = "(the exception's message could not be read)"
    return {"type": str(type(exc).__name__)[:80], "value_error": isinstance(exc, (ValueError, TypeError)),
            "message": message}


def load_job(job_dir: str):
    """``(spec, data)``: the job's JSON and its flat float64 input array."""
    import numpy as np

    with open(os.path.join(job_dir, "job.json")) as f:
        spec = json.load(f)
    data = np.load(os.path.join(job_dir, "data.npy"), allow_pickle=False)
    return spec, data


def _array(data, ref, dtype):
    offset, shape = ref
    size = 1
    for n in shape:
        size *= n
    return data[offset:offset + size].reshape(shape).astype(dtype)


def run_trials(module, trials: list, data, to_backend=None, from_backend=None):
    """Run every trial through ``module.KVCache``/``module.gqa_attention``.

    ``to_backend(array, dtype_name)`` converts inputs (torch for a port); the
    default keeps NumPy. Returns ``(records, outputs)``: per trial a list of
    per-step dicts, and the list of float64 NumPy outputs whose shape matched q.
    """
    import numpy as np

    to_backend = to_backend or (lambda a, dtype: np.dtype(dtype) if a is None else a)
    from_backend = from_backend or (lambda x: x)
    records, outputs = [], []
    for trial in trials:
        dtype = trial["dtype"]
        steps = []
        records.append(steps)
        try:
            cache = module.KVCache(trial["B"], trial["Hkv"], trial["max_len"], trial["d"],
                                   dtype=to_backend(None, dtype))
        except BaseException as exc:  # noqa: BLE001 - any failure is the submission's
            steps.append({"stage": "init", "error": _error(exc)})
            continue
        buffers = (getattr(cache, "k", None), getattr(cache, "v", None))
        for step in trial["steps"]:
            k = to_backend(_array(data, step["k"], dtype), dtype)
            v = to_backend(_array(data, step["v"], dtype), dtype)
            q = to_backend(_array(data, step["q"], dtype), dtype)
            n_new = to_backend(np.asarray(step["n_new"], dtype=np.int64), "int64")
            try:
                cache.append(k, v, n_new)
            except BaseException as exc:  # noqa: BLE001
                steps.append({"stage": "append", "error": _error(exc)})
                break  # the cache no longer matches the history: stop this trial
            # Buffers must stay the objects allocated at construction, in every
            # hidden trial (not only in the probes, whose shapes code could detect).
            moved = getattr(cache, "k", None) is not buffers[0] or getattr(cache, "v", None) is not buffers[1]
            try:
                out = from_backend(module.gqa_attention(q, cache, n_new))
                arr = np.asarray(out)
            except BaseException as exc:  # noqa: BLE001
                steps.append({"stage": "attention", "error": _error(exc)})
                continue
            record = {"stage": "ok", "type": str(type(out).__name__)[:80], "shape": list(arr.shape),
                      "dtype": str(arr.dtype)[:40], "buffers_moved": bool(moved)}
            expected_shape = [trial["B"], trial["Hkv"] * trial["G"], step["q"][1][2], trial["d"]]
            if list(arr.shape) == expected_shape and arr.dtype.kind in "fiu":
                outputs.append(arr.astype(np.float64).ravel())
                record["stored"] = True
            steps.append(record)
    return records, outputs


# ---------------------------------------------------------------- probes (NumPy)

def _traced(fn):
    """``(result, peak bytes allocated during fn)`` measured with tracemalloc.

    Tracing runs only around the measured call: always-on tracing slows every
    trial several times over. Code that asks ``tracemalloc`` whether it is
    measured is caught by the source scan (and by the tamper snapshot if it
    patches it), not by this function.
    """
    _ORIGINAL["tracemalloc.start"]()
    _ORIGINAL["tracemalloc.reset_peak"]()
    base = _ORIGINAL["tracemalloc.get_traced_memory"]()[0]
    try:
        result = fn()
        peak = _ORIGINAL["tracemalloc.get_traced_memory"]()[1]
    finally:
        _ORIGINAL["tracemalloc.stop"]()
    return result, peak - base


def _shapes(seed: int, key: int):
    """A generator for one probe's sizes, drawn from the job's seed (no fixed shape to detect)."""
    import numpy as np

    return np.random.default_rng([seed, key])


def probe_in_place(mod, seed: int = 0):
    """Buffer identity and bytes allocated by a one-token append at growing lengths.

    Each length gets a fresh cache filled by one full prefill and then decode
    steps only, so a submission that refuses chunked prefill is still measured.
    """
    import numpy as np

    rng = _shapes(seed, 10)
    B, Hkv, d = int(rng.integers(1, 4)), int(rng.choice([1, 2, 4])), int(rng.choice([32, 48, 64]))
    max_len = int(rng.integers(3200, 5000))
    allocs, same, shares = [], True, True
    one = rng.standard_normal((B, Hkv, 1, d)).astype(np.float32)
    ones = np.ones(B, dtype=np.int64)
    for target in (64, 1024, 3072):
        cache = mod.KVCache(B, Hkv, max_len, d, dtype=np.float32)
        k0, v0 = cache.k, cache.v
        chunk = rng.standard_normal((B, Hkv, target, d)).astype(np.float32)
        cache.append(chunk, chunk, np.full(B, target))
        cache.append(one, one, ones)  # warm-up: first-call costs are not growth
        _, peak = _traced(lambda: cache.append(one, one, ones))
        allocs.append([target + 2, int(peak), int(2 * B * Hkv * (target + 2) * d * 4)])
        same = same and cache.k is k0 and cache.v is v0
        shares = shares and bool(np.shares_memory(np.asarray(cache.k), k0))
    return {"same_objects": same, "shares_memory": shares, "allocs": allocs}


def probe_repeat(mod, seed: int = 0):
    """Peak bytes allocated by one decode step at G = 8, against the live K/V bytes."""
    import numpy as np

    rng = _shapes(seed, 11)
    B, Hkv, G, S, d = int(rng.integers(1, 4)), int(rng.choice([1, 2])), 8, int(rng.integers(700, 1400)), 64
    cache = mod.KVCache(B, Hkv, S + int(rng.integers(0, 64)), d, dtype=np.float32)
    kv = rng.standard_normal((B, Hkv, S, d)).astype(np.float32)
    cache.append(kv[:, :, :-1], kv[:, :, :-1], np.full(B, S - 1))
    cache.append(kv[:, :, -1:], kv[:, :, -1:], np.ones(B, dtype=np.int64))
    q = rng.standard_normal((B, Hkv * G, 1, d)).astype(np.float32)
    _, peak = _traced(lambda: mod.gqa_attention(q, cache, np.ones(B, dtype=np.int64)))
    return {"peak_bytes": int(peak), "live_kv_bytes": int(2 * B * Hkv * S * d * 4), "G": G}


def probe_overflow(mod):
    """An append that overflows one row: does it raise, and does anything change?"""
    import numpy as np

    outcomes = []
    rng = np.random.default_rng(2)
    for before, n_new in (([3, 6], [2, 3]), ([7, 1], [2, 2])):
        B, Hkv, max_len, d, T = 2, 1, 8, 4, 4
        cache = mod.KVCache(B, Hkv, max_len, d, dtype=np.float64)
        for b, n in enumerate(before):
            chunk = rng.standard_normal((B, Hkv, n, d))
            counts = np.zeros(B, dtype=np.int64)
            counts[b] = n
            cache.append(chunk, chunk, counts)
        k_before, v_before = np.array(cache.k, copy=True), np.array(cache.v, copy=True)
        lens_before = np.asarray(cache.lens).tolist()
        new = rng.standard_normal((B, Hkv, T, d))
        outcome = {"lens_before": lens_before, "n_new": n_new, "raised": None}
        try:
            cache.append(new, new, np.asarray(n_new, dtype=np.int64))
        except BaseException as exc:  # noqa: BLE001
            outcome["raised"] = _error(exc)
        outcome["lens_after"] = np.asarray(cache.lens).tolist()
        outcome["data_changed"] = not (np.array_equal(np.asarray(cache.k), k_before)
                                       and np.array_equal(np.asarray(cache.v), v_before))
        outcomes.append(outcome)
    return outcomes


def probe_scan(mod, seed: int = 0):
    """Seconds for one decode step at the same live length in a small and a large reservation."""
    import numpy as np

    rng = _shapes(seed, 13)
    # Long enough that the work, not the per-call cost of tracing, dominates both timings.
    B, Hkv, G, live, d = int(rng.integers(1, 4)), 2, 4, int(rng.integers(200, 400)), int(rng.choice([32, 64]))
    kv = rng.standard_normal((B, Hkv, live, d)).astype(np.float32)
    q = rng.standard_normal((B, Hkv * G, 1, d)).astype(np.float32)
    caches = {}
    for name, max_len in (("small", live), ("large", 32 * live)):
        cache = mod.KVCache(B, Hkv, max_len, d, dtype=np.float32)
        cache.append(kv, kv, np.full(B, live))
        caches[name] = cache
    one = np.ones(B, dtype=np.int64)
    clock = _ORIGINAL["time.perf_counter"]
    best = {"small": float("inf"), "large": float("inf")}
    for _ in range(9):  # interleaved, min of repeats: the machine is shared
        for name, cache in caches.items():
            start = clock()
            mod.gqa_attention(q, cache, one)
            best[name] = min(best[name], clock() - start)
    return {"small_s": best["small"], "large_s": best["large"], "reservation_ratio": 32, "live": live}


def probe_errors(mod):
    """Bad inputs: does each raise ValueError/TypeError, and does the message name the argument?"""
    import numpy as np

    cases = {}
    B, Hkv, d = 2, 2, 4

    def fresh():
        cache = mod.KVCache(B, Hkv, 8, d, dtype=np.float64)
        cache.append(np.ones((B, Hkv, 2, d)), np.ones((B, Hkv, 2, d)), np.array([2, 2]))
        return cache

    attempts = {
        "q_heads_not_multiple": ("gqa_attention", lambda c: mod.gqa_attention(np.ones((B, 3, 1, d)), c, np.array([1, 1]))),
        "q_wrong_head_dim": ("gqa_attention", lambda c: mod.gqa_attention(np.ones((B, 4, 1, d + 1)), c, np.array([1, 1]))),
        "n_new_wrong_length": ("append", lambda c: c.append(np.ones((B, Hkv, 1, d)), np.ones((B, Hkv, 1, d)), np.array([1, 1, 1]))),
        "n_new_above_T": ("append", lambda c: c.append(np.ones((B, Hkv, 1, d)), np.ones((B, Hkv, 1, d)), np.array([2, 1]))),
        "k_new_wrong_heads": ("append", lambda c: c.append(np.ones((B, Hkv + 1, 1, d)), np.ones((B, Hkv + 1, 1, d)), np.array([1, 1]))),
    }
    for name, (_, attempt) in attempts.items():
        try:
            cache = fresh()
            before = np.asarray(cache.lens).tolist()
        except BaseException as exc:  # noqa: BLE001
            cases[name] = {"raised": _error(exc), "setup_failed": True}
            continue
        try:
            attempt(cache)
            cases[name] = {"raised": None}
        except BaseException as exc:  # noqa: BLE001
            cases[name] = {"raised": _error(exc)}
        cases[name]["lens_changed"] = np.asarray(cache.lens).tolist() != before
    return cases


def probe_cost(calls):
    """What the submission's ``cost.py`` returns for each ``[label, function, args]`` call."""
    if not os.path.exists("cost.py"):
        return None
    import cost

    answers = {}
    for label, name, args in calls:
        try:
            value = getattr(cost, name)(*args)
            answers[label] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)[:80]
        except BaseException as exc:  # noqa: BLE001
            answers[label] = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    return answers


# ---------------------------------------------------------------- torch port

def torch_backend(torch):
    """Converters for ``run_trials``: NumPy inputs to CPU tensors and back."""
    import numpy as np

    def to_backend(array, dtype):
        if array is None:
            return getattr(torch, dtype)
        return torch.from_numpy(np.ascontiguousarray(array))

    def from_backend(out):
        if isinstance(out, torch.Tensor):
            return out.detach().cpu().numpy()
        return out

    return to_backend, from_backend


def probe_torch_ops(mod, torch):
    """The ops a one-token append and a decode step run, watched with a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            returns = func._schema.returns
            is_view = bool(returns) and returns[0].alias_info is not None
            numel = out.numel() if isinstance(out, torch.Tensor) else 0
            self.ops.append([str(func.overloadpacket.__name__), int(numel), is_view])
            return out

    B, Hkv, G, S, d = 2, 2, 4, 256, 32
    cache = mod.KVCache(B, Hkv, S, d, dtype=torch.float32)
    k0, v0 = cache.k, cache.v
    ptr = (k0.data_ptr(), v0.data_ptr())
    kv = torch.randn(B, Hkv, S - 1, d)
    cache.append(kv, kv, torch.full((B,), S - 1))
    one = torch.randn(B, Hkv, 1, d)
    with Recorder() as append_ops:
        cache.append(one, one, torch.ones(B, dtype=torch.int64))
    q = torch.randn(B, Hkv * G, 1, d)
    with Recorder() as attention_ops:
        mod.gqa_attention(q, cache, torch.ones(B, dtype=torch.int64))
    return {"append_ops": append_ops.ops, "attention_ops": attention_ops.ops,
            "same_objects": cache.k is k0 and cache.v is v0,
            "same_storage": (cache.k.data_ptr(), cache.v.data_ptr()) == ptr,
            "live_k_numel": B * Hkv * S * d, "G": G}


# ---------------------------------------------------------------- main

def _snapshot() -> dict:
    """Every function the harness and its meters rely on, taken before the submission is imported:
    the harness's own, ``_ORIGINAL``'s, and those of tracemalloc, time, builtins, json, os, sys, NumPy."""
    import builtins

    snap = {f"harness.{k}": v for k, v in globals().items() if callable(v)}
    snap.update({f"_ORIGINAL[{k}]": v for k, v in _ORIGINAL.items()})
    for module in (tracemalloc, time, builtins, json, os, sys, sys.modules.get("numpy")):
        if module is not None:
            snap.update({f"{module.__name__}.{k}": v for k, v in vars(module).items() if callable(v)})
    return snap


def _tampered(snapshot: dict) -> list:
    """Names of harness tools that no longer are what they were before the import."""
    import builtins

    current = {f"harness.{k}": v for k, v in globals().items()}
    current.update({f"_ORIGINAL[{k}]": v for k, v in _ORIGINAL.items()})
    for module in (tracemalloc, time, builtins, json, os, sys, sys.modules.get("numpy")):
        if module is not None:
            current.update({f"{module.__name__}.{k}": v for k, v in vars(module).items()})
    return sorted(name for name, fn in snapshot.items() if current.get(name) is not fn)


def _section(results: dict, name: str, fn, *args):
    try:
        results[name] = fn(*args)
    except BaseException as exc:  # noqa: BLE001
        results[name] = {"error": _error(exc), "trace": traceback.format_exc()[-600:]}


def main(argv: list) -> int:
    job_dir = os.path.abspath(argv[0])
    sys.path[:0] = [os.getcwd()] + list(argv[1:])  # the submission first, then NumPy/torch
    import numpy as np

    spec, data = load_job(job_dir)
    results = {"numpy": {}, "torch": None}
    out_path = os.path.join(job_dir, "results.json")

    def write():
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f)
        os.replace(tmp, out_path)

    snapshot, check, tampered = _snapshot(), _tampered, set()  # bound before the submission can touch them
    seed = int(spec.get("probe_seed", 0))
    try:
        import kv_cache as mod
    except BaseException as exc:  # noqa: BLE001
        results["numpy"]["import"] = _error(exc)
        results["numpy"]["import"]["trace"] = traceback.format_exc()[-600:]
        write()
        _finish()
    results["numpy"]["import"] = None

    records, outputs = run_trials(mod, spec["trials"], data)
    results["numpy"]["records"] = records
    flat = np.concatenate(outputs) if outputs else np.zeros(0)
    np.save(os.path.join(job_dir, "out.npy"), flat, allow_pickle=False)
    write()  # correctness first: a probe that hangs must not lose it

    for name, fn in (("in_place", probe_in_place), ("repeat", probe_repeat),
                     ("overflow", probe_overflow), ("scan", probe_scan), ("errors", probe_errors)):
        if name in spec.get("probes", []):
            args = (mod, seed) if name in ("in_place", "repeat", "scan") else (mod,)
            _section(results["numpy"], name, fn, *args)
            tampered.update(check(snapshot))
            write()

    if spec.get("cost_calls"):
        _section(results, "cost", probe_cost, spec["cost_calls"])
        write()

    if spec.get("torch"):
        results["torch"] = {}
        try:
            import torch
            torch.set_num_threads(1)
            import kv_cache_torch as tmod
        except BaseException as exc:  # noqa: BLE001
            results["torch"]["import"] = _error(exc)
        else:
            results["torch"]["import"] = None
            to_backend, from_backend = torch_backend(torch)
            trecords, toutputs = run_trials(tmod, spec["trials"], data, to_backend, from_backend)
            results["torch"]["records"] = trecords
            tflat = np.concatenate(toutputs) if toutputs else np.zeros(0)
            np.save(os.path.join(job_dir, "out_torch.npy"), tflat, allow_pickle=False)
            write()
            _section(results["torch"], "ops", probe_torch_ops, tmod, torch)
            _section(results["torch"], "overflow", probe_overflow_torch, tmod, torch)
    results["tampered"] = sorted(tampered.union(check(snapshot)))
    results["done"] = True
    write()
    _finish()


def _finish() -> None:
    """End the child now: no atexit handler, finalizer or ``__del__`` of the submission runs after
    the last write (they could rewrite what the parent is about to read)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: exit regardless
            pass
    os._exit(0)


def numpy_facing(mod, torch):
    """The port ``mod`` behind the NumPy contract (CPU): NumPy arrays in and out.

    Lets every NumPy probe and check drive a PyTorch port unchanged. Returns a
    namespace with ``KVCache`` and ``gqa_attention``.
    """
    import types

    import numpy as np

    class KVCache:
        def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
            self.port = mod.KVCache(batch, kv_heads, max_len, head_dim, dtype=getattr(torch, np.dtype(dtype).name))

        k = property(lambda self: self.port.k.numpy())
        v = property(lambda self: self.port.v.numpy())
        lens = property(lambda self: self.port.lens.numpy())

        def append(self, k_new, v_new, n_new):
            self.port.append(torch.from_numpy(np.ascontiguousarray(k_new)),
                             torch.from_numpy(np.ascontiguousarray(v_new)), torch.from_numpy(np.asarray(n_new)))

    def gqa_attention(q, cache, n_new):
        out = mod.gqa_attention(torch.from_numpy(np.ascontiguousarray(q)), cache.port,
                                torch.from_numpy(np.asarray(n_new)))
        return out.numpy() if isinstance(out, torch.Tensor) else out

    return types.SimpleNamespace(KVCache=KVCache, gqa_attention=gqa_attention)


def probe_overflow_torch(mod, torch):
    """``probe_overflow`` for the port, through ``numpy_facing``."""
    return probe_overflow(numpy_facing(mod, torch))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
