"""Turn exceptions from the learner's code into plain-words failures that name the step.

A stub that still raises ``NotImplementedError``, or code that crashes with an
``IndexError``, ends the test with one message: the step, the configuration
that was running, the function and line that raised, and what it raised.
"""
from __future__ import annotations

import linecache
from pathlib import Path

import pytest

import adapters
import stepkit


def pytest_runtest_setup(item):
    stepkit.STEP = getattr(item.module, "STEP", None)
    stepkit.reset_case()


def _learner_frame(exc: BaseException):
    """``(qualified name, file, line number, source line)`` of the innermost frame in the implementation, or None."""
    folder = adapters.impl_dir()
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        try:
            path = Path(code.co_filename).resolve()
            if path.is_relative_to(folder) and not path.is_relative_to(adapters.HERE):
                line = linecache.getline(str(path), tb.tb_lineno).strip()
                found = (getattr(code, "co_qualname", code.co_name), path.name, tb.tb_lineno, line)
        except (OSError, ValueError):
            pass
        tb = tb.tb_next
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Exception as exc:
        frame = _learner_frame(exc)
        if frame is None:
            raise
        message = _explain(item, exc, frame)
    # Raised outside the except block, so the report is the message alone, not a chained traceback.
    pytest.fail(message, pytrace=False)


def _explain(item, exc: Exception, frame) -> str:
    """The plain-words failure for an exception raised inside the learner's code."""
    step = getattr(item.module, "STEP", None)
    name, file, lineno, line = frame
    where = f"{name} ({file}, line {lineno})"
    running = stepkit.failed_case()
    running = f" while running {running}" if running else ""
    if isinstance(exc, NotImplementedError):
        text = str(exc)
        owner = ""
        if text.startswith("step ") and not text.startswith((f"step {step}:", f"step {step} ")):
            owner = f" Finish {text.split(':')[0]} first."
        return f"step {step}: {where} is not written yet{running}: it raises NotImplementedError({text!r}).{owner}"
    if isinstance(exc, FloatingPointError):
        return (f"step {step}: {where} raised FloatingPointError({exc}){running}, under "
                f"np.errstate(divide/over/invalid='raise'), at `{line}`. A query with no visible key "
                f"(a padded slot, a row with n_new[b]=0) makes a softmax over nothing: 0/0, or -inf - -inf, "
                f"both NaN (nan_padding). Keep every step finite for such queries.")
    code = f" The line that raised: `{line}`" if line else ""
    return f"step {step}: {where} raised {type(exc).__name__}: {exc}{running}.{code}"
