"""The grader's checks, run in-process on an implementation you hand it.

For the classroom notebook's hidden tests (nbgrader runs the student's code in
its kernel anyway) and for quick self-checks: the same trials, oracle and
criteria as ``kvkit grade``, without the sandbox. Never use this on code you do
not trust; the grader proper runs submissions in a child process.

    from grader.inprocess.checks import check
    result = check("chunked_prefill", KVCache, gqa_attention)
    assert result.passed, result.message
"""
from __future__ import annotations

import types
import warnings
from dataclasses import dataclass

import numpy as np

from grader.stages import compare, criteria, jobs

from grader.inprocess import meters
from grader.child import tasks as child_tasks
from grader.stages.suite import random_trials, small_cases, targeted_trials

CORRECTNESS = {
    "decode": ("decode", "decode"),
    "full_prefill": ("full_prefill", "full prefill"),
    "chunked_prefill": ("chunked_prefill", "chunked prefill"),
    "ragged_rows": ("ragged", "ragged-row"),
}
# Each check is named by the criterion id it decides (grader.stages.registry.REGISTRY), but two of the notebook's own.
NAMES = (*CORRECTNESS, "ragged_rows_unchunked", "head_mapping", "padding", "preallocated_in_place", "overflow_atomic",
         "no_kv_repeat", "torch_ops")


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
    # The padding criterion finds NaN itself; warnings would only add noise (and cost nbgrader points).
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        records, flat = child_tasks.run_trials(module, spec["trials"], data)
    outputs, it = [], iter(flat)
    for trial, steps in zip(trials, records):
        outputs.append([next(it).reshape(s.q.shape) if i < len(steps) and steps[i].get("stored") else None
                        for i, s in enumerate(trial.steps)])
    return compare.compare(trials, records, outputs, compare.expected_outputs(trials))


def _without_chunk_after_cache(step) -> bool:
    """A step a chunk-local mask still gets right: T = 1, or every row receiving tokens was empty before."""
    trial, call = step.trial, step.trial.steps[step.index]
    before = sum((s.n_new for s in trial.steps[:step.index]), np.zeros(trial.B, dtype=np.int64))
    return call.q.shape[2] == 1 or not ((call.n_new > 0) & (before > 0)).any()


def check(name: str, KVCache, gqa_attention, seed: int = 0, count: int = 40) -> CheckResult:
    """Run the grader's check ``name`` (one of ``NAMES``) on an implementation of the NumPy contract.

    ``ragged_rows_unchunked`` is ``ragged_rows`` restricted to steps without a
    chunk after cached tokens, so a chunk-local mask does not fail it (the
    notebook grades the two apart). ``torch_ops`` takes the PyTorch port's
    ``KVCache``/``gqa_attention`` and judges the ops they run.

    Raises:
        ValueError: an unknown ``name``.
    """
    return check_all([name], KVCache, gqa_attention, seed, count)[name]


def check_all(names, KVCache, gqa_attention, seed: int = 0, count: int = 40) -> dict:
    """``{name: CheckResult}`` for several of ``check``'s names at once: the checks of outputs share one
    run of the trials (``check`` on each name would run them again each time).

    Raises:
        ValueError: an unknown name among ``names`` (before anything runs).
    """
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"name must be one of {', '.join(NAMES)}; got {unknown[0]!r}")
    module = types.SimpleNamespace(KVCache=KVCache, gqa_attention=gqa_attention)
    shared: dict = {}

    def comparison():
        if "run" not in shared:
            shared["run"] = _comparison(module, seed, count)
        return shared["run"]

    return {name: _decide(name, module, comparison) for name in names}


def _decide(name: str, module, comparison) -> CheckResult:
    """One check; ``comparison()`` gives the outputs of the trials compared with the oracle."""
    if name == "preallocated_in_place":
        result = meters.judge_in_place(_probe(meters.probe_in_place, module))
    elif name == "overflow_atomic":
        result = criteria.overflow(_probe(child_tasks.probe_overflow, module))
    elif name == "no_kv_repeat":
        result = meters.judge_repeat(_probe(meters.probe_repeat, module))
    elif name == "torch_ops":
        import torch

        ops = _probe(lambda m: meters.probe_torch_ops(m, torch), module)
        named = meters.judge_torch_ops(ops) if "error" not in ops else {"error": ops["error"]["message"]}
        result = criteria.Criterion("torch_ops", "fail" if named else "pass",
                                    "; ".join(f"{m}: {why}" for m, why in named.items())
                                    or "append writes in place; attention copies no K/V",
                                    [m for m in named if m != "error"])
    else:
        comparison = comparison()
        if name == "head_mapping":
            result = criteria.head_mapping(comparison)
        elif name == "padding":
            result = criteria.padding(comparison)
        elif name == "ragged_rows_unchunked":
            steps = [s for s in comparison.of_kind("ragged") if _without_chunk_after_cache(s)]
            result = criteria.correctness(name, steps, "ragged-row (decode or first chunk)")
        else:
            kind, label = CORRECTNESS[name]
            result = criteria.correctness(name, comparison.of_kind(kind), label)
    return CheckResult(name, result.status == "pass", result.evidence, result.mistakes)


def torch_as_numpy(KVCache, gqa_attention):
    """``(KVCache, gqa_attention)`` of a PyTorch port wrapped to take and return NumPy arrays (CPU).

    So the port can go through every other check: ``check("decode", *torch_as_numpy(C, f))``.
    """
    import torch

    facing = child_tasks.numpy_facing(types.SimpleNamespace(KVCache=KVCache, gqa_attention=gqa_attention), torch)
    return facing.KVCache, facing.gqa_attention


def _probe(fn, module):
    try:
        return fn(module)
    except Exception as exc:  # the implementation under test failed inside the probe
        return {"error": {"type": type(exc).__name__, "message": str(exc)[:300]}}
