"""Turn exceptions from the learner's code into plain-words failures that name the step.

A stub that still raises ``NotImplementedError``, or code that crashes with an
``IndexError``, ends the test with one message: the step, the configuration
that was running, the function and line that raised, and what it raised.

A check that does not return within the per-check timeout (``$KVKIT_CHECK_TIMEOUT``,
10 s; see ``stepkit.watch``) is interrupted the same way, and its message names
the function the check called and the line it was stuck on.
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


def _learner_frames(exc: BaseException) -> list:
    """``(qualified name, file, line number, source line)`` of each frame in the implementation, outermost first."""
    folder = adapters.impl_dir()
    found = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        try:
            path = Path(code.co_filename)
            path = path.resolve() if path.is_absolute() else None  # not "<string>" (cwd-relative)
            if (path is not None and path.is_relative_to(folder) and not path.is_relative_to(adapters.HERE)
                    and not any(part.startswith(".") or part == "site-packages"
                                for part in path.relative_to(folder).parts)):
                line = linecache.getline(str(path), tb.tb_lineno).strip()
                found.append((getattr(code, "co_qualname", code.co_name), path.name, tb.tb_lineno, line))
        except (OSError, ValueError):
            pass
        tb = tb.tb_next
    return found


def _learner_frame(exc: BaseException):
    """The innermost frame in the implementation (see ``_learner_frames``), or None."""
    frames = _learner_frames(exc)
    return frames[-1] if frames else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except stepkit.CheckTimeout as exc:
        item.user_properties.append(("check_timeout", f"{exc.seconds:g}"))  # progress.py: this step got stuck
        message = _stuck(item, exc)
    except Exception as exc:
        frame = _learner_frame(exc)
        if frame is None:
            raise
        message = _explain(item, exc, frame)
    # Raised outside the except block, so the report is the message alone, not a chained traceback.
    pytest.fail(message, pytrace=False)


def _stuck(item, exc: "stepkit.CheckTimeout") -> str:
    """The plain-words failure for a check that ran past the timeout: the function it called, where it was stuck."""
    step = getattr(item.module, "STEP", None)
    frames = _learner_frames(exc)
    limit = f"within {exc.seconds:g} s on {exc.text}"
    if not frames:  # interrupted outside the learner's code: a check that is slow as a whole
        return f"step {step}: a check did not finish {limit}; an endless loop?"
    called, (name, file, lineno, line) = frames[0][0], frames[-1]
    where = f"{file} line {lineno}" + (f", in {name}" if name != called else "") + (f": `{line}`" if line else "")
    return (f"step {step}: {called} did not return {limit} ({where}); an endless loop? If it is only slow, "
            f"allow more time: --timeout SECONDS for the progress command, or ${stepkit.TIMEOUT_ENV}.")


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
