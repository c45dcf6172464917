"""The candidate's own tests, in one fresh process per variant (runs INSIDE the sandbox).

The parent names the variant; this process applies it before any test file is
imported: ``none`` is the submission as it is, every other variant (the control
``identity`` and each planted mistake) is the same generated wrapper code from
``mutants.py`` with the variant as a literal. Nothing in the process names the
variant where a test could read it without inspecting code or frames, and a
test that does inspect (``__code__``, frames, ``sys._getframe``, ``gc``, the
submission's source as text) is recorded here by an audit hook: the parent
fails the criterion, saying which test did what. Honest tests never need those.
"""
from __future__ import annotations

import io
import os
import sys
import types

INSPECTING = {"sys._getframe", "gc.get_referrers", "gc.get_referents", "gc.get_objects"}
FRAME_ATTRS = {"__code__", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code"}


class _Watch:
    """An audit hook that records inspection done by the submission's test files."""

    def __init__(self, test_files: list[str], impl_files: list[str]):
        self.tests = {os.path.realpath(p) for p in test_files}
        self.impl = {os.path.realpath(p) for p in impl_files}
        self.seen: list[str] = []
        self.busy = False

    def _test_frame(self, direct_only: bool):
        frame = sys._getframe(2)
        while frame is not None:
            if os.path.realpath(frame.f_code.co_filename) in self.tests:
                return frame
            if direct_only:
                return None
            frame = frame.f_back
        return None

    def __call__(self, event: str, args) -> None:
        if self.busy or len(self.seen) >= 20:
            return
        if event not in INSPECTING and event not in ("object.__getattr__", "open"):
            return
        self.busy = True
        try:
            what = None
            if event in INSPECTING:
                frame = self._test_frame(direct_only=True)
                what = event if frame else None
            elif event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRS:
                frame = self._test_frame(direct_only=True)
                what = f"reads .{args[1]}" if frame else None
            elif event == "open" and args and isinstance(args[0], (str, bytes)):
                path = os.path.realpath(os.fsdecode(args[0]))
                if path in self.impl:
                    frame = self._test_frame(direct_only=False)
                    importing = frame is not None and any(
                        "importlib" in (f.f_code.co_filename or "") for f in _stack(sys._getframe(1)))
                    what = f"opens {os.path.basename(path)} as a file" if frame and not importing else None
            if what:
                self.seen.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {what}")
        finally:
            self.busy = False


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _wrapped_module(original, mutants, variant: str):
    """A module like ``original`` with KVCache and gqa_attention replaced by the variant's wrapper."""
    shim = types.ModuleType("kv_cache")
    shim.__dict__.update({k: v for k, v in vars(original).items() if not k.startswith("__")})
    shim.KVCache, shim.gqa_attention = mutants.plant(variant, original.KVCache, original.gqa_attention)
    shim.__file__ = original.__file__
    return shim


def run(task: dict, job: dict) -> dict:
    """Apply ``task["variant"]``, run pytest on the test files, return ``{"exit", "failed", "inspected"}``."""
    tasks = sys.modules["_kvkit_tasks"]
    workdir = os.getcwd()
    tasks.submission_on_path(workdir)
    import pytest

    files = list(task["files"])
    try:
        original = tasks.load_file("kv_cache", os.path.join(workdir, "kv_cache.py"))
        if task["variant"] != "none":
            mutants = tasks.load_file("_kvkit_mutants", os.path.join(os.path.dirname(tasks.__file__), "mutants.py"))
            sys.modules["kv_cache"] = _wrapped_module(original, mutants, task["variant"])
            del sys.modules["_kvkit_mutants"]
            del mutants
    except BaseException as exc:  # noqa: BLE001
        return {"exit": -1, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    del task  # nothing in this frame names the variant from here on
    watch = _Watch([os.path.join(workdir, f) for f in files],
                   [os.path.join(workdir, n) for n in ("kv_cache.py", "kv_cache_torch.py")])
    sys.addaudithook(watch)
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
                            "--import-mode=append", "--rootdir", workdir, "-rf", "--tb=line", *files])
    except BaseException as exc:  # noqa: BLE001
        code = -1
        out.write(f"{type(exc).__name__}: {exc}")
    finally:
        sys.stdout, sys.stderr = saved
    text = out.getvalue()
    failed = [line[len("FAILED "):].strip()[:200] for line in text.splitlines() if line.startswith("FAILED ")]
    return {"exit": int(code), "failed": failed[:3], "inspected": list(watch.seen), "tail": text[-400:]}
