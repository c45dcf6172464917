"""The candidate's own tests, in one fresh process per variant (runs INSIDE the sandbox).

The parent chooses the variant and keeps it. This process learns only whether
it runs the submission as it is (``none``) or wrapped: under the control and
under every planted mistake it runs the same wrapper, which calls the
submission's own ``KVCache.append`` and ``gqa_attention`` and then sends each
call's inputs and outcome, through the zygote, to the parent. The parent
answers with the outcome the variant gives (the same one for the control;
a mistake's for a mutant), having done the same work for every variant. So
nothing in this process, its frames, its memory or its timing, holds the
variant: only the outcomes tell a mutant from the control, as they would tell
a real mistake from a right implementation.
"""
from __future__ import annotations

import io
import os
import select
import sys
import types


def plugin_args(job: dict) -> list[str]:
    """pytest's ``-p`` options for the candidate's tests: Hypothesis's plugin where a submission file
    imports Hypothesis (the parent lists it in the job's ``preimport``) and it is installed.

    The sandbox turns off the automatic loading of every installed plugin
    (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, see ``grader/sandbox/launch.py``): scanning
    them costs about a second per session, and tests of this contract need none
    of them but Hypothesis's. Loading it costs the session about 0.2 CPU-s, so it
    is loaded where a test could use it: a file that never imports Hypothesis
    cannot.
    """
    import importlib.util

    wanted = any(name.split(".")[0] == "hypothesis" for name in job.get("preimport", []))
    return ["-p", "_hypothesis_pytestplugin"] if wanted and importlib.util.find_spec("_hypothesis_pytestplugin") \
        else []


class _Failures:
    """A pytest plugin that keeps each failed test's id and its error on one line (an explanation in the
    report, never a verdict: the exit code decides), 1,000 characters at most: the parent cuts it shorter
    at a whole value."""

    def __init__(self):
        self.seen: list[str] = []

    def pytest_collectreport(self, report) -> None:
        # A test file that cannot be collected (an import that fails): its error is why nothing ran.
        if report.failed and len(self.seen) < 3:
            lines = [ln for ln in str(report.longrepr).splitlines() if ln.strip()]
            error = next((ln for ln in reversed(lines) if ln.startswith("E ")), lines[-1] if lines else "")
            self.seen.append(f"{report.nodeid} - could not be collected: {' '.join(error[1:].split())}"[:1000])

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and len(self.seen) < 3:
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = str(crash.message if crash is not None else report.longrepr).splitlines()
            # pytest's own advice and "+ where" expansions (array reprs) say nothing to a reader of the report
            kept = [ln for ln in lines if not ln.strip().startswith(("+", "Use -v", "Full diff"))][:8]
            self.seen.append(f"{report.nodeid} - {' '.join(' '.join(kept).split())}"[:1000])


class _Calls:
    """This process's line to the parent through the zygote: one request frame out, one reply frame back."""

    def __init__(self, send_fd: int, reply_fd: int):
        self.send_fd, self.reply_fd, self.buffer = send_fd, reply_fd, b""

    def ask(self, request: dict, arrays: dict):
        """``(reply, arrays)`` for one call; raises RuntimeError when the parent could not serve it."""
        import numpy as np

        protocol = sys.modules["_kvkit_protocol"]
        meta, blob = protocol.pack_arrays(arrays)
        protocol.write_all(self.send_fd, protocol.encode({**request, "arrays": meta}, blob))
        while True:
            reply, blob, rest = protocol.decode(self.buffer)
            if reply is not None:
                self.buffer = bytes(rest)
                break
            select.select([self.reply_fd], [], [])
            data = os.read(self.reply_fd, 1 << 20)
            if not data:
                raise RuntimeError("the grader's wrapper lost its line to the grader")
            self.buffer += data
        if not reply.get("ok"):
            raise RuntimeError(f"the grader's wrapper could not serve this call: {str(reply.get('error'))[:200]}")
        return reply, protocol.unpack_arrays(reply.get("arrays", []), blob, np.frombuffer)


def _sendable(array):
    """``array`` as a contiguous little-endian NumPy array of a dtype the line carries, or None."""
    import numpy as np

    protocol = sys.modules["_kvkit_protocol"]
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.dtype.str in protocol.ARRAY_DTYPES else None


def _wrapped_module(original, calls: _Calls):
    """A module like ``original`` whose KVCache (a subclass) and gqa_attention report each call's outcome
    to the parent and apply the outcome it answers. The same code under every variant.

    Only what the contract defines is sent: the appended lengths, and an attention call's inputs and
    plain-array output. A call the wrapper cannot describe so (no ``lens``, a non-array output) keeps
    the submission's own outcome, whatever the variant.
    """
    import numpy as np

    base, attention = original.KVCache, original.gqa_attention

    def append(self, k_new, v_new, n_new):
        try:
            before = np.array(self.lens, dtype=np.int64, copy=True)
        except Exception:  # noqa: BLE001 - no lengths to report: the submission's own outcome stands
            before = None
        raised = None
        try:
            result = base.append(self, k_new, v_new, n_new)
        except ValueError as exc:
            raised = exc
        if before is not None:
            try:
                request = {"op": "append", "raised": raised is not None, "max_len": int(self.k.shape[2])}
                arrays = {"lens_before": before, "lens_after": np.array(self.lens, dtype=np.int64),
                          "n_new": np.array(n_new, dtype=np.int64).reshape(-1)}
            except Exception:  # noqa: BLE001
                request = None
            if request is not None:
                reply, _ = calls.ask(request, arrays)
                if reply.get("lens") is not None:
                    self.lens[...] = np.asarray(reply["lens"], dtype=np.int64)
                if reply.get("reallocate"):
                    self.k, self.v = np.array(self.k, copy=True), np.array(self.v, copy=True)
        if raised is not None:
            raise raised
        return result

    def gqa_attention(q, cache, n_new):
        out = attention(q, cache, n_new)
        if type(out) is not np.ndarray:
            return out
        try:
            lens = np.array(cache.lens, dtype=np.int64).reshape(-1)
            S = int(lens.max()) if lens.size else 0
            arrays = {"q": _sendable(q), "k": _sendable(cache.k[:, :, :S]), "v": _sendable(cache.v[:, :, :S]),
                      "lens": lens, "n_new": np.array(n_new, dtype=np.int64).reshape(-1), "out": _sendable(out)}
        except Exception:  # noqa: BLE001
            return out
        if any(a is None for a in arrays.values()):
            return out
        _, got = calls.ask({"op": "attention"}, arrays)
        return np.array(got["out"], copy=True)

    cls = type(base.__name__, (base,), {"append": append, "__doc__": base.__doc__,
                                         "__module__": getattr(base, "__module__", "kv_cache")})
    cls.__qualname__ = getattr(base, "__qualname__", cls.__name__)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(gqa_attention, attr, getattr(attention, attr, None))
    shim = types.ModuleType("kv_cache")
    shim.__dict__.update({k: v for k, v in vars(original).items() if not k.startswith("__")})
    shim.KVCache, shim.gqa_attention = cls, gqa_attention
    shim.__file__ = original.__file__
    return shim


def _read_all(fd: int) -> str:
    data = b""
    while True:
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data.decode()


def run(task: dict, job: dict) -> dict:
    """Run pytest on the test files, wrapped or not as the parent says: ``{"exit", "failed", "tail"}``.

    The mode (``none`` or wrapped) is read from a pipe only this process holds, before any
    submission file runs. Wrapped, every call goes to the parent through the task's call pipes.
    """
    tasks = sys.modules["_kvkit_tasks"]
    protocol = sys.modules["_kvkit_protocol"]
    workdir = os.getcwd()
    tasks.submission_on_path(workdir)
    import pytest

    files = list(task["files"])
    mode = _read_all(task["secret_fd"]) if task.get("secret_fd") is not None else ""
    calls = _Calls(task["call_fd"], task["reply_fd"]) if task.get("call_fd") is not None else None
    try:
        original = tasks.load_file("kv_cache", os.path.join(workdir, "kv_cache.py"))
        if mode == protocol.WRAPPED and calls is not None:
            sys.modules["kv_cache"] = _wrapped_module(original, calls)
        elif mode != "none":
            return {"exit": -1, "error": "no variant was handed over"}
    except BaseException as exc:  # noqa: BLE001
        return {"exit": -1, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    failures = _Failures()
    try:
        code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", *plugin_args(job), "-o", "addopts=",
                            "--import-mode=append", "--rootdir", workdir, "-rf", "--tb=line", *files],
                           plugins=[failures])
    except BaseException as exc:  # noqa: BLE001
        code = -1
        out.write(f"{type(exc).__name__}: {exc}")
    finally:
        sys.stdout, sys.stderr = saved
    text = out.getvalue()
    failed = failures.seen or [line[len("FAILED "):].strip()[:200] for line in text.splitlines()
                                if line.startswith("FAILED ")]
    return {"exit": int(code), "failed": failed[:3], "tail": text[-400:]}
