"""The one seam between the step tests and the code they check.

Every step test reaches the learner's code through this module, never by a
plain ``import kv_cache``. It picks the implementation directory from the
environment variable ``KVKIT_IMPL`` (a directory holding ``kv_cache.py`` and,
as the steps need them, ``kv_cache_torch.py``, ``cost.py`` and
``test_mine.py``); without it, the exercises directory these tests live in.
So the kit's own suite can run the same tests against the reference, the
stubs, or a planted mistake.

    KVKIT_IMPL=/path/to/my/solution python -m pytest tests/test_step1_cache.py
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

IMPL_ENV = "KVKIT_IMPL"
HERE = Path(__file__).resolve().parent
EXERCISES = HERE.parent


def impl_dir() -> Path:
    """The directory whose ``kv_cache.py`` (and friends) the tests check.

    ``$KVKIT_IMPL`` when set, else the exercises directory (the parent of
    ``tests/``).
    """
    value = os.environ.get(IMPL_ENV)
    return Path(value).resolve() if value else EXERCISES


def _load(name: str, step: int):
    """Import ``<impl_dir>/<name>.py`` as the module ``name`` and return it.

    A missing file or a file that does not import ends the test with a
    plain-words failure naming ``step`` (never a bare traceback).
    """
    folder = impl_dir()
    path = folder / f"{name}.py"
    if not path.is_file():
        pytest.fail(f"step {step}: there is no {name}.py in {folder} "
                    f"(the tests read the directory in ${IMPL_ENV}, default: the exercises directory).",
                    pytrace=False)
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == path:
        return module
    sys.modules.pop(name, None)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # so the learner's files can import each other
    problem = None
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        problem = (f"importing {path} failed: {type(exc).__name__}: {exc}"
                   + (f" (is the package {missing!r} installed?)" if missing and missing != name else ""))
    except Exception as exc:  # a SyntaxError, or code at the top of the file that raised
        where = ""
        if isinstance(exc, SyntaxError) and exc.lineno:
            where = f" (line {exc.lineno}: {(exc.text or '').strip()})"
        problem = f"importing {path} failed: {type(exc).__name__}: {exc}{where}"
    if problem:  # failed outside the except block: the message alone, no chained traceback
        sys.modules.pop(name, None)
        pytest.fail(f"step {step}: {problem}", pytrace=False)
    if Path(module.__file__).resolve() != path:
        pytest.fail(f"step {step}: `import {name}` found {module.__file__}, not {path}: "
                    f"rename or remove the other {name} module.", pytrace=False)
    return module


def kv_cache(step: int):
    """The learner's NumPy module (``KVCache``, ``gqa_attention``)."""
    return _load("kv_cache", step)


def kv_cache_torch(step: int):
    """The learner's PyTorch port (``KVCache``, ``gqa_attention`` over torch tensors)."""
    return _load("kv_cache_torch", step)


def cost(step: int):
    """The learner's cost model (``kv_bytes_per_token`` ... ``repeat_bytes``)."""
    return _load("cost", step)


def own_tests() -> Path:
    """Where the learner's own tests are: ``<impl_dir>/test_mine.py``."""
    return impl_dir() / "test_mine.py"


def mutants_path() -> Path | None:
    """The catalogue's planted mutants (``mutants.py``), found next to the exercises.

    Looked for in ``<exercises>/catalogue/`` (the starter bundle), in the
    kit's ``catalogue/`` beside the exercises directory, then as the installed
    kit's ``catalogue.mutants``; None when absent.
    """
    for candidate in (EXERCISES / "catalogue" / "mutants.py", EXERCISES.parent / "catalogue" / "mutants.py"):
        if candidate.is_file():
            return candidate
    try:
        spec = importlib.util.find_spec("catalogue.mutants")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and Path(spec.origin).is_file():
        return Path(spec.origin)
    return None
