"""The grader's checks, run in-process on an implementation you hand it.

For the classroom notebook's hidden tests (nbgrader runs the student's code in
its kernel anyway) and for quick self-checks: the same trials, oracle and
criteria as ``kvkit grade``, without the sandbox. Never use this on code you do
not trust; the grader proper runs submissions in a child process.

    from grader.checks import check
    result = check("chunked_prefill", KVCache, gqa_attention)
    assert result.passed, result.message
"""
from __future__ import annotations

import types
from dataclasses import dataclass

from grader import compare, evaluate, harness, jobs
from grader.trials import random_trials, small_cases, targeted_trials

CORRECTNESS = {
    "decode": ("decode", "decode"),
    "full_prefill": ("full_prefill", "full prefill"),
    "chunked_prefill": ("chunked_prefill", "chunked prefill"),
    "ragged_rows": ("ragged", "ragged-row"),
}
NAMES = (*CORRECTNESS, "head_mapping", "padding", "in_place", "overflow_atomic")


@dataclass
class CheckResult:
    """``passed``; ``message``: the evidence in plain words (no hidden value); ``mistakes``: catalogue ids."""

    name: str
    passed: bool
    message: str
    mistakes: list


def _comparison(module, seed: int, count: int):
    trials = random_trials(seed, count) + targeted_trials(seed) + small_cases(seed)
    spec, data = jobs.encode(trials)
    records, flat = harness.run_trials(module, spec["trials"], data)
    outputs, it = [], iter(flat)
    for trial, steps in zip(trials, records):
        outputs.append([next(it).reshape(s.q.shape) if i < len(steps) and steps[i].get("stored") else None
                        for i, s in enumerate(trial.steps)])
    return compare.compare(trials, records, outputs, compare.expected_outputs(trials))


def check(name: str, KVCache, gqa_attention, seed: int = 0, count: int = 40) -> CheckResult:
    """Run the grader's check ``name`` (one of ``NAMES``) on an implementation of the NumPy contract.

    Raises:
        ValueError: an unknown ``name``.
    """
    if name not in NAMES:
        raise ValueError(f"name must be one of {', '.join(NAMES)}; got {name!r}")
    module = types.SimpleNamespace(KVCache=KVCache, gqa_attention=gqa_attention)
    if name == "in_place":
        result = evaluate.in_place(_probe(harness.probe_in_place, module))
    elif name == "overflow_atomic":
        result = evaluate.overflow(_probe(harness.probe_overflow, module))
    else:
        comparison = _comparison(module, seed, count)
        if name == "head_mapping":
            result = evaluate.head_mapping(comparison)
        elif name == "padding":
            result = evaluate.padding(comparison)
        else:
            kind, label = CORRECTNESS[name]
            result = evaluate.correctness(name, comparison.of_kind(kind), label)
    return CheckResult(name, result.status == "pass", result.evidence, result.mistakes)


def _probe(fn, module):
    try:
        return fn(module)
    except Exception as exc:  # the implementation under test failed inside the probe
        return {"error": {"type": type(exc).__name__, "message": str(exc)[:300]}}
