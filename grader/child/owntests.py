"""The candidate's own tests, in one fresh process per variant (runs INSIDE the sandbox).

The parent chooses the variant and hands it over only after this process is
forked, through a pipe of its own (the zygote and the other task processes
never know which task runs which variant, and the order is random). ``none``
is the submission as it is; every other variant (the control ``identity`` and
each planted mistake) is the same proxy code from ``mutants.py``, with the
variant and the wrapped implementation held in a suspended generator's frame.
An audit hook, installed before any submission file is loaded, records code
of the submission that inspects instead of calling (frames, ``__code__``,
``gc``, the implementation's source opened as text): the parent fails the
criterion, saying which file did what. Honest tests never need those.
"""
from __future__ import annotations

import io
import os
import sys
import types

INSPECTING = {"sys._getframe", "sys._current_frames", "gc.get_referrers", "gc.get_referents", "gc.get_objects"}
# A profiler or tracer is handed every frame (and its locals) of the code it watches.
TRACING = {"sys.setprofile", "sys.settrace"}
FRAME_ATTRS = {"__code__", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code"}
# Standard tools that read frames or code on their caller's behalf: a call through them counts as the caller's.
PASS_THROUGH = ("inspect.py", "dis.py", "traceback.py")  # and the ctypes package


class _Watch:
    """An audit hook that records inspection done by the submission's own files.

    Installed before any submission file is loaded. An inspecting event
    (frames, code, the garbage collector) counts when the first frame outside
    ``PASS_THROUGH`` that raised it is a file of the submission; opening an
    implementation file as text counts when a submission file is on the stack
    and the import system is not.
    """

    def __init__(self, workdir: str, impl_files: list[str]):
        self.root = os.path.realpath(workdir) + os.sep
        self.impl = {os.path.realpath(p) for p in impl_files}
        self.seen: list[str] = []
        self.busy = False

    def _mine(self, filename: str) -> bool:
        return os.path.realpath(filename).startswith(self.root)

    def _culprit(self, frame):
        """The submission frame that asked, seen from the innermost frame of the event."""
        while frame is not None and (os.path.basename(frame.f_code.co_filename) in PASS_THROUGH
                                     or f"{os.sep}ctypes{os.sep}" in frame.f_code.co_filename):
            frame = frame.f_back
        return frame if frame is not None and self._mine(frame.f_code.co_filename) else None

    def __call__(self, event: str, args) -> None:
        if self.busy or len(self.seen) >= 20:
            return
        if event not in INSPECTING and event not in TRACING and event not in ("object.__getattr__", "open") \
                and not event.startswith("ctypes."):
            return
        self.busy = True
        try:
            what, frame = None, None
            inner = sys._getframe(1)
            if event in TRACING:
                # Set by a submission file, or by a thread starting with threading.setprofile/settrace.
                frame = self._culprit(inner)
                if frame is None and os.path.basename(inner.f_code.co_filename) == "threading.py":
                    frame = next((f for f in _stack(inner) if self._mine(f.f_code.co_filename)), inner)
                what = f"sets a {'profiler' if event.endswith('profile') else 'tracer'} (sees every frame)"
            elif event in INSPECTING or event.startswith("ctypes."):
                frame = self._culprit(inner)  # ctypes: reading memory (or frames) behind Python's back
                what = event
            elif event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRS:
                frame = self._culprit(inner)
                what = f"reads .{args[1]}"
            elif event == "open" and args and isinstance(args[0], (str, bytes)):
                path = os.path.realpath(os.fsdecode(args[0]))
                if path in self.impl:
                    stack = list(_stack(inner))
                    frame = next((f for f in stack if self._mine(f.f_code.co_filename)), None)
                    if any("importlib" in (f.f_code.co_filename or "") for f in stack):
                        frame = None
                    what = f"opens {os.path.basename(path)} as a file"
            if frame is not None and what:
                self.seen.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {what}")
        finally:
            self.busy = False


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def plugin_args() -> list[str]:
    """pytest's ``-p`` options for the candidate's tests: Hypothesis's plugin where it is installed.

    The sandbox turns off the automatic loading of every installed plugin
    (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, see ``grader/sandbox/launch.py``): scanning
    them costs about a second per session, and tests of this contract need none
    of them but Hypothesis's.
    """
    import importlib.util

    return ["-p", "_hypothesis_pytestplugin"] if importlib.util.find_spec("_hypothesis_pytestplugin") else []


class _Failures:
    """A pytest plugin that keeps each failed test's id and its error on one line (an explanation in the
    report, never a verdict: the exit code decides)."""

    def __init__(self):
        self.seen: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and len(self.seen) < 3:
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = str(crash.message if crash is not None else report.longrepr).splitlines()
            # pytest's own advice and "+ where" expansions (array reprs) say nothing to a reader of the report
            kept = [ln for ln in lines if not ln.strip().startswith(("+", "Use -v", "Full diff"))][:8]
            self.seen.append(f"{report.nodeid} - {' '.join(' '.join(kept).split())}"[:300])


def _wrapped_module(original, plant, variant: str):
    """A module like ``original`` with KVCache and gqa_attention replaced by the variant's proxies."""
    shim = types.ModuleType("kv_cache")
    shim.__dict__.update({k: v for k, v in vars(original).items() if not k.startswith("__")})
    shim.KVCache, shim.gqa_attention = plant(variant, original.KVCache, original.gqa_attention)
    shim.__file__ = original.__file__
    return shim


def _read_secret(fd: int) -> str:
    data = b""
    while True:
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data.decode()


def run(task: dict, job: dict) -> dict:
    """Apply the variant the parent hands over, run pytest on the test files: ``{"exit", "failed", "inspected"}``.

    Order matters: the audit hook first, then the variant (read from a pipe
    only this process holds), then the submission's files; the variant is
    then kept only inside the planted proxies.
    """
    tasks = sys.modules["_kvkit_tasks"]
    workdir = os.getcwd()
    watch = _Watch(workdir, [os.path.join(workdir, n) for n in ("kv_cache.py", "kv_cache_torch.py")])
    sys.addaudithook(watch)
    tasks.submission_on_path(workdir)
    import pytest

    files = list(task["files"])
    # The variant is read (and its pipe closed) before any submission file runs: nothing of the
    # submission can read it from the pipe; reading it from this frame is inspection (audited).
    variant = _read_secret(task["secret_fd"]) if task.get("secret_fd") is not None else ""
    del task
    try:
        original = tasks.load_file("kv_cache", os.path.join(workdir, "kv_cache.py"))
        if _install(tasks, original, variant) is None:
            return {"exit": -1, "error": "no variant was handed over"}
        del variant
    except BaseException as exc:  # noqa: BLE001
        return {"exit": -1, "error": f"{type(exc).__name__}: {str(exc)[:200]}", "inspected": list(watch.seen)}
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    failures = _Failures()
    try:
        code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", *plugin_args(), "-o", "addopts=",
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
    return {"exit": int(code), "failed": failed[:3], "inspected": list(watch.seen), "tail": text[-400:]}


def _install(tasks, original, variant: str):
    """Put the variant's planted module in place; returns None when no variant came."""
    if not variant:
        return None
    if variant != "none":
        mutants = tasks.load_file("_kvkit_mutants", os.path.join(os.path.dirname(tasks.__file__), "mutants.py"))
        sys.modules["kv_cache"] = _wrapped_module(original, mutants.plant, variant)
        del sys.modules["_kvkit_mutants"]
    return True
