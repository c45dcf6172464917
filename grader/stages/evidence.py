"""Collect the evidence of one implementation's session: its hidden trials compared, its probes' runs.

Everything here is read in the parent from what the sandbox sent back, as data: the trials task's records
and outputs (compared with the oracle by ``compare``) and each probe's task with the kernel's figures
between its marks. A criterion reads only an :class:`Evidence` (``grader.stages.registry``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from grader.stages import compare, jobs, run as run_mod
from grader.stages.compare import Comparison

# What reading the child's answers may raise: they are data written by untrusted code.
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError)


@dataclass
class Evidence:
    """What one implementation's session left in the parent: everything a criterion may read.

    ``comparison`` is None when the hidden trials gave no answer (only the probes count then).
    ``runs`` is ``{probe purpose: [(probe, task, built), ...]}`` (``grader.stages.probes``).
    ``explain``: what in-process meters saw, for the evidence text only (never a verdict).
    ``port``: decides the port's line from its own session (None: no port handed in).
    """

    backend: str = "numpy"
    comparison: Comparison | None = None
    outputs: dict = field(default_factory=dict)  # trial name -> the outputs of its steps
    runs: dict = field(default_factory=dict)
    answer: dict = field(default_factory=dict)  # the trials task's answer: cost figures, bad-input probes
    files: list = field(default_factory=list)
    session: object = None
    plan: object = None
    expected_costs: dict = field(default_factory=dict)
    explain: list = field(default_factory=list)
    port: Callable | None = None


def outputs_by_trial(trials, outputs) -> dict:
    """``{trial name: its outputs}``."""
    return {t.name: out for t, out in zip(trials, outputs)}


def probe_runs(session, backend: str, plan) -> dict:
    """``{purpose: [(probe, task, built), ...]}`` for one session's probes (``grader.stages.probes``); a probe
    whose task did not run has ``task`` None."""
    runs: dict = {}
    built = run_mod.job_data(plan)[3]
    for probe in plan.probes:
        task = session.tasks.get(run_mod.probe_task(plan, backend, probe.name)) if session else None
        runs.setdefault(probe.purpose, []).append((probe, task, built[probe.name]))
    return runs


def trials_section(session, backend: str, trials, expected, plan):
    """``(answer, comparison, outputs)`` of a session's trials task, or ``(None, reason, None)``.

    Raises:
        One of ``MALFORMED``: the answer breaks the protocol (only the submission's process can make it so).
    """
    task = session.tasks.get(run_mod.probe_task(plan, backend, "trials"))
    if task is None or task.answer is None:
        why = (task.why() if task else "") or session.reason or "the trials did not run"
        return None, why, None
    answer = task.answer
    if answer.get("import"):
        err = answer["import"]
        return None, f"failed to import: {err.get('type')}: {err.get('message')}", None
    if "error" in answer:
        err = answer["error"]
        return None, f"the trials raised {err.get('type')}: {err.get('message')}", None
    outputs = jobs.split_outputs(task.blob, trials, answer.get("records"))
    return answer, compare.compare(trials, answer["records"], outputs, expected), outputs
