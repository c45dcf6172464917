"""The tasks a sandboxed process runs against a submission, and their answers as data.

Each task runs in a process forked from the zygote after the trusted imports;
it loads the submission's files by path under fixed module names (``kv_cache``,
``kv_cache_torch``, ``cost``), with the submission's folder appended *last* to
``sys.path`` (so no file of it can stand in for an installed module), runs, and
writes one frame to its answer pipe. It judges nothing: the parent compares
every output with its oracle and takes every measurement from the kernel.

Kinds:
* ``trials``: trials (outputs as one float64 blob); with ``checks``, also the
  bad inputs and the cost calls.
  The probes are trials too, run by the same code at realistic sizes, with
  marks between their calls where the parent takes the kernel's figures
  (:func:`mark`; the plan is ``grader.stages.probes``); the parent checks their last
  outputs against its own computation.

The same trial runner serves in-process checks (the notebook, the learner's
steps), where the code under test is the learner's own.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
import traceback

MESSAGE_LIMIT = 300
TAIL = 4  # tokens of K an append-only probe returns
_JOB: dict = {}


def _error(exc: BaseException) -> dict:
    """An exception as data: its type, whether it is a ValueError/TypeError, a short message."""
    try:
        message = str(exc)[:MESSAGE_LIMIT]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = "(the exception's message could not be read)"
    return {"type": str(type(exc).__name__)[:80], "value_error": isinstance(exc, (ValueError, TypeError)),
            "message": message}


# ---------------------------------------------------------------- loading the submission

def load_file(name: str, path: str):
    """Import the file at ``path`` as module ``name`` (registered in ``sys.modules`` first)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {os.path.basename(path)}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    loader = spec.loader
    try:
        loader.exec_module(loaded)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return loaded


def submission_on_path(workdir: str) -> None:
    """The submission's folder, last on the path: its files can import each other, never shadow."""
    if workdir not in sys.path:
        sys.path.append(workdir)


# ---------------------------------------------------------------- the trials

def _array(data, ref, dtype):
    """A view of ``[offset, shape]`` in the flat array of ``dtype`` (``data`` maps dtype names to flat arrays)."""
    import numpy as np

    offset, shape = ref
    size = 1
    for n in shape:
        size *= n
    return np.asarray(data[dtype][offset:offset + size]).reshape(shape)


def run_trials(module, trials: list, data, to_backend=None, from_backend=None, mark=None):
    """Run every trial through ``module.KVCache``/``module.gqa_attention``.

    ``trials`` is the job's list of trial dicts, ``data`` its flat float64 input
    array; ``to_backend(array, dtype_name)`` converts inputs (torch for a port),
    the default keeps NumPy. Returns ``(records, outputs)``: per trial a list of
    per-step dicts, and the float64 outputs whose shape matched q's.

    In the sandbox a probe's steps carry marks (``mark``), where the parent takes
    the kernel's figures: ``"mark"`` after the step's append, ``"mark_after"``
    after its attention, and one after the last step. A mark hands over what the
    step's ``"given"`` lists (its query ``q``, digest weights ``w``, the order
    ``perm`` in which the next appends take a pool's tokens), and sends the output of the measured calls since the mark
    before: a call's query arrives at its mark and its output leaves at the next,
    so the call's work lies between the two, whatever the process does.
    """
    import numpy as np

    to_backend = to_backend or (lambda a, dtype: np.dtype(dtype) if a is None else a)
    from_backend = from_backend or (lambda x: x)
    mark = mark or (lambda into=(), send=b"": None)
    records, outputs, alive = [], [], []
    given: dict = {}  # what the last marks handed over, by name
    pending = [b""]  # the output of the last measured call, sent at the next mark

    def take(step):
        """The step's mark: its given buffers made (and written) before it, filled after it."""
        into = []
        for name, shape in step.get("given", []):
            kind = np.float64 if name == "w" else np.int32 if name == "perm" else np.dtype(trial["dtype"])
            if name not in given or given[name].shape != tuple(shape) or given[name].dtype != kind:
                given[name] = np.empty(shape, dtype=kind)
                given[name].fill(0)  # its pages written now: the input's memory is not the call's
            into.append(given[name])
        mark(into, pending[0])
        pending[0] = b""

    for trial in trials:
        dtype = trial["dtype"]
        steps = []
        records.append(steps)
        try:
            cache = module.KVCache(trial["B"], trial["Hkv"], trial["max_len"], trial["d"],
                                   dtype=to_backend(None, dtype))
        except BaseException as exc:  # noqa: BLE001 - any failure is the submission's
            steps.append({"stage": "init", "error": _error(exc)})
            for rest in trial["steps"]:  # the marks its steps would have made: the parent counts them
                if rest.get("mark"):
                    take(rest)
                if rest.get("mark_after"):
                    mark((), b"")
            continue
        buffers = (getattr(cache, "k", None), getattr(cache, "v", None))
        for index, step in enumerate(trial["steps"]):
            k, v, q, T = _step_inputs(step, data, dtype, given)
            k, v = to_backend(k, dtype), to_backend(v, dtype)
            q = to_backend(q, dtype) if q is not None else None
            n_new = to_backend(np.asarray(step["n_new"], dtype=np.int64), "int64")
            if step.get("overflow"):
                # Past max_len: it must raise; the steps after it show whether anything changed.
                try:
                    cache.append(k, v, n_new)
                    steps.append({"stage": "overflow", "error": None})
                except BaseException as exc:  # noqa: BLE001
                    steps.append({"stage": "overflow", "error": _error(exc)})
                continue
            try:
                cache.append(k, v, n_new)
            except BaseException as exc:  # noqa: BLE001
                steps.append({"stage": "append", "error": _error(exc)})
                # The cache no longer matches the history: stop this trial, making the marks its steps would
                # have made (the parent counts them), each taking what it is given.
                for rest in trial["steps"][index:]:
                    if rest.get("mark"):
                        take(rest)
                    if rest.get("mark_after"):
                        mark((), b"")
                break
            del k, v
            if step.get("mark"):
                take(step)
            if step.get("q") == "go":  # the query the last mark handed over
                q = to_backend(given["q"], dtype)
            if q is None:  # an append alone (a probe's prefill): inside the contract, no attention
                steps.append({"stage": "appended"})
                continue
            # Identity explains a finding; it never decides one (the memory probes do).
            moved = getattr(cache, "k", None) is not buffers[0] or getattr(cache, "v", None) is not buffers[1]
            try:
                out = module.gqa_attention(q, cache, n_new)
            except BaseException as exc:  # noqa: BLE001
                steps.append({"stage": "attention", "error": _error(exc)})
                if step.get("mark_after"):
                    mark((), b"")
                continue
            try:
                arr = np.asarray(from_backend(out))
            except BaseException:  # noqa: BLE001 - it returned, without raising, what is no array: a wrong answer,
                arr = np.empty(0, dtype=object)  # never a refusal (that is raising in the call itself)
            if step.get("digest") and arr.ndim == 4 and arr.shape[0] == len(given.get("w", ())):
                # A sum of every row's output with weights given at the mark: small whatever the batch.
                arr = (given["w"].astype(arr.dtype) @ arr.reshape(arr.shape[0], -1)).reshape(1, *arr.shape[1:])
            if step.get("q") == "go":
                pending[0] = np.asarray(arr, dtype="<f8").tobytes() if arr.dtype.kind in "fiu" else b""
            if step.get("mark_after"):  # the attention call alone is the part before this mark
                mark((), pending[0])
                pending[0] = b""
            record = {"stage": "ok", "type": str(type(out).__name__)[:80], "shape": list(arr.shape)[:8],
                      "dtype": str(arr.dtype)[:40], "buffers_moved": bool(moved)}
            expected_shape = [1 if step.get("digest") else trial["B"], trial["Hkv"] * trial["G"], T, trial["d"]]
            if list(arr.shape) == expected_shape and arr.dtype.kind in "fiu":
                outputs.append(arr.astype(np.float64).ravel())
                record["stored"] = True
            steps.append(record)
        if trial.get("tail") and steps and steps[-1].get("stage") in ("ok", "appended"):
            # The last keys row 0 stored, sliced before any copy: what an append-only run answers.
            end = sum(int(s["n_new"][0]) for s in trial["steps"])
            stored = np.asarray(from_backend(cache.k[0:1, :, end - trial["tail"]:end]), dtype=np.float64)
            outputs.append(stored.ravel())
            steps.append({"stage": "tail", "stored": True})
        alive.append(cache)  # freed after the last mark: freeing is not part of any measured call
    mark((), pending[0])  # the end of the calls
    return records, outputs


def _step_inputs(step: dict, data, dtype, given=None):
    """``(k_new, v_new, q or None, T)`` of one step: views of the job's flat arrays, the same for every trial
    (``"pick": i``: token ``perm[i]`` of a pool, as ``[1, Hkv, 1, d]``, ``perm`` handed over at a mark).

    The arrays are copy-on-write maps of files the parent wrote (their pages
    are the parent's, so the sandbox's memory figure holds the cache, not the
    inputs), and hidden trials and probes alike get views of them.
    """
    if "pick" in step:  # token perm[i] of the trial's pool ([N, Hkv, d], token-major), perm given at a mark
        row = int(given["perm"][step["pick"]])
        k, v = _array(data, step["pool"][0], dtype)[row], _array(data, step["pool"][1], dtype)[row]
        return k[None, :, None], v[None, :, None], None, 1
    k, v = _array(data, step["k"], dtype), _array(data, step["v"], dtype)
    if step.get("attend") is False:
        return k, v, None, k.shape[2]
    if step.get("q") == "go":  # given at the step's mark (``run_trials``)
        return k, v, None, step["q_shape"][2]
    q = _array(data, step["q"], dtype)
    return k, v, q, q.shape[2]


def probe_overflow(mod):
    """Appends that overflow one row (first, then last): what is raised, and what changed.

    The state is ``lens`` and each row's live tokens; bytes past ``lens`` are
    not state, so they are reported apart (``past_lens_written``).
    """
    import numpy as np

    outcomes = []
    rng = np.random.default_rng(2)
    # One token for each row after a ragged prefill into empty rows, so that no call is a chunk after cached
    # tokens (a contract-abiding submission may refuse those, before or after its overflow check): the
    # last row overflows, then the first, each after a row that fits.
    for before, n_new in (([7, 8], [1, 1]), ([8, 7], [1, 1])):
        B, Hkv, max_len, d, T = 2, 1, 8, 4, max(n_new)
        cache = mod.KVCache(B, Hkv, max_len, d, dtype=np.float64)
        chunk = rng.standard_normal((B, Hkv, max(before), d))
        cache.append(chunk, chunk, np.asarray(before, dtype=np.int64))
        k_before, v_before = np.array(cache.k, copy=True), np.array(cache.v, copy=True)
        lens_before = np.asarray(cache.lens).tolist()
        new = rng.standard_normal((B, Hkv, T, d))
        outcome = {"lens_before": lens_before, "n_new": n_new, "raised": None}
        try:
            cache.append(new, new, np.asarray(n_new, dtype=np.int64))
        except BaseException as exc:  # noqa: BLE001
            outcome["raised"] = _error(exc)
        outcome["lens_after"] = np.asarray(cache.lens).tolist()
        k_after, v_after = np.asarray(cache.k), np.asarray(cache.v)
        live = past = False
        for b, n in enumerate(lens_before):
            live = live or not (np.array_equal(k_after[b, :, :n], k_before[b, :, :n])
                                and np.array_equal(v_after[b, :, :n], v_before[b, :, :n]))
            past = past or not (np.array_equal(k_after[b, :, n:], k_before[b, :, n:])
                                and np.array_equal(v_after[b, :, n:], v_before[b, :, n:]))
        outcome["live_changed"], outcome["past_lens_written"] = bool(live), bool(past)
        outcomes.append(outcome)
    return outcomes


def probe_errors(mod):
    """Bad inputs: does each raise ValueError/TypeError, and does ``lens`` stay as it was?"""
    import numpy as np

    cases = {}
    B, Hkv, d = 2, 2, 4

    def fresh():
        cache = mod.KVCache(B, Hkv, 8, d, dtype=np.float64)
        cache.append(np.ones((B, Hkv, 2, d)), np.ones((B, Hkv, 2, d)), np.array([2, 2]))
        return cache

    attempts = {
        "q_heads_not_multiple": lambda c: mod.gqa_attention(np.ones((B, 3, 1, d)), c, np.array([1, 1])),
        "q_wrong_head_dim": lambda c: mod.gqa_attention(np.ones((B, 4, 1, d + 1)), c, np.array([1, 1])),
        "n_new_wrong_length": lambda c: c.append(np.ones((B, Hkv, 1, d)), np.ones((B, Hkv, 1, d)), np.array([1, 1, 1])),
        "n_new_above_T": lambda c: c.append(np.ones((B, Hkv, 1, d)), np.ones((B, Hkv, 1, d)), np.array([2, 1])),
        "k_new_wrong_heads": lambda c: c.append(np.ones((B, Hkv + 1, 1, d)), np.ones((B, Hkv + 1, 1, d)), np.array([1, 1])),
    }
    for name, attempt in attempts.items():
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


def probe_cost(cost, calls):
    """What the submission's ``cost`` module returns for each ``[label, function, args]`` call."""
    answers = {}
    for label, name, args in calls:
        try:
            value = getattr(cost, name)(*args)
            answers[label] = value if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) else repr(value)[:80]
        except BaseException as exc:  # noqa: BLE001
            answers[label] = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    return answers


# ---------------------------------------------------------------- the port behind the NumPy contract

def torch_backend(torch):
    """Converters for :func:`run_trials`: NumPy inputs to CPU tensors and back."""
    import numpy as np

    def to_backend(array, dtype):
        if array is None:
            return getattr(torch, dtype)
        return torch.from_numpy(array if array.flags.c_contiguous and array.flags.writeable
                                else np.ascontiguousarray(array))

    def from_backend(out):
        if isinstance(out, torch.Tensor):
            return out.detach().cpu().numpy()
        return out

    return to_backend, from_backend


def numpy_facing(mod, torch):
    """The port ``mod`` behind the NumPy contract (CPU): NumPy arrays in and out.

    Lets every NumPy check drive a PyTorch port unchanged. Returns a namespace
    with ``KVCache`` and ``gqa_attention``.
    """
    import types

    import numpy as np

    class KVCache:
        def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
            self.port = mod.KVCache(batch, kv_heads, max_len, head_dim, dtype=getattr(torch, np.dtype(dtype).name))

        k = property(lambda self: self.port.k.detach().cpu().numpy())
        v = property(lambda self: self.port.v.detach().cpu().numpy())
        lens = property(lambda self: self.port.lens.detach().cpu().numpy())

        def append(self, k_new, v_new, n_new):
            self.port.append(torch.from_numpy(np.ascontiguousarray(k_new)),
                             torch.from_numpy(np.ascontiguousarray(v_new)), torch.from_numpy(np.asarray(n_new)))

    def gqa_attention(q, cache, n_new):
        out = mod.gqa_attention(torch.from_numpy(np.ascontiguousarray(q)), cache.port,
                                torch.from_numpy(np.asarray(n_new)))
        return out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else out

    return types.SimpleNamespace(KVCache=KVCache, gqa_attention=gqa_attention)


# ---------------------------------------------------------------- serving a task

def prepare(job_dir: str, job: dict) -> None:
    """In the zygote, before any fork: load what every task shares (the trial inputs)."""
    import numpy as np

    _JOB["dir"] = job_dir
    _JOB["data"] = {dtype: np.load(path, mmap_mode="c", allow_pickle=False)
                    for dtype, path in (job.get("data") or {}).items()}


def _impl(job: dict, backend: str):
    """The submission's implementation for ``backend`` ("numpy" or "torch"), and the converters."""
    workdir = os.getcwd()
    submission_on_path(workdir)
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
        mod = load_file("kv_cache_torch", os.path.join(workdir, "kv_cache_torch.py"))
        return mod, torch_backend(torch)
    mod = load_file("kv_cache", os.path.join(workdir, "kv_cache.py"))
    return mod, (None, None)


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        data = os.read(fd, min(left, 1 << 20))
        if not data:
            raise OSError("the zygote closed the go pipe")
        chunks.append(data)
        left -= len(data)
    return b"".join(chunks)


def mark(into=(), send: bytes = b"") -> None:
    """A measurement point: send ``send`` (the output of the measured calls since the last mark) to the
    zygote, wait for its go, and read what the go carries into the arrays of ``into``, in order (each
    made and written before the mark).

    The parent takes the kernel's figures of this process between its marks
    (``grader.sandbox.launch``): the first mark follows the import, so nothing
    the submission's module runs at import counts in any figure, and the last
    follows the last call, before the answer is written.

    Raises:
        OSError: the go does not carry as many bytes as ``into`` holds.
    """
    fds = _JOB.get("mark_fds")
    if not fds:
        return
    frame = b"M" + len(send).to_bytes(8, "little") + send
    view = memoryview(frame)
    while view:
        view = view[os.write(fds[0], view):]
    size = int.from_bytes(_read_exact(fds[1], 8), "little")
    views = [memoryview(a).cast("B") for a in into]
    if size != sum(len(v) for v in views):
        raise OSError(f"a mark carried {size} bytes for inputs of {sum(len(v) for v in views)}")
    for target in views:
        done = 0
        while done < len(target):
            got = os.readv(fds[1], [target[done:]])
            if not got:
                raise OSError("the zygote closed the go pipe")
            done += got


def _section(answer: dict, name: str, fn, *args):
    try:
        answer[name] = fn(*args)
    except BaseException as exc:  # noqa: BLE001
        answer[name] = {"error": _error(exc), "trace": traceback.format_exc()[-600:]}


def _trials(task: dict, job: dict):
    import numpy as np

    answer: dict = {}
    try:
        mod, (to_b, from_b) = _impl(job, task["backend"])
    except BaseException as exc:  # noqa: BLE001
        answer["import"] = {**_error(exc), "trace": traceback.format_exc()[-600:]}
        return answer, b""
    answer["import"] = None
    mark()  # what the module ran at import is behind this point: the figures start here
    records, outputs = run_trials(mod, task.get("trials") or job["trials"], _JOB["data"], to_b, from_b, mark)
    answer["records"] = records
    blob = np.concatenate(outputs).astype("<f8").tobytes() if outputs else b""
    if task.get("checks") and task["backend"] == "numpy":
        _section(answer, "errors", probe_errors, mod)
        if job.get("cost_calls") and os.path.exists("cost.py"):
            try:
                cost = load_file("cost", os.path.join(os.getcwd(), "cost.py"))
            except BaseException as exc:  # noqa: BLE001
                answer["cost"] = {"error": _error(exc)}
            else:
                _section(answer, "cost", probe_cost, cost, job["cost_calls"])
    return answer, blob


def serve(task: dict, job: dict, fd: int) -> None:
    """Run ``task`` and write its one answer frame to ``fd`` (then the process ends)."""
    protocol = sys.modules["_kvkit_protocol"]
    if task.get("mark_fd") is not None:
        _JOB["mark_fds"] = (task["mark_fd"], task["go_fd"])
    try:
        if task["kind"] == "trials":
            answer, blob = _trials(task, job)
        elif task["kind"] == "owntests":
            answer, blob = sys.modules["_kvkit_run_own_tests"].run(task, job), b""
        else:
            answer, blob = {"error": {"type": "KeyError", "value_error": False,
                                      "message": f"unknown task kind {task['kind']!r}"}}, b""
    except BaseException as exc:  # noqa: BLE001
        answer, blob = {"error": _error(exc), "trace": traceback.format_exc()[-600:]}, b""
    try:
        data = protocol.encode(answer, blob)
    except (TypeError, ValueError) as exc:  # a value JSON cannot hold (NaN, an object): the answer is void
        data = protocol.encode({"error": {"type": type(exc).__name__, "value_error": False,
                                          "message": "the answer could not be encoded"}})
    protocol.write_all(fd, data)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: end regardless
            pass
    # End now: no atexit handler, finalizer or __del__ of the submission runs after the answer.
    os._exit(0)
