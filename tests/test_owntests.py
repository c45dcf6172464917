"""The own-tests criterion reads each variant's run as data, and says "error" (never "fail") when pytest
did not finish there; the zygote that runs the variants side by side never closes a task's own pipe."""
from __future__ import annotations

import importlib.util
import os
import types

import numpy as np
import pytest

from catalogue import mutants
from grader import owntests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _session(answers: dict):
    """A stand-in for the sandbox's session: ``{variant: answer or None}`` as its own-tests tasks."""
    tasks = {f"own:{v}": types.SimpleNamespace(answer=a, why=lambda: "killed") for v, a in answers.items()}
    return types.SimpleNamespace(tasks=tasks, reason="")


def _all(code_of_mutant: int = 1, **overrides) -> dict:
    answers = {"none": {"exit": 0}, mutants.CONTROL: {"exit": 0}}
    answers.update({m: {"exit": code_of_mutant} for m in mutants.PLANTED})
    answers.update(overrides)
    return answers


def test_tests_that_catch_every_mutant_pass():
    crit = owntests.criterion(_session(_all()), ["test_mine.py"])
    assert crit.status == "pass", crit.evidence
    assert f"caught {len(mutants.PLANTED)} of {len(mutants.PLANTED)}" in crit.evidence


def test_tests_that_miss_the_key_mutant_fail():
    crit = owntests.criterion(_session(_all(**{mutants.MUST_CATCH: {"exit": 0}})), ["test_mine.py"])
    assert crit.status == "fail" and f"miss {mutants.MUST_CATCH}" in crit.evidence


@pytest.mark.parametrize("answer", [
    {"error": {"type": "OSError", "message": "[Errno 9] Bad file descriptor"}, "trace": "..."},  # escaped the run
    {"exit": None}, {"exit": "0"}, {"exit": True}, {"exit": -1, "error": "no variant was handed over"},
])
def test_a_run_that_did_not_finish_on_the_submission_is_an_error_not_a_failure(answer):
    crit = owntests.criterion(_session(_all(none=answer)), ["test_mine.py"])
    assert crit.status == "error", crit.evidence
    assert "could not be run on the submission" in crit.evidence


def test_a_control_that_did_not_finish_is_an_error():
    crit = owntests.criterion(_session(_all(**{mutants.CONTROL: {"error": "x"}})), ["test_mine.py"])
    assert crit.status == "error" and "control" in crit.evidence


def test_the_key_mutant_not_run_is_an_error_not_a_miss():
    answers = _all(**{mutants.MUST_CATCH: {"error": {"type": "MemoryError", "message": ""}}})
    crit = owntests.criterion(_session(answers), ["test_mine.py"])
    assert crit.status == "error", crit.evidence
    assert f"not run: {mutants.MUST_CATCH}" in crit.evidence


def test_tests_that_fail_on_the_submission_fail():
    crit = owntests.criterion(_session(_all(none={"exit": 1, "failed": ["test_mine.py::test_x - boom"]})),
                              ["test_mine.py"])
    assert crit.status == "fail" and "pytest exit 1" in crit.evidence and "test_x" in crit.evidence


def _zygote():
    path = os.path.join(ROOT, "grader", "child", "zygote.py")
    spec = importlib.util.spec_from_file_location("_test_zygote", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_task_process_keeps_its_own_pipe_whatever_the_zygote_still_lists():
    """A pipe end another thread closed can be listed in ``_OPEN`` a moment longer, under a number the
    next pipe reuses: the task process forked then must still keep its own ends (its answer arrives)."""
    zygote = _zygote()
    zygote.FDS.update(to_parent=os.open(os.devnull, os.O_WRONLY), from_parent=os.open(os.devnull, os.O_RDONLY))
    zygote._OPEN.update(set(range(3, 1024)) - set(zygote.FDS.values()))  # every number the next pipe could get
    tasks = types.SimpleNamespace(serve=lambda task, job, fd: os.write(fd, b"answer"))
    try:
        pid, read, _, _ = zygote._fork_task({"name": "t"}, {}, tasks)
        answer, stopped, waited = zygote._read_answer(read, pid, 10.0)
    finally:
        zygote._OPEN.clear()
        for fd in zygote.FDS.values():
            os.close(fd)
    assert stopped == "" and waited is not None
    assert answer == b"answer"


def _scan_run(max_len: int, cpu_s: float):
    """A live-length probe run as the criterion reads it: ``(probe, task, expected output)``."""
    probe = types.SimpleNamespace(config={"max_len": max_len, "decodes": 32, "live": 8387})
    task = types.SimpleNamespace(why=lambda: "", answer={"records": [[]]}, blob=np.zeros(4).tobytes(), cpu_s=cpu_s)
    return probe, task, np.zeros(4)


@pytest.mark.parametrize("appends_copy,status,named", [(False, "fail", ["max_len_scan"]), (True, "error", [])])
def test_a_slow_large_reservation_names_max_len_scan_only_when_the_appends_do_not_copy(appends_copy, status, named):
    """Each decode step of the probe appends a token first: when appends copy the cache, the large
    reservation's cost may be theirs, and the attention's scan cannot be told apart (no guess)."""
    from grader import criteria

    crit = criteria.live_length(_scan_run(8400, 0.1), _scan_run(8 * 8400, 0.6), appends_copy=appends_copy)
    assert (crit.status, crit.mistakes) == (status, named), crit.evidence
    assert "6.0x" in crit.evidence


def test_the_first_failure_is_shown_whole_with_short_numbers():
    failed = ["test_mine.py::test_chunk - AssertionError: Not equal to tolerance step [3, 4] "
              "0.23489566434578266 (ACTUAL), 0.24955872234790916 (DESIRED) 1.5e-07"]
    crit = owntests.criterion(_session(_all(none={"exit": 1, "failed": failed})), ["test_mine.py"])
    assert "step [3, 4] 0.235 (ACTUAL), 0.25 (DESIRED)" in crit.evidence, crit.evidence
