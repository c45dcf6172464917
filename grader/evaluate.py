"""From measurements to criteria: each rubric criterion's status, evidence and mistakes.

Every function here reads data the parent already holds (step verdicts from
``compare``, probe measurements the child reported) and decides one criterion.
Nothing is guessed from source. Thresholds, with their reasons:

* ``concat_growth``: the buffers are replaced, or a one-token append allocates
  at least a quarter of the live K/V (an in-place write allocates O(new tokens)).
* ``kv_repeat``: decode at G = 8 allocates at least G/2 times the live K/V
  (a repeat of K alone is G/2 times; an honest copy of K and V is 1 time).
* ``max_len_scan``: the same live length is at least 2x slower in a 32x larger
  reservation (a scan of the reservation is 3x to 30x, by how much of a call is
  per-call overhead; honest code measures 0.9x to 1.1x).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grader.compare import Comparison, StepVerdict, first_failure

REPEAT_FACTOR = 0.5  # of G x live K/V bytes
GROWTH_FRACTION = 0.25  # of live K/V bytes, for one one-token append
SCAN_RATIO = 2.0


@dataclass
class Criterion:
    """One rubric line: ``status`` is pass, fail, not_attempted or error."""

    id: str
    status: str
    evidence: str
    mistakes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _where(step: StepVerdict) -> str:
    """A failing step's configuration, in words, with no hidden value."""
    return f"step {step.index + 1} of trial '{step.trial.name}' ({step.trial.describe()})"


def _refused(step: StepVerdict) -> bool:
    return step.status == "raised" and bool(step.error and step.error.get("value_error")) \
        or (step.status == "raised" and (step.error or {}).get("type") == "NotImplementedError")


def correctness(cid: str, steps: list[StepVerdict], what: str, allow_refusal: bool = False) -> Criterion:
    """pass when every step in ``steps`` matches the oracle on its real query slots.

    Steps never run (an earlier append of their trial failed) are no evidence
    either way and are left out; the failed append is itself a failing step.
    """
    steps = [s for s in steps if s.status != "not_run"]
    if not steps:
        return Criterion(cid, "error", f"no {what} step was run")
    bad = first_failure(steps)
    if bad is None:
        worst = max(s.max_error for s in steps)
        return Criterion(cid, "pass", f"{len(steps)} {what} steps match the direct reference (max error {worst:.1e})")
    failing = [s for s in steps if s.status != "ok"]
    if allow_refusal and all(_refused(s) for s in failing):
        return Criterion(cid, "not_attempted",
                         f"{what} refused with a clear error ({bad.error.get('type')}: {bad.error.get('message')})")
    how = {"wrong": f"wrong output (max error {bad.max_error:.1e})", "raised": bad.detail,
           "bad_output": bad.detail, "not_run": bad.detail}[bad.status]
    return Criterion(cid, "fail", f"{len(failing)} of {len(steps)} {what} steps fail; first: {_where(bad)}: {how}")


def head_mapping(comparison: Comparison) -> Criterion:
    """Single-token rows in real checkpoint layouts: the output of head h is v of the head it reads."""
    result = correctness("head_mapping", comparison.in_trials("head-map-"), "single-token head-layout")
    if result.status == "pass":
        result.evidence = ("one-token rows in layouts Hq/Hkv = 32/8, 48/2, 64/8, 16/4, 8/2, 4/1, 4/4: "
                           "query head h returns v of KV head h // G")
    return result


def padding(comparison: Comparison) -> Criterion:
    """Padded slots and zero-token rows: finite required, exactly 0 asked for."""
    padded = [s for s in comparison.steps if s.padding != "none"]
    if not padded:
        return Criterion("padding", "error", "no step with padded slots returned an output")
    nonfinite = [s for s in padded if s.padding == "nonfinite"]
    if nonfinite:
        return Criterion("padding", "fail", f"{len(nonfinite)} of {len(padded)} steps with padded slots or "
                         f"zero-token rows return NaN or inf there; first: {_where(nonfinite[0])}",
                         mistakes=["nan_padding"])
    result = Criterion("padding", "pass", f"{len(padded)} steps with padded slots or zero-token rows: all finite")
    finite = [s for s in padded if s.padding == "finite"]
    if finite:
        result.notes.append(f"padded slots are finite but not exactly 0 in {len(finite)} steps "
                            f"(the contract asks for 0)")
    else:
        result.evidence += " and exactly 0"
    return result


def edge_cases(comparison: Comparison) -> list[str]:
    """Notes on B = 0, the all-empty cache and T = 0 (zeros of shape [B, Hq, T, d])."""
    notes = []
    for prefix, label in (("empty-batch", "B = 0"), ("all-empty-cache", "an all-empty cache"), ("no-slots", "T = 0")):
        bad = first_failure([s for s in comparison.in_trials(prefix) if s.kind == "edge"])
        if bad is not None:
            notes.append(f"{label}: {bad.detail or 'wrong output'}")
    return notes


def dtype_notes(comparison: Comparison) -> list[str]:
    wrong = [s for s in comparison.steps if s.status in ("ok", "wrong") and not s.dtype_ok]
    return [f"output dtype differs from q's in {len(wrong)} steps (the contract: q's dtype)"] if wrong else []


def in_place(probe, label: str = "append", comparison: Comparison | None = None) -> Criterion:
    """Buffer identity and bytes allocated per one-token append; identity in every hidden trial too."""
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("preallocated_in_place", probe)
    moved = [s for s in comparison.steps if s.buffers_moved] if comparison else []
    if moved:
        return Criterion("preallocated_in_place", "fail", f"K/V buffers replaced by new objects in "
                         f"{len({s.trial.name for s in moved})} hidden trials; first: {_where(moved[0])}",
                         mistakes=["concat_growth"])
    allocs = probe.get("allocs") or []
    grown = [a for a in allocs if a[1] >= GROWTH_FRACTION * a[2]]
    figures = ", ".join(f"{a[1]:,} B at {a[0]:,} tokens" for a in allocs)
    if not probe.get("same_objects") or grown:
        why = "K/V buffers replaced by new objects" if not probe.get("same_objects") else \
            "a one-token append allocates memory that grows with the cache"
        return Criterion("preallocated_in_place", "fail", f"{why} ({figures} allocated per {label})",
                         mistakes=["concat_growth"])
    return Criterion("preallocated_in_place", "pass",
                     f"buffers are the same objects after every append; one-token append allocates {figures}")


def no_repeat(probe) -> Criterion:
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("no_kv_repeat", probe)
    peak, live, G = probe["peak_bytes"], probe["live_kv_bytes"], probe["G"]
    ratio = peak / live
    if peak >= REPEAT_FACTOR * G * live:
        return Criterion("no_kv_repeat", "fail", f"decode at G = {G} allocates {ratio:.1f}x the live K/V "
                         f"({peak:,} B against {live:,} B): K/V materialised per query head",
                         mistakes=["kv_repeat"])
    return Criterion("no_kv_repeat", "pass", f"decode at G = {G} allocates {ratio:.2f}x the live K/V "
                     f"({peak:,} B; a repeat would be {G}x)")


def overflow(probe) -> Criterion:
    if not isinstance(probe, list) or not probe or not all(isinstance(o, dict) for o in probe):
        return _probe_error("overflow_atomic", probe)
    for o in probe:
        raised = o.get("raised")
        case = f"rows holding {o.get('lens_before')} of max_len 8, n_new={o.get('n_new')}"
        if o.get("lens_after") != o.get("lens_before"):
            return Criterion("overflow_atomic", "fail", f"failed append changed lens from {o.get('lens_before')} "
                             f"to {o.get('lens_after')} ({case})", mistakes=["length_before_write"])
        if not raised:
            return Criterion("overflow_atomic", "fail", f"an append past max_len raised nothing ({case})")
        if raised.get("type") != "ValueError" and not raised.get("value_error"):
            return Criterion("overflow_atomic", "fail", f"overflow raised {raised.get('type')}, not ValueError ({case})")
        if o.get("data_changed"):
            return Criterion("overflow_atomic", "fail", f"failed append wrote rows before raising ({case})")
    return Criterion("overflow_atomic", "pass", "an append that overflows one row raises ValueError "
                     "and leaves lens and every row unchanged (first and last row tried)")


def live_length(probe) -> Criterion:
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("live_length", probe)
    small, large = probe["small_s"], probe["large_s"]
    ratio = large / small if small > 0 else float("inf")
    text = (f"decode at {probe.get('live', '?')} live tokens: {large * 1e6:.0f} us in a "
            f"{probe['reservation_ratio']}x larger reservation vs {small * 1e6:.0f} us ({ratio:.1f}x)")
    if ratio >= SCAN_RATIO:
        return Criterion("live_length", "fail", text + ": attention scans max_len", mistakes=["max_len_scan"])
    return Criterion("live_length", "pass", text)


def cost_model(probe, expected: dict) -> Criterion:
    """``probe`` maps each call label to what the submission's cost.py returned."""
    if probe is None:
        return Criterion("cost_model", "not_attempted", "no cost.py")
    if not isinstance(probe, dict) or "error" in probe:
        return _probe_error("cost_model", probe)
    wrong = []
    for label, want in expected.items():
        got = probe.get(label)
        ok = isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))
        if not ok:
            wrong.append(f"{label} gave {got!r}, expected {want!r}")
    if wrong:
        return Criterion("cost_model", "fail", f"{len(wrong)} of {len(expected)} figures wrong; first: {wrong[0]}")
    return Criterion("cost_model", "pass", f"all {len(expected)} figures of the cost table reproduced")


def input_errors(probe) -> list[str]:
    """Notes for bad inputs that raise nothing, or something other than ValueError/TypeError."""
    if not isinstance(probe, dict) or "error" in probe:
        return []
    notes = []
    for case, outcome in probe.items():
        raised = outcome.get("raised") if isinstance(outcome, dict) else None
        if not raised:
            notes.append(f"bad input '{case}' raised nothing")
        elif not raised.get("value_error"):
            notes.append(f"bad input '{case}' raised {raised.get('type')}, not ValueError/TypeError")
    return notes


def torch_ops(ops: dict) -> dict:
    """``{mistake: evidence}`` from the ops a port ran (``harness.probe_torch_ops``).

    ``concat_growth``: append runs ``cat``/``stack`` or the buffers move.
    ``kv_repeat``: attention runs a non-view op whose output has at least G times
    the live K elements, or a ``repeat``/``repeat_interleave`` as large as K.
    Views (``alias_info`` in the op's schema) cost nothing and are ignored.
    """
    named = {}
    grew = sorted({op[0] for op in ops.get("append_ops", []) if op[0] in ("cat", "stack")})
    if grew or not ops.get("same_storage"):
        named["concat_growth"] = "append runs " + (", ".join(grew) or "into new storage (the buffers moved)")
    big, live = ops["G"] * ops["live_k_numel"], ops["live_k_numel"]
    copies = [op for op in ops.get("attention_ops", [])
              if not op[2] and (op[1] >= big or (op[0] in ("repeat_interleave", "repeat") and op[1] >= live))]
    if ops["G"] > 1 and copies:
        named["kv_repeat"] = (f"attention runs aten.{copies[0][0]} with an output of {copies[0][1]:,} elements "
                              f"(live K: {live:,}, G = {ops['G']})")
    return named


def _probe_error(cid: str, probe) -> Criterion:
    if isinstance(probe, dict) and "error" in probe:
        err = probe["error"]
        return Criterion(cid, "error", f"the check raised {err.get('type')}: {err.get('message')}")
    return Criterion(cid, "error", "the check did not report (the child died or was stopped before it)")
