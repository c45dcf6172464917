"""Runs INSIDE the sandboxed child: the candidate's own tests, then each planted mutant in its place.

Self-contained, run by path: ``python -I -S owntests_child.py JOBDIR SITEDIR...``
from the submission's directory. For each variant it imports the candidate's
``kv_cache`` afresh, swaps in the mutant's ``KVCache``/``gqa_attention`` (planted
around the candidate's own code by ``_kvkit_mutants.py``, so no reference code
is ever here), runs pytest on the candidate's test files, and records the exit
code: 0 the tests passed (a mutant survived), 1 they failed (it was caught).
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import types


def _purge(root: str) -> None:
    """Forget every module loaded from the submission, so the next run imports afresh."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name == "kv_cache" or (path and os.path.abspath(path).startswith(root + os.sep)):
            del sys.modules[name]


def main(argv: list) -> int:
    job_dir = os.path.abspath(argv[0])
    root = os.getcwd()
    sys.path[:0] = [root] + list(argv[1:])
    import pytest

    with open(os.path.join(job_dir, "owntests.json")) as f:
        spec = json.load(f)
    mutants_spec = importlib.util.spec_from_file_location("_kvkit_mutants", os.path.join(job_dir, "_kvkit_mutants.py"))
    mutants = importlib.util.module_from_spec(mutants_spec)
    mutants_spec.loader.exec_module(mutants)

    results = {"runs": {}}
    for variant in ["none", mutants.CONTROL] + spec["variants"]:
        _purge(root)
        try:
            import kv_cache as original
            if variant != "none":
                shim = types.ModuleType("kv_cache")
                shim.__dict__.update({k: v for k, v in vars(original).items() if not k.startswith("__")})
                shim.KVCache, shim.gqa_attention = mutants.plant(variant, original.KVCache, original.gqa_attention)
                shim.__file__ = original.__file__
                sys.modules["kv_cache"] = shim
        except BaseException as exc:  # noqa: BLE001
            results["runs"][variant] = {"exit": -1, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        out = io.StringIO()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out
        try:
            code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
                                "--rootdir", root, *spec["files"]])
        except BaseException as exc:  # noqa: BLE001
            code = -1
            out.write(f"{type(exc).__name__}: {exc}")
        finally:
            sys.stdout, sys.stderr = saved
        results["runs"][variant] = {"exit": int(code), "tail": out.getvalue()[-400:]}
        with open(os.path.join(job_dir, "owntests_results.json"), "w") as f:
            json.dump(results, f)
    results["done"] = True
    with open(os.path.join(job_dir, "owntests_results.json"), "w") as f:
        json.dump(results, f)
    # End now: no atexit handler or finalizer of the submission runs after the last write.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
