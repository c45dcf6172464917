"""The one registry of criteria: what each means, what it reads, and the function that decides it.

A criterion is an entry: its id, its title, the evidence it reads (in words, for the docs and the
reports' readers), the criteria it needs decided first, and ``decide(evidence, decided)``, which
returns a :class:`~grader.stages.criteria.Criterion` from the parent's evidence alone. Points and tiers
are the rubric's (``grader/rubric.toml``); reports, the notebook and the learner's checks use these ids
and titles. ``decide_all`` decides every entry in order; the grading pipeline (``grade.py``) and the
port's stage (``port.py``) both call it, on their own session's evidence.

Adding a criterion: an entry here (with its ``decide``, and ``not_in_notebook`` until a cell of the class
notebook grades it), a line in ``grader/rubric.toml``, its tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grader.stages import criteria as criteria_mod
from grader.stages import own_tests, run as run_mod
from grader.stages.criteria import Criterion
from grader.stages.verdicts import Status
from grader.stages.evidence import Evidence


@dataclass(frozen=True)
class CriterionSpec:
    """One criterion: what it means and what decides it (points and tier are the rubric's)."""

    id: str
    title: str
    reads: tuple  # step kinds ("decode", ...), trial names ("head-map-*"), probes ("probe:grow") or files it reads
    decide: Callable[[Evidence, dict], Criterion]
    needs: tuple = ()  # criteria this one reads, decided before it
    section: str = "numpy"  # "numpy", or "torch" for the port's own line
    port: bool = False  # decided again on the port's evidence, inside the port's line
    not_in_notebook: str = ""  # why no cell of the class notebook grades it ("": a graded cell does)


# Step kinds of the criteria decided by comparing outputs step by step, and how the evidence names them.
OUTPUT_KINDS = {"decode": "decode", "full_prefill": "full_prefill", "chunked_prefill": "chunked_prefill",
                "ragged_rows": "ragged"}
WHAT = {"decode": "decode", "full_prefill": "full prefill", "chunked_prefill": "chunked prefill",
        "ragged": "ragged-row"}


def _steps(ev: Evidence, cid: str) -> list:
    return ev.comparison.of_kind(OUTPUT_KINDS[cid])


def _output_check(cid: str):
    def decide(ev: Evidence, decided: dict) -> Criterion:
        return criteria_mod.correctness(cid, _steps(ev, cid), WHAT[OUTPUT_KINDS[cid]])
    return decide


def _chunked_prefill(ev: Evidence, decided: dict) -> Criterion:
    # A refusal of chunked prefill means something only from code whose decode and full prefill work:
    # an attention that raises everywhere (an unwritten function) has refused nothing.
    may_refuse = all(decided[k].status == Status.PASS for k in ("decode", "full_prefill"))
    refusable = [s for s in ev.comparison.steps if s.chunk_after_prefix and s.kind not in ("structure", "edge")]
    return criteria_mod.correctness("chunked_prefill", _steps(ev, "chunked_prefill"), WHAT["chunked_prefill"],
                                    refusable=refusable if may_refuse else None)


def chunks_refused(decided: dict) -> bool:
    """Whether chunked prefill was refused with a clear error (its criterion is ``not_attempted``)."""
    return decided.get("chunked_prefill") is not None and decided["chunked_prefill"].status == Status.NOT_ATTEMPTED


def _ragged_rows(ev: Evidence, decided: dict) -> Criterion:
    steps = _steps(ev, "ragged_rows")
    refused = chunks_refused(decided)
    if refused:
        # A refusal is charged once, to chunked prefill: ragged rows are judged on the calls it does
        # not touch (ragged prefill into empty rows, decode, zero-token rows, padded slots). It may be
        # keyed on the call's width: a call of T > 1 after cached tokens is T < S, padded or not.
        steps = [s for s in steps if not s.chunk_after_prefix
                 and not (s.wide_after_prefix and criteria_mod.refused_clearly(s))]
    crit = criteria_mod.correctness("ragged_rows", steps, WHAT["ragged"])
    if refused and crit.status != Status.ERROR:
        crit.evidence += "; chunks after cached tokens, refused, are charged to chunked prefill alone"
    return crit


def outputs_right(decided: dict) -> bool:
    """Whether the hidden trials found the calls the probes make right (decode, full and chunked prefill on
    rows of one length): where they did not, a wrong probe output is that same mistake, not a measurement mode.
    A refused chunked prefill leaves the probes' refused calls out instead (``criteria.probe_failure``)."""
    return all(decided[c].status in (Status.PASS, Status.NOT_ATTEMPTED) for c in ("decode", "full_prefill", "chunked_prefill")
               if c in decided)


def _in_place(ev: Evidence, decided: dict) -> Criterion:
    grow = ev.runs.get("grow", [])
    copy_s = run_mod.copy_seconds(grow[0][0].live_bytes) if grow else 0.0
    return criteria_mod.in_place(grow, explain=ev.explain, check_output=outputs_right(decided), copy_s=copy_s)


def _no_repeat(ev: Evidence, decided: dict) -> Criterion:
    return criteria_mod.no_repeat(ev.runs.get("memory", []), outputs_right(decided), refused=chunks_refused(decided))


def _live_length(ev: Evidence, decided: dict) -> Criterion:
    scan = ev.runs.get("scan", [])
    return criteria_mod.live_length([r for r in scan if r[0].config["reservation"] == "small"],
                                    [r for r in scan if r[0].config["reservation"] == "large"],
                                    outputs_right(decided),
                                    appends_copy=decided["preallocated_in_place"].status == Status.FAIL)


def _cost_model(ev: Evidence, decided: dict) -> Criterion:
    return criteria_mod.cost_model(ev.answer.get("cost") if "cost.py" in ev.files else None, ev.expected_costs)


def _own_tests(ev: Evidence, decided: dict) -> Criterion:
    return own_tests.criterion(ev.session, ev.plan.test_files, ev.plan.own_task, chunks_refused=chunks_refused(decided))


def _torch_port(ev: Evidence, decided: dict) -> Criterion:
    if ev.port is None:
        return Criterion("torch_port", Status.NOT_ATTEMPTED, "no kv_cache_torch.py")
    return ev.port()


UNIFORM_ROWS = ("decode", "full_prefill", "chunked_prefill")

# In the order they are decided (each after what it needs); the report lists them in the rubric's order.
REGISTRY = {spec.id: spec for spec in (
    CriterionSpec("head_mapping", "Query head h reads KV head h // G", ("head-map-*",),
                  lambda ev, decided: criteria_mod.head_mapping(ev.comparison, ev.outputs), port=True),
    CriterionSpec("decode", "Decode (T = 1), rows of one length", ("decode",), _output_check("decode"), port=True),
    CriterionSpec("full_prefill", "Full prefill (T = S), rows of one length", ("full_prefill",),
                  _output_check("full_prefill"), port=True),
    CriterionSpec("chunked_prefill", "Chunked prefill (1 < T < S): bottom-right mask", ("chunked_prefill",),
                  _chunked_prefill, needs=("decode", "full_prefill"), port=True),
    CriterionSpec("ragged_rows", "Ragged rows and zero-token rows", ("ragged",), _ragged_rows,
                  needs=("chunked_prefill",), port=True),
    CriterionSpec("padding", "Padded query slots finite (exactly 0)", ("padded slots of every step",),
                  lambda ev, decided: criteria_mod.padding(ev.comparison), port=True),
    CriterionSpec("preallocated_in_place", "Preallocated cache, written in place at the current length",
                  ("probe:grow",), _in_place, needs=UNIFORM_ROWS, port=True),
    CriterionSpec("no_kv_repeat", "No materialised K/V repeat", ("probe:memory",), _no_repeat, needs=UNIFORM_ROWS,
                  port=True),
    CriterionSpec("live_length", "Attention over the live length, not max_len", ("probe:scan",), _live_length,
                  needs=(*UNIFORM_ROWS, "preallocated_in_place"), port=True,
                  not_in_notebook="measured by timing decode in two reservations, which kvkit grade does"),
    CriterionSpec("overflow_atomic", "Overflow raises and changes nothing", ("overflow", "after_overflow"),
                  lambda ev, decided: criteria_mod.overflow_from_trials(ev.comparison, ev.outputs), port=True),
    CriterionSpec("cost_model", "Cost quantified (cost.py)", ("cost.py",), _cost_model),
    CriterionSpec("own_tests", "Own tests: pass, and catch the chunk-local mask", ("test_*.py",), _own_tests,
                  needs=("chunked_prefill",)),
    CriterionSpec("torch_port", "PyTorch port: right, in place, no repeat", ("kv_cache_torch.py",), _torch_port,
                  section="torch"),
)}
# The criteria decided from outputs (the ones a wrong output fails), and those decided by the kernel's figures.
CORRECTNESS = ("head_mapping", "decode", "full_prefill", "chunked_prefill", "ragged_rows", "padding")
MEASURED = ("preallocated_in_place", "no_kv_repeat", "live_length")


def section(cid: str) -> str:
    """The report section of criterion ``cid``: ``"torch"`` for the port's line, else ``"numpy"``."""
    spec = REGISTRY.get(cid)
    return spec.section if spec else "numpy"


def decide_all(ev: Evidence, ids=None, decided: dict | None = None) -> dict:
    """``{id: Criterion}`` for the entries ``ids`` (default: all), in the registry's order, each after the
    entries it needs (those among ``ids``, or already in ``decided``).

    Raises:
        KeyError: an id that is not in the registry.
    """
    wanted = list(REGISTRY) if ids is None else [cid for cid in REGISTRY if cid in set(ids)]
    unknown = sorted(set(ids or ()) - set(REGISTRY))
    if unknown:
        raise KeyError(f"ids: no criterion {', '.join(unknown)} in the registry")
    done = dict(decided or {})
    for cid in wanted:
        done[cid] = REGISTRY[cid].decide(ev, done)
    return {cid: done[cid] for cid in wanted}
