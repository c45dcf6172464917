"""Grade one submission: sandboxed runs, comparisons in the parent, rubric, report.

The flow: lay the submission out in a fresh directory; write the hidden trials
as ``.npy`` + JSON; run the self-contained harness there in a child process
under limits; read back its answers as data; compare every output with the
oracle; turn measurements into criteria; run the candidate's own tests against
the submission and the planted mutants; apply the rubric. The report's keys are
the stable schema ``kvkit.report/1`` (SPEC section 5).
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
from grader import compare, diagnose, evaluate, jobs, owntests, sandbox, scan
from grader import rubric as rubric_mod
from grader.submission import SubmissionError, materialize, name_of
from solutions import cost as ref_cost

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOGUE = os.path.join(os.path.dirname(HERE), "catalogue")
SCHEMA = "kvkit.report/1"
PROBES = ["in_place", "repeat", "overflow", "scan", "errors"]
# The cost table's inputs (SPEC section 2) plus a second set, so no figure can be typed in.
COST_CALLS = [
    ["kv_bytes_per_token(32, 8, 128, 2)", "kv_bytes_per_token", [32, 8, 128, 2]],
    ["kv_bytes_per_token(3, 5, 7, 4)", "kv_bytes_per_token", [3, 5, 7, 4]],
    ["concat_bytes_copied(4096, 131072)", "concat_bytes_copied", [4096, 131072]],
    ["concat_bytes_copied(10, 7)", "concat_bytes_copied", [10, 7]],
    ["cache_bytes(4096, 131072)", "cache_bytes", [4096, 131072]],
    ["copy_seconds(1099255234560, 3.35e12)", "copy_seconds", [1099255234560, 3.35e12]],
    ["copy_seconds(300, 100.0)", "copy_seconds", [300, 100.0]],
    ["reservation_bytes(32, 8192, 131072)", "reservation_bytes", [32, 8192, 131072]],
    ["reservation_bytes(3, 10, 7)", "reservation_bytes", [3, 10, 7]],
    ["repeat_bytes(536870912, 4)", "repeat_bytes", [536870912, 4]],
    ["repeat_bytes(100, 3)", "repeat_bytes", [100, 3]],
]


def load_catalogue() -> tuple[dict, list]:
    """``(mistakes, general_questions)`` from catalogue/mistakes.toml and interview.toml."""
    with open(os.path.join(CATALOGUE, "mistakes.toml"), "rb") as f:
        mistakes = tomllib.load(f)
    with open(os.path.join(CATALOGUE, "interview.toml"), "rb") as f:
        general = tomllib.load(f)["general"]
    return mistakes, general


@dataclass
class Options:
    """How to grade: the seed of the hidden trials, limits, rubric, isolation."""

    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**31))
    timeout: float = 60.0
    trials: int = 200
    rubric: rubric_mod.Rubric = field(default_factory=rubric_mod.load)
    isolation: object = None  # grader.isolation.Isolation, or None for the plain child


def expected_costs() -> dict:
    return {label: getattr(ref_cost, name)(*args) for label, name, args in COST_CALLS}


def _outputs_by_trial(trials, outputs) -> dict:
    return {t.name: out for t, out in zip(trials, outputs)}


def _correctness_criteria(comparison) -> dict:
    c = {
        "head_mapping": evaluate.head_mapping(comparison),
        "decode": evaluate.correctness("decode", comparison.of_kind("decode"), "decode"),
        "full_prefill": evaluate.correctness("full_prefill", comparison.of_kind("full_prefill"), "full prefill"),
        "chunked_prefill": evaluate.correctness("chunked_prefill", comparison.of_kind("chunked_prefill"),
                                                "chunked prefill", allow_refusal=True),
        "ragged_rows": evaluate.correctness("ragged_rows", comparison.of_kind("ragged"), "ragged-row"),
        "padding": evaluate.padding(comparison),
    }
    return c


def _name_mistakes(criteria: dict, comparison, outputs_by_trial) -> dict:
    """``{mistake: evidence}``: measured ones, mutants matched exactly, then inferred ones."""
    named = {}
    for crit in criteria.values():
        for m in crit.mistakes:
            named.setdefault(m, crit.evidence)
    matched = diagnose.match_mutants(comparison, outputs_by_trial)
    for m, why in {**diagnose.infer(criteria, comparison), **matched}.items():
        named[m] = why
    # A refusal of chunked prefill with a clear error is not the chunk-local mistake.
    if criteria["chunked_prefill"].status == "not_attempted":
        named.pop("chunk_local_mask", None)
    # Attach each name to the criterion the catalogue files it under.
    mistakes_doc, _ = load_catalogue()
    for m in named:
        cid = mistakes_doc.get(m, {}).get("criterion")
        if cid in criteria and m not in criteria[cid].mistakes:
            criteria[cid].mistakes.append(m)
    return named


def _torch_section(results, trials, expected, job_dir) -> tuple[evaluate.Criterion, dict]:
    """The port's criterion and the mistakes named in it."""
    section = results.get("torch")
    if not isinstance(section, dict):
        return evaluate.Criterion("torch_port", "error", "the port was not run (the child stopped before it)"), {}
    if section.get("import"):
        err = section["import"]
        return evaluate.Criterion("torch_port", "error",
                                  f"kv_cache_torch.py failed to import: {err.get('type')}: {err.get('message')}"), {}
    try:
        outputs = jobs.read_outputs(job_dir, "out_torch.npy", trials, section.get("records"))
    except ValueError as exc:
        return evaluate.Criterion("torch_port", "error", f"the port's outputs are malformed: {exc}"), {}
    comparison = compare.compare(trials, section["records"], outputs, expected)
    criteria = _correctness_criteria(comparison)
    named = _name_mistakes(criteria, comparison, _outputs_by_trial(trials, outputs))
    ops = section.get("ops")
    evidence = []
    if isinstance(ops, dict) and "error" not in ops:
        named.update(evaluate.torch_ops(ops))
        evidence.append(f"ops watched: append {len(ops.get('append_ops', []))}, attention "
                        f"{len(ops.get('attention_ops', []))}, none copying K/V")
    else:
        evidence.append("the op watch did not complete")
    overflow = evaluate.overflow(section.get("overflow"))
    named.update({m: overflow.evidence for m in overflow.mistakes})
    failed = [c.id for c in criteria.values() if c.status != "pass" and c.id != "chunked_prefill"
              or (c.id == "chunked_prefill" and c.status == "fail")]
    steps = len(comparison.steps)
    if named or failed:
        first = next((criteria[c].evidence for c in failed), "")
        text = f"port mistakes: {', '.join(named) or 'none named'}" + (f"; {first}" if first else "")
        return evaluate.Criterion("torch_port", "fail", text, sorted(named)), named
    return evaluate.Criterion("torch_port", "pass", f"{steps} steps match the reference; " + "; ".join(evidence)), {}


def _error_report(name, options, reason, started) -> dict:
    reason = reason[:600]  # the child's words: bounded, and said once
    crits = [{"id": cid, "title": spec["title"], "status": "error", "points": 0.0,
              "max_points": float(spec["points"]), "evidence": "not graded (see error)", "mistakes": []}
             for cid, spec in options.rubric.criteria.items()]
    return {"schema": SCHEMA, "submission": name, "seed": options.seed, "tier": "Weak",
            "tier_reason": f"not graded: {reason}", "score": 0.0, "max_score": options.rubric.max_score,
            "criteria": crits, "mistakes": [], "isolation": "none", "duration_s": round(time.monotonic() - started, 2),
            "error": reason, "notes": [], "follow_ups": [], "smallest_failing": None}


def grade(path: str, options: Options | None = None) -> dict:
    """Grade the submission at ``path`` (directory, .py or .ipynb) and return its report dict."""
    options = options or Options()
    started = time.monotonic()
    name = name_of(path)
    workdir = tempfile.mkdtemp(prefix="kvkit-sub-")
    try:
        try:
            files = materialize(path, workdir)
        except SubmissionError as exc:
            return dict(_error_report(name, options, str(exc), started), graded=False)
        if "kv_cache.py" not in files:
            return dict(_error_report(name, options, "no kv_cache.py in the submission", started), graded=False)
        return _grade_dir(path, name, workdir, files, options, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Run:
    """One submission being graded: where it lies, what the child answered, the notes so far."""

    name: str
    workdir: str
    files: list
    options: Options
    started: float
    limits: sandbox.Limits
    level: str
    wrap: object = None
    notes: list = field(default_factory=list)
    source: dict = field(default_factory=dict)  # the source scan, taken before anything ran
    path: str = ""  # the submission as given, to lay out afresh for its own tests
    tests: list = field(default_factory=list)  # its own test files, listed before anything ran
    suspicious: list = field(default_factory=list)  # tools of tampering the sandbox's guard saw in use

    @property
    def job(self) -> str:
        return os.path.join(self.workdir, ".kvkit")

    def error(self, reason: str, **extra) -> dict:
        report = _error_report(self.name, self.options, reason, self.started)
        report.update(isolation=self.level, **extra)
        return report


def _grade_dir(path, name, workdir, files, options, started) -> dict:
    iso = options.isolation
    run = Run(name, workdir, files, options, started,
              sandbox.Limits(wall_s=options.timeout, cpu_s=int(options.timeout * 2) + 5),
              iso.level if iso else "process (rlimits, -I -S, private directory)", iso.wrap if iso else None)
    run.source = scan.scan(workdir)  # before anything runs: code can rewrite itself
    run.path, run.tests = path, owntests.test_files(workdir)
    trials, expected = compare.oracle_outputs(options.seed, options.trials)
    jobs.pack(trials, run.job, probes=PROBES, torch="kv_cache_torch.py" in files,
              cost_calls=COST_CALLS if "cost.py" in files else [], probe_seed=options.seed)
    shutil.copy(os.path.join(HERE, "harness.py"), os.path.join(run.job, "harness.py"))
    child = sandbox.run_child([os.path.join(run.job, "harness.py"), run.job, *sandbox.site_dirs()],
                              workdir, run.limits, run.wrap)
    results = jobs.read_results(run.job)
    if child.reason:
        run.notes.append(f"harness: {child.reason}")
    run.notes += child.notes  # what the sandbox refused or saw, a flood of output, processes left behind
    run.suspicious = child.suspicious
    if results is None or not isinstance(results.get("numpy"), dict):
        why = child.reason or (f"the child exited with status {child.returncode} before writing any result "
                               f"(it ended itself, e.g. os._exit, while importing or on its first trial)")
        return run.error(f"the submission could not be run: {why}", output_tail=child.output_tail[-500:],
                         notes=run.notes)
    err = results["numpy"].get("import")
    if err:
        return run.error(f"kv_cache.py failed to import: {err.get('type')}: {err.get('message')}", notes=run.notes)
    try:
        return _evaluate(run, trials, expected, results)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError) as exc:
        # The child's files are data written by untrusted code: anything malformed ends here.
        tampered = results.get("tampered") if isinstance(results.get("tampered"), list) else []
        suspect = f"; tampering suspected: {', '.join(map(str, tampered + run.suspicious))[:300]}" \
            if tampered or run.suspicious else ""
        return run.error(f"the child's results are malformed ({type(exc).__name__}: {str(exc)[:200]}){suspect}",
                         notes=run.notes)


def _evaluate(run: Run, trials, expected, results) -> dict:
    """Criteria, mistakes and the report, from the child's answers (``results``) and the oracle's."""
    numpy_section = results["numpy"]
    outputs = jobs.read_outputs(run.job, "out.npy", trials, numpy_section.get("records"))
    comparison = compare.compare(trials, numpy_section["records"], outputs, expected)
    criteria = _correctness_criteria(comparison)
    criteria["preallocated_in_place"] = evaluate.in_place(numpy_section.get("in_place"), comparison=comparison)
    criteria["no_kv_repeat"] = evaluate.no_repeat(numpy_section.get("repeat"))
    criteria["overflow_atomic"] = evaluate.overflow(numpy_section.get("overflow"))
    criteria["live_length"] = evaluate.live_length(numpy_section.get("scan"))
    criteria["cost_model"] = evaluate.cost_model(results.get("cost") if "cost.py" in run.files else None,
                                                 expected_costs())

    # Tampering: measured evidence from a process that rewired its own meters is void.
    source = run.source
    # A harness that did not finish (killed at the time limit) reports no tamper check: that is
    # not tampering; its unreported probes are already errors.
    tampered = results.get("tampered") if isinstance(results.get("tampered"), list) else \
        (["unreadable"] if results.get("done") else [])
    if tampered or source["tamper"] or run.suspicious:
        why = "; ".join(([f"runtime: {', '.join(map(str, tampered))} replaced"] if tampered else [])
                        + [f"runtime: {s}" for s in run.suspicious[:3]] + source["tamper"][:3])
        for cid in ("preallocated_in_place", "no_kv_repeat", "live_length", "overflow_atomic"):
            criteria[cid] = evaluate.Criterion(cid, "error", f"measurement not trusted: the submission touches the "
                                               f"harness's tools ({why})")
        run.notes.append(f"tampering suspected: {why}")

    named = _name_mistakes(criteria, comparison, _outputs_by_trial(trials, outputs))
    for mistake, places in source["hints"].items():
        if mistake in named:
            named[mistake] += f" (source: {', '.join(places[:3])})"

    own_results, own_child = _own_tests(run) if run.tests else (None, None)
    criteria["own_tests"] = owntests.criterion(own_results, own_child, bool(run.tests))

    port_named = {}
    if "kv_cache_torch.py" in run.files:
        criteria["torch_port"], port_named = _torch_section(results, trials, expected, run.job)
    else:
        criteria["torch_port"] = evaluate.Criterion("torch_port", "not_attempted", "no kv_cache_torch.py")

    notes = run.notes + evaluate.edge_cases(comparison) + evaluate.dtype_notes(comparison)
    notes += evaluate.input_errors(numpy_section.get("errors"))
    for crit in criteria.values():
        notes += crit.notes
    return build_report(run.name, run.options, criteria, named, port_named, notes, run.level, run.started,
                        diagnose.smallest_failing(comparison))


def _own_tests(run: Run):
    """The candidate's tests, in a fresh copy of the submission (nothing the first child left behind)."""
    fresh = tempfile.mkdtemp(prefix="kvkit-tests-")
    try:
        materialize(run.path, fresh)
        # Ten pytest runs (the submission, a control, each planted mutant): twice one harness run's time.
        limits = sandbox.Limits(wall_s=2 * run.limits.wall_s, cpu_s=2 * run.limits.cpu_s)
        return owntests.run(fresh, limits, run.wrap)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def build_report(name, options, criteria, named, port_named, notes, level, started, smallest) -> dict:
    """Assemble the ``kvkit.report/1`` dict from decided criteria and named mistakes."""
    rubric = options.rubric
    mistakes_doc, general = load_catalogue()
    statuses = {cid: c.status for cid, c in criteria.items()}
    tier, reason = rubric.tier(statuses, sorted(named), sorted(port_named))
    crit_list, score = [], 0.0
    for cid, spec in rubric.criteria.items():
        c = criteria.get(cid) or evaluate.Criterion(cid, "error", "not measured")
        points = float(spec["points"]) if c.status == "pass" else 0.0
        score += points
        crit_list.append({"id": cid, "title": spec["title"], "status": c.status, "points": points,
                          "max_points": float(spec["points"]), "evidence": c.evidence, "mistakes": list(c.mistakes),
                          "section": "torch" if cid == "torch_port" else "numpy", "tier": spec["tier"]})
    all_named = sorted(set(named) | set(port_named))
    follow_ups = [{"mistake": m, "question": mistakes_doc[m]["question"], "answer": mistakes_doc[m]["answer"]}
                  for m in all_named if m in mistakes_doc]
    if len(follow_ups) < 3:
        follow_ups += [{"mistake": None, **q} for q in general[: 3 - len(follow_ups)]]
    return {
        "schema": SCHEMA, "submission": name, "seed": options.seed, "tier": tier, "tier_reason": reason,
        "score": round(score, 2), "max_score": rubric.max_score, "criteria": crit_list,
        "mistakes": all_named,
        "mistake_evidence": {m: named.get(m) or port_named.get(m) for m in all_named},
        "port_mistakes": sorted(port_named),
        "smallest_failing": smallest, "notes": notes, "follow_ups": follow_ups,
        "isolation": level, "duration_s": round(time.monotonic() - started, 2),
        "trials": {"random": options.trials, "planted_mutants": list(catalogue_mutants.PLANTED)},
    }
