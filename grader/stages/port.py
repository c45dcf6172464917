"""The PyTorch port's line: the registry's output and measured criteria decided on the port's own session.

The port is one criterion of the rubric (``torch_port``), worth points, and any mistake named in it caps the
tier (``rubric.toml``'s ``port_mistake_cap``). It passes when every one of its criteria does; a port right
nowhere is unfinished (0 points, caps nothing); a port that works somewhere but whose memory or growth
probe gave no clean figure caps the tier as a measured mistake would.
"""
from __future__ import annotations

from grader.stages import criteria as criteria_mod, diagnose, registry
from grader.stages.criteria import Criterion
from grader.stages.verdicts import Status
from grader.stages.evidence import MALFORMED, Evidence, outputs_by_trial, probe_runs, trials_section

# The registry's criteria the port is judged by, beside the NumPy part's.
PORT_CRITERIA = tuple(cid for cid, spec in registry.REGISTRY.items() if spec.port)


def judge(session, plan, expected, weak_when_wrong=()) -> tuple[Criterion, dict]:
    """``(the port's criterion, {mistake: evidence} named in it)`` from the port's session (None: not run).

    ``weak_when_wrong``: the rubric's criteria whose silently wrong outputs make a NumPy part Weak; in a port
    that works somewhere, they cap the tier as a named mistake would, named or not."""
    trials = plan.trials
    if session is None:
        return Criterion("torch_port", Status.ERROR, "the port was not run"), {}
    try:
        answer, comparison, outputs = trials_section(session, "torch", trials, expected, plan)
    except MALFORMED as exc:
        return _not_judged(session, plan, f"the port's outputs are malformed: {exc}")
    if answer is None:
        return _not_judged(session, plan, f"kv_cache_torch.py: {comparison}")
    ev = Evidence(backend="torch", comparison=comparison, outputs=outputs_by_trial(trials, outputs),
                  runs=probe_runs(session, "torch", plan), answer=answer, session=session, plan=plan)
    decided = registry.decide_all(ev, ids=PORT_CRITERIA)
    named, _ = diagnose.name_mistakes({c: decided[c] for c in registry.CORRECTNESS}, comparison, ev.outputs)
    measured = {c: decided[c] for c in registry.MEASURED}
    for crit in [*measured.values(), decided["overflow_atomic"]]:
        named.update({m: crit.evidence for m in crit.mistakes})
    failed = failures(decided.values())
    if named or failed:
        worked = _worked(session, plan, comparison)
        first = next((f"{c.id}: {c.evidence}" for c in failed), "")
        text = (f"port mistakes: {', '.join(sorted(named)) or 'none named'}" if worked or named else
                "unfinished: no hidden trial gives a right output (0 points; it hides nothing, so it caps nothing)")
        text += f"; {first}" if first else ""
        result = Criterion("torch_port", Status.FAIL, text, sorted(named))
        # A port that works somewhere but whose memory or growth probe gave no clean figure caps the tier as
        # a measured mistake would: else raising at the probes' size, or a scratch buffer that lifts the
        # prefill past its limit, would hide a repeat or a copy. A port right nowhere hides nothing: it is
        # unfinished, graded 0 without a cap (deleting it would do as well).
        unclear = _unclear(measured)
        if unclear and (worked or _hung(session)):
            result.caps = f"the port's {', '.join(unclear)} probe gave no clean figure: it could not be measured"
        # Silently wrong where a NumPy part would be Weak, in a pattern no catalogued mistake names (a blurred
        # mask, an output of the wrong type): a hidden mistake must not cap less than a named one.
        silent = [c.id for c in failed if c.silent and c.id in weak_when_wrong]
        if silent and worked and not named and not result.caps:
            result.caps = f"the port's {', '.join(silent)} returns wrong outputs without an error, in no named pattern"
        return result, named
    evidence = (f"{len(comparison.steps)} steps match the reference; "
                + "; ".join(c.evidence for c in measured.values()))
    return Criterion("torch_port", Status.PASS, evidence), {}


def failures(crits) -> list:
    """The port's criteria that fail it: each failure, and each error but a refused chunked prefill (the
    port's choice) and a figure no run can judge (a live length whose cache's making outweighs the decode
    steps: the evidence says so, and the port's points stand)."""
    return [c for c in crits if c.status == Status.FAIL
            or (c.status == Status.ERROR and c.id != "chunked_prefill" and not c.unjudgeable)]


def _not_judged(session, plan, why: str) -> tuple[Criterion, dict]:
    """The port's hidden trials gave no answer: its probes still count. A repeat or a copy they measured is
    named (and caps the tier); a probe that could not measure either caps it too, as a port that ran
    nothing could otherwise hide a repeat by failing only where the outputs are judged."""
    measured = registry.decide_all(Evidence(backend="torch", runs=probe_runs(session, "torch", plan)),
                                   ids=registry.MEASURED)
    named = {m: c.evidence for c in measured.values() for m in c.mistakes}
    if named:
        return Criterion("torch_port", Status.FAIL, f"{why}; port mistakes: {', '.join(sorted(named))}", sorted(named)), named
    result = Criterion("torch_port", Status.ERROR, why)
    unclear = _unclear(measured)
    if unclear and (_worked(session, plan) or _hung(session)):  # it ran at the probes' sizes: as in judge
        result.caps = f"the port ran no hidden trial and its {', '.join(unclear)} probe gave no clean figure"
    return result, {}


def _worked(session, plan, comparison=None) -> bool:
    """Whether the port's attention gave a right output anywhere: a hidden step of a criterion's kind, or
    a probe's decode (its output checked whatever the hidden trials showed), so being wrong only where
    outputs are judged does not make a port that attends at the probes' sizes "unfinished". Appends
    alone do not count: a port whose attention is not written yet is unfinished."""
    kinds = ("decode", "full_prefill", "chunked_prefill", "ragged")
    if comparison is not None and any(st.status == "ok" and st.kind in kinds for st in comparison.steps):
        return True
    return any(probe.purpose != "grow" and criteria_mod.probe_failure(task, built, True) == ""
               for runs in probe_runs(session, "torch", plan).values() for probe, task, built in runs)


def _hung(session) -> bool:
    """Whether the port's session was cut short: a run stopped at its time limit, or the session ended
    before its tasks did (killed, its sandbox ended). Such a port may hide anything at the probes' sizes,
    so it is not taken for an unfinished one (a port that only raises ends every run normally)."""
    return any(t.stopped == "timeout" for t in session.tasks.values()) or bool(session.reason)


def _unclear(measured: dict) -> list[str]:
    """The Hire-tier measured criteria (growth, repeat) that neither passed nor named a mistake."""
    return [c.id for c in measured.values()
            if c.id != "live_length" and c.status in (Status.ERROR, Status.FAIL) and not c.mistakes]
