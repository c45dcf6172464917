"""Grade one submission: the flow suite -> run -> compare -> criteria -> diagnose -> rubric -> report.

Lay the submission out in a fresh directory (refusing files that would shadow
an installed module); build the hidden suite (``suite``); run it and the probes
in the sandbox, one session per implementation (``run``); compare every output
with the oracle in this process (``compare``); decide each criterion from
those comparisons and from the kernel's measurements (``criteria``); name
mistakes (``diagnose``); apply the rubric (``rubric``); build the report
(schema ``kvkit.report/1``, see docs/report.md).
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass, field

from catalogue import mutants as catalogue_mutants
from grader import KIT_ROOT
from grader.stages import compare, costs, criteria as criteria_mod, diagnose, jobs, own_tests as owntests, probes as probes_mod, run as run_mod, suite
from grader.stages import report as report_mod
from grader.stages import rubric as rubric_mod
from grader.sandbox import launch
from grader.stages.layout import (SubmissionError, laid_out_sha256, materialize, missing_module, name_of,
                               provide_helpers, sandbox_refusal, set_aside_bundle, shadowing)

CATALOGUE = os.path.join(KIT_ROOT, "catalogue")
SCHEMA = report_mod.SCHEMA
# The cost table's inputs plus a second set (grader/shipped/cost_table.py), so no figure can be typed in (grader/stages/costs.py).
COST_CALLS = costs.figures()["calls"]


def load_catalogue() -> tuple[dict, list]:
    """``(mistakes, general_questions)`` from catalogue/mistakes.toml and interview.toml.

    The Gradescope bundle ships no interviewer text: no interview.toml (no general questions) and no
    ``question``/``answer`` in mistakes.toml (``follow_ups`` then asks nothing).
    """
    with open(os.path.join(CATALOGUE, "mistakes.toml"), "rb") as f:
        mistakes = tomllib.load(f)
    general = []
    if os.path.exists(os.path.join(CATALOGUE, "interview.toml")):
        with open(os.path.join(CATALOGUE, "interview.toml"), "rb") as f:
            general = tomllib.load(f)["general"]
    return mistakes, general


FULL_TRIALS = suite.FULL_TRIALS


@dataclass
class Options:
    """How to grade: the seed of the hidden trials, limits, rubric, isolation."""

    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**31))
    timeout: float = 60.0
    trials: int = FULL_TRIALS
    rubric: rubric_mod.Rubric = field(default_factory=rubric_mod.load)
    isolation: object = None  # grader.isolation.Isolation, or None for the plain child


def expected_costs() -> dict:
    return costs.figures()["expected"]


def _outputs_by_trial(trials, outputs) -> dict:
    return {t.name: out for t, out in zip(trials, outputs)}


def _correctness_criteria(comparison, outputs_by_trial) -> dict:
    """The criteria decided from outputs, as the registry (``criteria.REGISTRY``) says."""
    refusable = [s for s in comparison.steps if s.chunk_after_prefix and s.kind not in ("structure", "edge")]
    c = {"head_mapping": criteria_mod.head_mapping(comparison, outputs_by_trial)}
    for cid, kind in criteria_mod.OUTPUT_CHECKS.items():
        # A refusal of chunked prefill means something only from code whose decode and full prefill work:
        # an attention that raises everywhere (an unwritten function) has refused nothing.
        may_refuse = cid == "chunked_prefill" and all(c[k].status == "pass" for k in ("decode", "full_prefill"))
        steps = comparison.of_kind(kind)
        refused = c.get("chunked_prefill") is not None and c["chunked_prefill"].status == "not_attempted"
        if cid == "ragged_rows" and refused:
            # A refusal is charged once, to chunked prefill: ragged rows are judged on the calls it does
            # not touch (ragged prefill into empty rows, decode, zero-token rows, padded slots). It may be
            # keyed on the call's width: a call of T > 1 after cached tokens is T < S, padded or not.
            steps = [s for s in steps if not s.chunk_after_prefix
                     and not (s.wide_after_prefix and criteria_mod.refused_clearly(s))]
        c[cid] = criteria_mod.correctness(cid, steps, criteria_mod.WHAT[kind],
                                          refusable=refusable if may_refuse else None)
        if cid == "ragged_rows" and refused and c[cid].status != "error":
            c[cid].evidence += "; chunks after cached tokens, refused, are charged to chunked prefill alone"
    c["padding"] = criteria_mod.padding(comparison)
    return c


CORRECTNESS = ("head_mapping", *criteria_mod.OUTPUT_CHECKS)


def _name_mistakes(criteria: dict, comparison, outputs_by_trial) -> tuple[dict, "diagnose.Diagnosis"]:
    """``({mistake: evidence}, diagnosis)``: measured mistakes, then what the outputs show.

    Mask, head-map and storage mistakes come from the structure recovered with
    ``q = 0`` (``diagnose.recover``), and only when a hidden check of outputs
    fails; ``missing_scale`` from exact reproduction. Nothing by elimination. A
    mistake of a uniform-rows check (decode, full or chunked prefill) is named
    only when that check fails.
    """
    named = {}
    for crit in criteria.values():
        for m in crit.mistakes:
            named.setdefault(m, crit.evidence)
    diagnosed = set()  # the names the outputs gave (recovered structure, reproduction), not a criterion
    diagnosis = diagnose.Diagnosis(wrong_outputs=any(s.status == "wrong" for s in comparison.steps
                                                     if s.kind != "structure"))
    if any(criteria[c].status == "fail" for c in CORRECTNESS if c in criteria):
        diagnosis = diagnose.recover(comparison, outputs_by_trial)
        diagnosis.wrong_outputs = any(s.status == "wrong" for s in comparison.steps if s.kind != "structure")
        # Exact reproduction on the hidden trials: missing_scale always (q = 0 cannot show it); the structural
        # mistakes only when the structure trials came out right, as code that behaves differently at q = 0 does.
        reproduce = tuple(diagnose.REPRODUCED) if diagnosis.wrong_queries == 0 else ("missing_scale",)
        shown = {**diagnosis.named, **diagnose.match_mutants(comparison, outputs_by_trial, mistakes=reproduce)}
        diagnosed = set(shown) - set(named)
        named.update(shown)
    # A mistake of a check judged on uniform rows (decode, full prefill, chunked prefill: the one that can
    # make a verdict Weak) is named only when that check fails there: not from ragged rows alone (a mask
    # offset wrong only on ragged rows is a ragged-rows matter), nor after a clear refusal of chunked prefill.
    mistakes_doc, _ = load_catalogue()
    uniform_checks = [cid for cid, kind in criteria_mod.OUTPUT_CHECKS.items() if kind in compare.UNIFORM]
    for m in sorted(diagnosed):
        cid = mistakes_doc.get(m, {}).get("criterion")
        if cid in uniform_checks and criteria[cid].status != "fail":
            named.pop(m, None)
    # Attach each name to the criterion the catalogue files it under.
    for m in named:
        cid = mistakes_doc.get(m, {}).get("criterion")
        if cid in criteria and m not in criteria[cid].mistakes:
            criteria[cid].mistakes.append(m)
    return named, diagnosis


def _probe_runs(session, backend: str, plan) -> dict:
    """``{purpose: [(probe, task, built), ...]}`` for one session's probes (``grader.stages.probes``)."""
    runs: dict = {}
    built = run_mod.job_data(plan)[3]
    for probe in plan.probes:
        task = session.tasks.get(run_mod.probe_task(plan, backend, probe.name)) if session else None
        runs.setdefault(probe.purpose, []).append((probe, task, built[probe.name]))
    return runs


def _outputs_right(crits: dict) -> bool:
    """Whether the hidden trials found the calls the probes make right (decode, full and chunked prefill on
    rows of one length): where they did not, a wrong probe output is that same mistake, not a measurement mode.
    A refused chunked prefill leaves the probes' refused calls out instead (``criteria.probe_failure``)."""
    return all(crits[c].status in ("pass", "not_attempted") for c in ("decode", "full_prefill", "chunked_prefill")
               if c in crits)


def _measured_criteria(runs: dict, explain: list, decode_ok: bool = True, refused: bool = False) -> dict:
    """The criteria decided by the kernel's figures (memory, CPU time), each probe's output checked
    (unless the calls are wrong on the hidden trials too: then a wrong probe output is the same mistake).
    ``refused``: chunked prefill was refused with a clear error, so the probes' chunks may be too."""
    scan = runs.get("scan", [])
    grow = runs.get("grow", [])
    copy_s = run_mod.copy_seconds(grow[0][0].live_bytes) if grow else 0.0
    in_place = criteria_mod.in_place(grow, explain=explain, check_output=decode_ok, copy_s=copy_s)
    return {
        "preallocated_in_place": in_place,
        "no_kv_repeat": criteria_mod.no_repeat(runs.get("memory", []), decode_ok, refused=refused),
        "live_length": criteria_mod.live_length([r for r in scan if r[0].config["reservation"] == "small"],
                                                [r for r in scan if r[0].config["reservation"] == "large"],
                                                decode_ok, appends_copy=in_place.status == "fail"),
    }


def _trials_section(session, backend: str, trials, expected, plan):
    """``(answer, comparison, outputs)`` of a session's trials task, or ``(None, reason, None)``."""
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


def _torch_section(session, plan, expected) -> tuple[criteria_mod.Criterion, dict, list]:
    """The port's criterion, the mistakes named in it, and notes."""
    trials = plan.trials
    if session is None:
        return criteria_mod.Criterion("torch_port", "error", "the port was not run"), {}, []
    try:
        answer, comparison, outputs = _trials_section(session, "torch", trials, expected, plan)
    except MALFORMED as exc:
        return _port_not_judged(session, plan, f"the port's outputs are malformed: {exc}")
    if answer is None:
        return _port_not_judged(session, plan, f"kv_cache_torch.py: {comparison}")
    crits = _correctness_criteria(comparison, _outputs_by_trial(trials, outputs))
    named, _ = _name_mistakes(crits, comparison, _outputs_by_trial(trials, outputs))
    measured = _measured_criteria(_probe_runs(session, "torch", plan), [], decode_ok=_outputs_right(crits),
                                  refused=crits["chunked_prefill"].status == "not_attempted")
    overflow = criteria_mod.overflow_from_trials(comparison, _outputs_by_trial(trials, outputs))
    notes = []
    for crit in [*measured.values(), overflow]:
        named.update({m: crit.evidence for m in crit.mistakes})
    failed = port_failures([*crits.values(), *measured.values(), overflow])
    if named or failed:
        worked = _port_worked(session, plan, comparison)
        first = next((f"{c.id}: {c.evidence}" for c in failed), "")
        text = (f"port mistakes: {', '.join(sorted(named)) or 'none named'}" if worked or named else
                "unfinished: no hidden trial gives a right output (0 points; it hides nothing, so it caps nothing)")
        text += f"; {first}" if first else ""
        result = criteria_mod.Criterion("torch_port", "fail", text, sorted(named))
        # A port that works somewhere but whose memory or growth probe gave no clean figure caps the tier as
        # a measured mistake would: else raising at the probes' size, or a scratch buffer that lifts the
        # prefill past its limit, would hide a repeat or a copy. A port right nowhere hides nothing: it is
        # unfinished, graded 0 without a cap (deleting it would do as well).
        unclear = _unclear_measures(measured)
        if unclear and (worked or _hung(session)):
            result.caps = f"the port's {', '.join(unclear)} probe gave no clean figure: it could not be measured"
        return result, named, notes
    evidence = (f"{len(comparison.steps)} steps match the reference; "
                + "; ".join(c.evidence for c in measured.values()))
    return criteria_mod.Criterion("torch_port", "pass", evidence), {}, notes


def port_failures(crits: list) -> list:
    """The port's criteria that fail it: each failure, and each error but a refused chunked prefill (the
    port's choice) and a figure no run can judge (a live length whose cache's making outweighs the decode
    steps: the evidence says so, and the port's points stand)."""
    return [c for c in crits if c.status == "fail"
            or (c.status == "error" and c.id != "chunked_prefill" and not c.unjudgeable)]


def _port_not_judged(session, plan, why: str) -> tuple[criteria_mod.Criterion, dict, list]:
    """The port's hidden trials gave no answer: its probes still count. A repeat or a copy they measured is
    named (and caps the tier); a probe that could not measure either caps it too, as a port that ran
    nothing could otherwise hide a repeat by failing only where the outputs are judged."""
    measured = _measured_criteria(_probe_runs(session, "torch", plan), [])
    named = {m: c.evidence for c in measured.values() for m in c.mistakes}
    if named:
        return (criteria_mod.Criterion("torch_port", "fail", f"{why}; port mistakes: {', '.join(sorted(named))}",
                                       sorted(named)), named, [])
    result = criteria_mod.Criterion("torch_port", "error", why)
    unclear = _unclear_measures(measured)
    worked = _port_worked(session, plan) or _hung(session)
    if unclear and worked:  # it ran at the probes' sizes, yet one figure is unclear: as in _torch_section
        result.caps = f"the port ran no hidden trial and its {', '.join(unclear)} probe gave no clean figure"
    return result, {}, []


def _port_worked(session, plan, comparison=None) -> bool:
    """Whether the port's attention gave a right output anywhere: a hidden step of a criterion's kind, or
    a probe's decode (its output checked whatever the hidden trials showed), so being wrong only where
    outputs are judged does not make a port that attends at the probes' sizes "unfinished". Appends
    alone do not count: a port whose attention is not written yet is unfinished."""
    kinds = ("decode", "full_prefill", "chunked_prefill", "ragged")
    if comparison is not None and any(st.status == "ok" and st.kind in kinds for st in comparison.steps):
        return True
    return any(probe.purpose != "grow" and criteria_mod.probe_failure(task, built, True) == ""
               for runs in _probe_runs(session, "torch", plan).values() for probe, task, built in runs)


def _hung(session) -> bool:
    """Whether the port's session was cut short: a run stopped at its time limit, or the session ended
    before its tasks did (killed, its sandbox ended). Such a port may hide anything at the probes' sizes,
    so it is not taken for an unfinished one (a port that only raises ends every run normally)."""
    return any(t.stopped == "timeout" for t in session.tasks.values()) or bool(session.reason)


def _unclear_measures(measured: dict) -> list[str]:
    """The Hire-tier measured criteria (growth, repeat) that neither passed nor named a mistake."""
    return [c.id for c in measured.values()
            if c.id != "live_length" and c.status in ("error", "fail") and not c.mistakes]


def _error_report(name, options, reason, started, status: str = "not_graded") -> dict:
    """A report with no verdict (see ``report.ungraded``)."""
    return report_mod.ungraded(name, options.seed, options.rubric, reason, status, started)


_SWEPT: list = []


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# What a notebook's grade here and in its nbgrader cells (docs/notebook.md) do not share, said in both places.
NOTEBOOK_NOTE = ("graded as the class notebook's nbgrader cells grade it, criterion by criterion, but for two "
                 "things: live_length (attention over the live keys) is measured here only, by timing, and no "
                 "cell grades it; a port not attempted counts neither for nor against here, while nbgrader, "
                 "whose total is fixed, gives its cell 0 (docs/notebook.md)")


def grade(path: str, options: Options | None = None) -> dict:
    """Grade the submission at ``path`` (directory, .zip, .py or .ipynb) and return its report dict."""
    options = options or Options()
    started = time.monotonic()
    name = name_of(path)
    if not _SWEPT:
        launch.sweep_stale()  # folders of graders that were killed before they could clean up
        _SWEPT.append(True)
    workdir = launch.temp_dir("kvkit-sub-")
    laid_out: list[str] = []  # what of the hand-back was read otherwise than as it lies (a venv set aside, ...)
    try:
        try:
            files = materialize(path, workdir, laid_out)
        except SubmissionError as exc:
            return _error_report(name, options, str(exc), started)
        sha256 = laid_out_sha256(workdir, files)  # before any file is set aside or run
        report = _grade_laid_out(name, workdir, files, options, started)
        report["hand_back_sha256"] = sha256  # --resume grades a hand-back changed since again
        if laid_out:
            report["notes"] = laid_out + list(report.get("notes") or [])
        if report.get("status") == "graded" and str(path).lower().endswith(".ipynb"):
            report.setdefault("notes", []).append(NOTEBOOK_NOTE)
        if report.get("status") == "graded" and options.trials < FULL_TRIALS:
            report.setdefault("notes", []).append(
                f"a quick grading: {options.trials} random trials, fewer than the {FULL_TRIALS} of a full one "
                f"(--trials); a mistake that shows in few of them may go unseen")
        return report
    finally:
        launch.remove_tree(workdir)


def _grade_laid_out(name, workdir, files, options, started) -> dict:
    """The report of the submission laid out in ``workdir`` (``files``): the bundle's files set aside,
    then refused (no kv_cache.py, a shadowing name) or graded."""
    files, aside = set_aside_bundle(workdir, files)
    if aside:  # the kit's helpers the candidate's own files import (catalogue.mutants) stay importable
        provide_helpers(workdir, [_read(os.path.join(workdir, f)) for f in files if f.endswith(".py")])
    if "kv_cache.py" not in files:
        why = " (the kv_cache.py handed back is the starter bundle's unfilled stub)" if "kv_cache.py" in aside \
            else ": hand back the folder that holds kv_cache.py (or a .zip of it), one .py file, or a notebook"
        return _error_report(name, options, f"no kv_cache.py in the submission{why}", started)
    shadows = shadowing(files, run_mod.installed_modules())
    if shadows:
        return _error_report(name, options, "; ".join(shadows), started)
    report = _grade_dir(name, workdir, files, options, started)
    if aside:
        _say_stubs_set_aside(report, aside)
        report.setdefault("notes", []).insert(
            0, f"set aside {len(aside)} file(s) of the starter bundle (not graded as the hand-back's own work; its "
               f"step tests by their path, even edited): " + ", ".join(aside))
    return report


def prepare_inputs(options: Options) -> None:
    """Write the inputs of ``options.seed``'s trials and probes (about 300 MiB, see ``run.job_data``) now,
    compute the oracle's outputs for them, and list the installed modules (``run.installed_modules``).

    ``grade`` does all three on first use in each process; a batch calls this
    before it forks its ``--jobs`` workers, which then share them.
    """
    run_mod.installed_modules()
    run_mod.job_data(run_mod.Plan(seed=options.seed, trials=suite.hidden_suite(options.seed, options.trials),
                                  probes=probes_mod.probes(options.seed)))
    compare.oracle_outputs(options.seed, options.trials)


def _grade_dir(name, workdir, files, options, started) -> dict:
    iso = options.isolation
    level = iso.level if iso else "process (rlimits, -I -S, private directory)"
    trials = suite.hidden_suite(options.seed, options.trials)
    plan = run_mod.Plan(seed=options.seed, trials=trials, probes=probes_mod.probes(options.seed),
                        cost_calls=COST_CALLS if "cost.py" in files else [],
                        test_files=owntests.test_files(workdir), preimport=run_mod.preimports(workdir, files))
    limits = launch.Limits(wall_s=options.timeout, cpu_s=int(options.timeout * 2) + 5)
    def oracle():  # the parent's own work, while the sandbox runs
        return compare.oracle_outputs(options.seed, options.trials)

    sessions = run_mod.run_sessions(workdir, plan, limits, iso.wrap if iso else None,
                                    port="kv_cache_torch.py" in files, meanwhile=oracle)
    trials, expected = sessions["meanwhile"]
    plan.trials = trials
    session = sessions["numpy"]
    notes = list(session.notes)
    if session.reason:
        notes.append(f"sandbox: {session.reason}")
    try:
        answer, comparison, outputs = _trials_section(session, "numpy", trials, expected, plan)
    except MALFORMED as exc:
        return _malformed(name, options, level, started, notes, session, exc)
    if answer is None and not session.tasks_started:
        # The sandbox never reached a task: no submission code ran. A hand-back its working folder cannot hold
        # is the hand-back's doing; anything else is the kit's (or the machine's) failure, named.
        refused = sandbox_refusal(workdir, session.output_tail, launch.WORKDIR_INODES, launch.WORKDIR_BYTES)
        if refused:
            return {**_error_report(name, options, refused, started), "isolation": level, "notes": notes}
        said = (session.output_tail or "").strip().splitlines()[-1:]  # the kit's launcher or harness, before any task
        return {**_error_report(name, options, f"the kit's sandbox ({level}) did not start: {comparison}"
                                + (f" ({said[0][:200]})" if said else "") + "; the submission was not run: check the "
                                "grader's Python and isolation (grader/sandbox/)", started, status="grader_error"),
                "isolation": level, "notes": notes}
    raw = getattr(session.tasks.get(run_mod.probe_task(plan, "numpy", "trials")), "answer", None)
    missing = answer is None and isinstance(raw, dict) and missing_module(raw.get("import"), workdir, files,
                                                                          run_mod.installed_modules())
    if missing:  # not a verdict on the candidate: what to install, or to hand back without
        return {**_error_report(name, options, missing, started), "isolation": level, "notes": notes}
    if answer is None:
        # The candidate's code ran and failed (import error, crash, hang): graded, with the reason.
        report = _error_report(name, options, f"kv_cache.py: {comparison}", started)
        report.update(status="graded", tier=options.rubric.lowest_tier(), graded=True, isolation=level, notes=notes,
                      output_tail=session.output_tail[-500:],
                      tier_reason=f"nothing could be measured: kv_cache.py: {comparison}"[:600])
        _say_not_measured(report, files, f"not measured: kv_cache.py: {comparison}", options.rubric)
        return report
    probe_answers = [getattr(session.tasks.get(run_mod.probe_task(plan, "numpy", p.name)), "answer", None)
                     for p in plan.probes]
    if all(_nothing_written(a) for a in [answer, *probe_answers]):
        # The template as handed out (an untouched notebook, a stub): nothing of the candidate's to grade.
        return {**_error_report(name, options, "the implementation is not filled in yet (kv_cache.py, or a "
                                "notebook's implementation cells): every trial stops at the template's "
                                "NotImplementedError; fill in KVCache and gqa_attention, then hand it back",
                                started), "isolation": level, "notes": notes}
    try:
        return _evaluate(name, options, level, started, plan, sessions, answer, comparison, outputs, files, notes)
    except MALFORMED as exc:
        return _malformed(name, options, level, started, notes, session, exc)


def _say_not_measured(report: dict, files: list[str], why: str, rubric) -> None:
    """A submission graded at the lowest tier because nothing could be measured: each criterion says why,
    with its section and tier as in any report; an optional section it did not hand in is left out (not
    attempted, not counted, the other points scaled to the total), and cost or own tests not handed in
    are not attempted."""
    absent = {"torch_port": ("kv_cache_torch.py" not in files, "no kv_cache_torch.py"),
              "cost_model": ("cost.py" not in files, "no cost.py"),
              "own_tests": (not owntests.test_files_in(files), "no test_*.py in the submission")}
    optional_out = {cid for cid, spec in rubric.criteria.items() if spec["tier"] == "none" and absent.get(cid, (0,))[0]}
    worth = _scaled_points({cid: 0.0 if cid in optional_out else float(spec["points"])
                            for cid, spec in rubric.criteria.items()}, rubric.max_score)
    for c in report["criteria"]:
        cid = c["id"]
        c.update(evidence=why[:300], max_points=worth.get(cid, 0.0), section="torch" if cid == "torch_port" else "numpy",
                 tier=rubric.criteria[cid]["tier"], counted=cid not in optional_out)
        if cid == "cost_model" and not absent[cid][0]:
            c["evidence"] = (f"not measured: cost.py is checked in the same process as kv_cache.py, which did not "
                             f"load ({why.removeprefix('not measured: kv_cache.py: ')})")[:300]
        if cid in absent and absent[cid][0]:
            c.update(status="not_attempted", evidence=absent[cid][1])


def _nothing_written(answer: dict) -> bool:
    """True when no step of the task's trials ran and each stopped at NotImplementedError (the child's
    records, read as data). Asked of the hidden trials and of every probe: only code that does nothing at
    any size is the template's stubs, untouched."""
    records = answer.get("records") if isinstance(answer, dict) else None
    if not isinstance(records, list) or not records:
        return False
    for steps in records:
        if not isinstance(steps, list) or not steps or not isinstance(steps[0], dict):
            return False
        error = steps[0].get("error")
        if steps[0].get("stage") not in ("init", "append") or not isinstance(error, dict) \
                or error.get("type") != "NotImplementedError":
            return False
    return True


# The optional parts a starter stub stands for: a criterion "not attempted" because its file is the stub.
STUB_OF = {"cost_model": lambda f: f == "cost.py", "torch_port": lambda f: f == "kv_cache_torch.py",
           "own_tests": lambda f: "/" not in f and f.startswith("test_")}  # the bundle's own test_mine.py


def _say_stubs_set_aside(report: dict, aside: list[str]) -> None:
    """A part not attempted because the candidate handed back the bundle's unfilled stub says so."""
    for crit in report.get("criteria") or []:
        stub = STUB_OF.get(crit.get("id"))
        if stub is None or crit.get("status") != "not_attempted":
            continue
        stubs = [f for f in aside if stub(f)]
        if stubs:
            crit["evidence"] = (f"{crit['evidence']} (handed back: {', '.join(stubs)}, the starter bundle's "
                                f"unfilled stub{'s' if len(stubs) > 1 else ''}, set aside)")


# What reading the child's answers may raise: they are data written by untrusted code.
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError)


def _malformed(name, options, level, started, notes, session, exc) -> dict:
    """Answers that break the protocol: only code in the submission's process can make them (the kit's
    task code writes well-formed ones), so they are graded like a crash, at the lowest tier, not set aside."""
    why = f"the answers from the submission's process are malformed ({type(exc).__name__}: {str(exc)[:200]})"
    report = _error_report(name, options, why, started)
    report.update(status="graded", tier=options.rubric.lowest_tier(), graded=True, isolation=level, notes=notes,
                  output_tail=session.output_tail[-500:] if session else "",
                  tier_reason=f"nothing could be measured: {why}"[:600])
    return report


def _evaluate(name, options, level, started, plan, sessions, answer, comparison, outputs, files, notes) -> dict:
    """Criteria, mistakes and the report, from the sessions' answers and measurements."""
    trials = plan.trials
    session = sessions["numpy"]
    by_trial = _outputs_by_trial(trials, outputs)
    criteria = _correctness_criteria(comparison, by_trial)
    moved = [s for s in comparison.steps if s.buffers_moved]
    explain = [f"in-process: K/V buffers replaced by new objects in {len({s.trial.name for s in moved})} "
               "hidden trials"] if moved else []
    criteria.update(_measured_criteria(_probe_runs(session, "numpy", plan), explain,
                                       decode_ok=_outputs_right(criteria),
                                       refused=criteria["chunked_prefill"].status == "not_attempted"))
    criteria["overflow_atomic"] = criteria_mod.overflow_from_trials(comparison, by_trial)
    criteria["cost_model"] = criteria_mod.cost_model(answer.get("cost") if "cost.py" in files else None,
                                                     expected_costs())
    named, diagnosis = _name_mistakes(criteria, comparison, by_trial)
    criteria["own_tests"] = owntests.criterion(session, plan.test_files, plan.own_task,
                                               chunks_refused=criteria["chunked_prefill"].status == "not_attempted")
    port_named = {}
    if "kv_cache_torch.py" in files:
        criteria["torch_port"], port_named, port_notes = _torch_section(sessions.get("torch"), plan,
                                                                        compare.oracle_outputs(options.seed,
                                                                                               options.trials)[1])
        notes += port_notes
    else:
        criteria["torch_port"] = criteria_mod.Criterion("torch_port", "not_attempted", "no kv_cache_torch.py")
    notes += criteria_mod.edge_cases(comparison) + criteria_mod.dtype_notes(comparison)
    notes += criteria_mod.input_errors(answer.get("errors"))
    for crit in criteria.values():
        notes += crit.notes
    report = build_report(name, options, criteria, named, port_named, notes, level, started,
                          diagnose.smallest_failing(comparison), diagnosis)
    report["probes"] = probes_mod.describe(plan.probes)  # what the seed drew: layouts, dtypes, sizes
    report["figures"] = {k: v for c in criteria.values() if c.id != "torch_port" for k, v in c.figures.items()}
    return report


def _scaled_points(points: dict, total: float) -> dict:
    """``points`` scaled to add up to ``total``, in hundredths that add up exactly (largest remainder)."""
    counted = sum(points.values())
    if not counted:
        return {cid: 0.0 for cid in points}
    exact = {cid: p * total * 100 / counted for cid, p in points.items()}
    cents = {cid: int(e) for cid, e in exact.items()}
    left = round(total * 100) - sum(cents.values())
    for cid in sorted(exact, key=lambda c: exact[c] - cents[c], reverse=True)[:max(left, 0)]:
        cents[cid] += 1
    return {cid: c / 100 for cid, c in cents.items()}


def follow_ups(criteria: dict, named: list, mistakes_doc: dict, general: list, count: int = 3) -> list[dict]:
    """Questions chosen from the diagnosis: one per named mistake, the chunked-prefill question after a
    refusal of chunked prefill, then general questions about parts that did not pass (or about none)."""
    out = [{"mistake": m, "question": mistakes_doc[m]["question"], "answer": mistakes_doc[m]["answer"]}
           for m in dict.fromkeys(named) if "question" in mistakes_doc.get(m, {})]
    if criteria.get("chunked_prefill") and criteria["chunked_prefill"].status == "not_attempted" \
            and "chunk_local_mask" not in named and "question" in mistakes_doc.get("chunk_local_mask", {}):
        # What the refused call must do: the chunked-prefill question, about no mistake of theirs.
        q = mistakes_doc["chunk_local_mask"]
        out.append({"mistake": None, "about": "chunked_prefill", "question": q["question"], "answer": q["answer"]})
    for q in general:
        if len(out) >= count:
            break
        about = q.get("criterion")
        if about is None or (about in criteria and criteria[about].status != "pass"):
            out.append({"mistake": None, "about": about, "question": q["question"], "answer": q["answer"]})
    return out


def _diagnosis_entry(criteria: dict, named: dict, diagnosis) -> dict | None:
    """The report's ``diagnosis``: what the wrong outputs show, in words and pictures."""
    wrong = [c for c in CORRECTNESS if c in criteria and criteria[c].status == "fail"]
    if not wrong or not (diagnosis and diagnosis.wrong_outputs):
        return None  # nothing failed, or only by raising or refusing: the criteria say so
    pictures = diagnosis.pictures() if diagnosis else {}
    mistakes_doc, _ = load_catalogue()
    shown = sorted(m for m in named if mistakes_doc.get(m, {}).get("shown_by") in ("structure", "reproduction"))
    summary = f"recovered: {', '.join(shown)}" if shown else diagnose.NO_KNOWN_MISTAKE
    return {"summary": summary, "pictures": pictures,
            "lines": [line for kind, pic in pictures.items() for line in diagnose.picture_lines(pic, kind)]}


def build_report(name, options, criteria, named, port_named, notes, level, started, smallest,
                 diagnosis: diagnose.Diagnosis | None = None) -> dict:
    """Assemble the ``kvkit.report/1`` dict from decided criteria and named mistakes."""
    rubric = options.rubric
    mistakes_doc, general = load_catalogue()
    statuses = {cid: c.status for cid, c in criteria.items()}
    # Any mistake named in the port caps the tier (docs: README, "Tier and score"), max_len_scan included,
    # though in the NumPy part, whose criterion is worth points only, it caps nothing.
    capping = sorted(port_named)
    if criteria.get("torch_port") is not None and criteria["torch_port"].caps:
        capping.append(criteria["torch_port"].caps)
    tier, reason = rubric.tier(statuses, sorted(named), capping, {cid: c.evidence for cid, c in criteria.items()},
                               silent={cid for cid, c in criteria.items() if c.silent})
    # An optional section (tier "none") not attempted counts neither for nor against: its points leave
    # the total, and the other criteria's points are scaled so the total stays max_score. So does one that
    # ran but that no figure can judge (a live length whose cache's making outweighs the decode steps).
    optional_out = {cid for cid, spec in rubric.criteria.items() if spec["tier"] == "none" and criteria.get(cid)
                    and (criteria[cid].status == "not_attempted" or criteria[cid].unjudgeable)}
    worth = _scaled_points({cid: 0.0 if cid in optional_out else float(spec["points"])
                            for cid, spec in rubric.criteria.items()}, rubric.max_score)
    crit_list = []
    for cid, spec in rubric.criteria.items():
        c = criteria.get(cid) or criteria_mod.Criterion(cid, "error", "not measured")
        crit_list.append({"id": cid, "title": rubric.title(cid), "status": c.status,
                          "points": worth[cid] if c.status == "pass" else 0.0, "max_points": worth[cid],
                          "evidence": c.evidence, "mistakes": list(c.mistakes),
                          "section": "torch" if cid == "torch_port" else "numpy", "tier": spec["tier"],
                          "counted": cid not in optional_out})
    score = round(sum(c["points"] for c in crit_list), 2)
    all_named = sorted(set(named) | set(port_named))
    return {
        "schema": SCHEMA, "submission": name, "seed": options.seed, "status": "graded", "graded": True,
        "tier": tier, "tier_reason": reason,
        "score": round(score, 2), "max_score": rubric.max_score, "criteria": crit_list,
        "mistakes": all_named,
        "mistake_evidence": {m: named.get(m) or port_named.get(m) for m in all_named},
        "numpy_mistakes": sorted(named), "port_mistakes": sorted(port_named),
        "port_cap": rubric.port_mistake_cap if capping else None,
        "smallest_failing": smallest, "notes": notes,
        "diagnosis": _diagnosis_entry(criteria, named, diagnosis),
        "follow_ups": follow_ups(criteria, all_named, mistakes_doc, general),
        "isolation": level, "duration_s": round(time.monotonic() - started, 2),
        "trials": {"random": options.trials, "planted_mutants": list(catalogue_mutants.PLANTED)},
    }
