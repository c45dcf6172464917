"""Grade one submission: the flow suite -> run -> compare -> criteria -> diagnose -> rubric -> report.

Lay the submission out in a fresh directory (refusing files that would shadow
an installed module); build the hidden suite (``suite``); run it and the probes
in the sandbox, one session per implementation (``run``); compare every output
with the oracle in this process (``compare``); decide each criterion from
those comparisons and from the kernel's measurements (``criteria``); name
mistakes (``diagnose``); apply the rubric (``rubric``); build the report
(``report.Report``, schema ``kvkit.report/1``: docs/report.schema.json).
"""
from __future__ import annotations

import os
import random
import time
import tomllib
from dataclasses import dataclass, field

from catalogue import mutants as catalogue_mutants, rules as catalogue_rules
from grader import KIT_ROOT
from grader.stages import compare, costs, criteria as criteria_mod, diagnose, own_tests as owntests, port as port_mod, probes as probes_mod
from grader.stages import registry, run as run_mod, suite
from grader.stages import report as report_mod
from grader.stages import rubric as rubric_mod
from grader.sandbox import launch
from grader.stages.evidence import MALFORMED, Evidence, outputs_by_trial, probe_runs, trials_section
from grader.stages.layout import (SubmissionError, laid_out_sha256, materialize, missing_module, name_of,
                               provide_helpers, sandbox_refusal, set_aside_bundle, shadowing)
from grader.stages.verdicts import ReportStatus, Status

CATALOGUE = os.path.join(KIT_ROOT, "catalogue")
# The cost table's inputs plus a second set (grader/shipped/cost_table.py), so no figure can be typed in (grader/stages/costs.py).
COST_CALLS = costs.figures()["calls"]


def load_catalogue() -> tuple[dict, list]:
    """``(mistakes, general_questions)``: ``{id: catalogue.rules.Mistake}`` and interview.toml's questions.

    The Gradescope bundle ships no interviewer text: no interview.toml (no general questions) and no
    ``question``/``answer`` in mistakes.toml (``follow_ups`` then asks nothing).
    """
    mistakes = catalogue_rules.mistakes()
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


def _error_report(name, options, reason, started,
                  status: ReportStatus = ReportStatus.NOT_GRADED) -> report_mod.Report:
    """A report with no verdict: ``not_graded`` (fix the hand-back) or ``grader_error`` (the kit failed)."""
    make = report_mod.Report.crashed if status == ReportStatus.GRADER_ERROR else report_mod.Report.not_graded
    return make(name, options.seed, options.rubric, reason, started)


def _after_running(report: report_mod.Report, level: str, notes: list) -> report_mod.Report:
    """``report`` (one without a verdict) with the sandbox's level and the notes of a session that ran."""
    report.isolation, report.notes = level, notes
    return report


_SWEPT: list = []


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# What a notebook's grade here and in its nbgrader cells (docs/notebook.md) do not share. The criteria no cell
# grades, and why, are the registry's (``not_in_notebook``): a new one is said here without another edit.
NOTEBOOK_NOTE = ("graded as the class notebook's nbgrader cells grade it, criterion by criterion, but: no nbgrader "
                 "cell grades " + "; ".join(f"{cid} ({spec.not_in_notebook})" for cid, spec in registry.REGISTRY.items()
                                            if spec.not_in_notebook)
                 + "; own_tests: here the notebook's check runs on this code first and earns nothing if it fails "
                 "there, while nbgrader's test_own_check grades it on the kit's reference. A port not attempted "
                 "counts neither for nor against in both (nbgrader gives its cell the share earned on the other "
                 "cells; docs/notebook.md)")


def grade(path: str, options: Options | None = None) -> dict:
    """Grade the submission at ``path`` (directory, .zip, .py or .ipynb) and return its report as JSON data.

    Raises:
        grader.stages.report.ReportError: the report does not follow its schema (a bug of the kit).
    """
    return grade_report(path, options).to_dict()


def grade_report(path: str, options: Options | None = None) -> report_mod.Report:
    """Grade the submission at ``path`` (directory, .zip, .py or .ipynb): its :class:`~grader.stages.report.Report`."""
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
        report.hand_back_sha256 = sha256  # --resume grades a hand-back changed since again
        if laid_out:
            report.notes = laid_out + list(report.notes)
        if report.status == ReportStatus.GRADED and str(path).lower().endswith(".ipynb"):
            report.notes.append(NOTEBOOK_NOTE)
        if report.status == ReportStatus.GRADED and options.trials < FULL_TRIALS:
            report.notes.append(
                f"a quick grading: {options.trials} random trials, fewer than the {FULL_TRIALS} of a full one "
                f"(--trials); a mistake that shows in few of them may go unseen")
        return report
    finally:
        launch.remove_tree(workdir)


def _grade_laid_out(name, workdir, files, options, started) -> report_mod.Report:
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
        report.notes.insert(
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
    run_mod.copy_seconds(1)  # the growth figure's unit, timed once before the workers fork
    run_mod.job_data(run_mod.Plan(seed=options.seed, trials=suite.hidden_suite(options.seed, options.trials),
                                  probes=probes_mod.probes(options.seed)))
    compare.oracle_outputs(options.seed, options.trials)


def _grade_dir(name, workdir, files, options, started) -> report_mod.Report:
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
        answer, comparison, outputs = trials_section(session, "numpy", trials, expected, plan)
    except MALFORMED as exc:
        return _malformed(name, options, level, started, notes, session, exc)
    if answer is None and not session.tasks_started:
        # The sandbox never reached a task: no submission code ran. A hand-back its working folder cannot hold
        # is the hand-back's doing; anything else is the kit's (or the machine's) failure, named.
        refused = sandbox_refusal(workdir, session.output_tail, launch.WORKDIR_INODES, launch.WORKDIR_BYTES)
        if refused:
            return _after_running(_error_report(name, options, refused, started), level, notes)
        said = (session.output_tail or "").strip().splitlines()[-1:]  # the kit's launcher or harness, before any task
        return _after_running(_error_report(name, options, f"the kit's sandbox ({level}) did not start: {comparison}"
                                            + (f" ({said[0][:200]})" if said else "") + "; the submission was not "
                                            "run: check the grader's Python and isolation (grader/sandbox/)", started,
                                            status=ReportStatus.GRADER_ERROR), level, notes)
    raw = getattr(session.tasks.get(run_mod.probe_task(plan, "numpy", "trials")), "answer", None)
    missing = answer is None and isinstance(raw, dict) and missing_module(raw.get("import"), workdir, files,
                                                                          run_mod.installed_modules())
    if missing:  # not a verdict on the candidate: what to install, or to hand back without
        return _after_running(_error_report(name, options, missing, started), level, notes)
    if answer is None:
        # The candidate's code ran and failed (import error, crash, hang): graded, with the reason.
        why = f"kv_cache.py: {comparison}"
        return report_mod.Report.unmeasured(name, options.seed, options.rubric, why, isolation=level, notes=notes,
                                            output_tail=session.output_tail[-500:], started=started,
                                            lines=_not_measured_lines(files, f"not measured: {why}", options.rubric))
    probe_answers = [getattr(session.tasks.get(run_mod.probe_task(plan, "numpy", p.name)), "answer", None)
                     for p in plan.probes]
    if all(_nothing_written(a) for a in [answer, *probe_answers]):
        # The template as handed out (an untouched notebook, a stub): nothing of the candidate's to grade.
        return _after_running(_error_report(name, options, "the implementation is not filled in yet (kv_cache.py, "
                                            "or a notebook's implementation cells): every trial stops at the "
                                            "template's NotImplementedError; fill in KVCache and gqa_attention, then "
                                            "hand it back", started), level, notes)
    try:
        return _evaluate(name, options, level, started, plan, sessions, answer, comparison, outputs, files, notes)
    except MALFORMED as exc:
        return _malformed(name, options, level, started, notes, session, exc)


def _not_measured_lines(files: list[str], why: str, rubric) -> list[report_mod.CriterionLine]:
    """The criteria of a submission graded at the lowest tier because nothing could be measured: each says
    why, with its section and tier as in any report; cost, own tests and the port not handed in are not
    attempted, and an optional one of them is left out (not counted, the other points scaled to the total)."""
    absent = {"torch_port": ("kv_cache_torch.py" not in files, "no kv_cache_torch.py"),
              "cost_model": ("cost.py" not in files, "no cost.py"),
              "own_tests": (not owntests.test_files_in(files), "no test_*.py in the submission")}
    statuses = {cid: Status.NOT_ATTEMPTED if absent.get(cid, (False,))[0] else Status.ERROR for cid in rubric.criteria}
    left_out = rubric.left_out(statuses)
    worth = report_mod.scaled_points(rubric, left_out)
    lines = []
    for cid, spec in rubric.criteria.items():
        evidence = why[:300]
        if statuses[cid] == Status.NOT_ATTEMPTED:
            evidence = absent[cid][1]
        elif cid == "cost_model":
            evidence = (f"not measured: cost.py is checked in the same process as kv_cache.py, which did not "
                        f"load ({why.removeprefix('not measured: kv_cache.py: ')})")[:300]
        lines.append(report_mod.CriterionLine(cid, rubric.title(cid), statuses[cid], 0.0, worth[cid], evidence, [],
                                              registry.section(cid), spec["tier"], cid not in left_out))
    return lines


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


def _say_stubs_set_aside(report: report_mod.Report, aside: list[str]) -> None:
    """A part not attempted because the candidate handed back the bundle's unfilled stub says so."""
    for line in report.criteria:
        stub = STUB_OF.get(line.id)
        if stub is None or line.status != Status.NOT_ATTEMPTED:
            continue
        stubs = [f for f in aside if stub(f)]
        if stubs:
            line.evidence = (f"{line.evidence} (handed back: {', '.join(stubs)}, the starter bundle's "
                             f"unfilled stub{'s' if len(stubs) > 1 else ''}, set aside)")


def _malformed(name, options, level, started, notes, session, exc) -> report_mod.Report:
    """Answers that break the protocol: only code in the submission's process can make them (the kit's
    task code writes well-formed ones), so they are graded like a crash, at the lowest tier, not set aside."""
    why = f"the answers from the submission's process are malformed ({type(exc).__name__}: {str(exc)[:200]})"
    return report_mod.Report.unmeasured(name, options.seed, options.rubric, why, isolation=level, notes=notes,
                                        output_tail=session.output_tail[-500:] if session else "", started=started)


def _evaluate(name, options, level, started, plan, sessions, answer, comparison, outputs, files,
              notes) -> report_mod.Report:
    """Criteria, mistakes and the report, from the sessions' answers and measurements: collect the evidence,
    decide every criterion of the registry, name the mistakes, apply the rubric, build the report."""
    session = sessions["numpy"]
    moved = [s for s in comparison.steps if s.buffers_moved]
    explain = [f"in-process: K/V buffers replaced by new objects in {len({s.trial.name for s in moved})} "
               "hidden trials"] if moved else []
    port_named: dict = {}

    def judge_port():
        crit, named_there = port_mod.judge(sessions.get("torch"), plan,
                                           compare.oracle_outputs(options.seed, options.trials)[1],
                                           weak_when_wrong=options.rubric.weak_when_wrong)
        port_named.update(named_there)
        return crit

    ev = Evidence(backend="numpy", comparison=comparison, outputs=outputs_by_trial(plan.trials, outputs),
                  runs=probe_runs(session, "numpy", plan), answer=answer, files=files, session=session, plan=plan,
                  expected_costs=expected_costs(), explain=explain,
                  port=judge_port if "kv_cache_torch.py" in files else None)
    criteria = registry.decide_all(ev)
    named, diagnosis = diagnose.name_mistakes(
        {cid: c for cid, c in criteria.items() if registry.section(cid) == "numpy"}, comparison, ev.outputs)
    notes += criteria_mod.edge_cases(comparison) + criteria_mod.dtype_notes(comparison)
    notes += criteria_mod.input_errors(answer.get("errors"))
    for crit in criteria.values():
        notes += crit.notes
    report = graded_report(name, options, criteria, named, port_named, notes, level, started,
                           diagnose.smallest_failing(comparison), diagnosis)
    report.probes = probes_mod.describe(plan.probes)  # what the seed drew: layouts, dtypes, sizes
    report.figures = {k: v for c in criteria.values() if c.id != "torch_port" for k, v in c.figures.items()}
    return report


def follow_ups(criteria: dict, named: list, mistakes_doc: dict, general: list, count: int = 3) -> list[dict]:
    """Questions chosen from the diagnosis: one per named mistake, the chunked-prefill question after a
    refusal of chunked prefill, then general questions about parts that did not pass (or about none)."""
    out = [{"mistake": m, "question": mistakes_doc[m].question, "answer": mistakes_doc[m].answer}
           for m in dict.fromkeys(named) if m in mistakes_doc and mistakes_doc[m].question is not None]
    if criteria.get("chunked_prefill") and criteria["chunked_prefill"].status == Status.NOT_ATTEMPTED \
            and "chunk_local_mask" not in named \
            and getattr(mistakes_doc.get("chunk_local_mask"), "question", None) is not None:
        # What the refused call must do: the chunked-prefill question, about no mistake of theirs.
        q = mistakes_doc["chunk_local_mask"]
        out.append({"mistake": None, "about": "chunked_prefill", "question": q.question, "answer": q.answer})
    for q in general:
        if len(out) >= count:
            break
        about = q.get("criterion")
        if about is None or (about in criteria and criteria[about].status != Status.PASS):
            out.append({"mistake": None, "about": about, "question": q["question"], "answer": q["answer"]})
    return out


def _diagnosis_entry(criteria: dict, named: dict, diagnosis) -> dict | None:
    """The report's ``diagnosis``: what the wrong outputs show, in words and pictures."""
    wrong = [c for c in registry.CORRECTNESS if c in criteria and criteria[c].status == Status.FAIL]
    if not wrong or not (diagnosis and diagnosis.wrong_outputs):
        return None  # nothing failed, or only by raising or refusing: the criteria say so
    pictures = diagnosis.pictures() if diagnosis else {}
    mistakes_doc, _ = load_catalogue()
    shown = sorted(m for m in named if getattr(mistakes_doc.get(m), "shown_by", None) in ("structure", "reproduction"))
    summary = f"recovered: {', '.join(shown)}" if shown else diagnose.NO_KNOWN_MISTAKE
    return {"summary": summary, "pictures": pictures,
            "lines": [line for kind, pic in pictures.items() for line in diagnose.picture_lines(pic, kind)]}


def graded_report(name, options, criteria, named, port_named, notes, level, started, smallest,
                  diagnosis: diagnose.Diagnosis | None = None) -> report_mod.Report:
    """The graded report from the decided criteria (``{id: Criterion}``) and the mistakes named in each section
    (``named``: the NumPy part's, ``port_named``: the port's, ``{id: evidence}``): the rubric's tier and
    reason, the points (:meth:`grader.stages.report.Report.graded`), the diagnosis and the follow-up questions."""
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
    return report_mod.Report.graded(
        name, options.seed, rubric, criteria, tier, reason, numpy_named=named, port_named=port_named,
        port_cap=rubric.port_mistake_cap if capping else None, smallest_failing=smallest, notes=notes,
        diagnosis=_diagnosis_entry(criteria, named, diagnosis),
        follow_ups=follow_ups(criteria, sorted(set(named) | set(port_named)), mistakes_doc, general),
        isolation=level, duration_s=round(time.monotonic() - started, 2),
        trials={"random": options.trials, "planted_mutants": list(catalogue_mutants.PLANTED)})


def build_report(name, options, criteria, named, port_named, notes, level, started, smallest,
                 diagnosis: diagnose.Diagnosis | None = None) -> dict:
    """:func:`graded_report` as its JSON data (schema ``kvkit.report/1``)."""
    return graded_report(name, options, criteria, named, port_named, notes, level, started, smallest,
                         diagnosis).to_dict()
