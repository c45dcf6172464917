"""Reports: how one is made (schema ``kvkit.report/1``, docs/report.schema.json) and every way out.

A report's ``status`` (:class:`~grader.stages.verdicts.ReportStatus`) says whether there is a verdict at
all: ``graded`` (a tier), ``not_graded`` (the hand-back cannot be graded: the reason says what to fix) or
``grader_error`` (the kit failed, not the candidate). Only a graded report has a tier; every renderer and
summary switches on the status.

The grader builds a :class:`Report` (one :class:`CriterionLine` per criterion) with one of its
constructors: :meth:`Report.graded`, :meth:`Report.not_graded`, :meth:`Report.crashed` (a grader error)
and :meth:`Report.unmeasured` (graded at the lowest tier: nothing could be measured). Points are scaled
in one place, :func:`scaled_points`. A report leaves the grader once, as the dict :meth:`Report.to_dict`
makes (or its text, :meth:`Report.to_json`, or Gradescope's results, :meth:`Report.to_gradescope`), each
checked against the schema as it is written: a field the schema refuses raises :class:`ReportError`
naming it. The renderers below read that dict, or one read back from a file (:func:`read_report`).

Text that came from a submission (exception messages, file names) is data:
every renderer passes it through :func:`grader.stages.inert.clean` (one line, no
control, format or separator characters, cut at a whole word), prints it with
rich markup off, escapes it in Markdown (:func:`grader.stages.inert.md`) and keeps it
from starting a formula in CSV (:func:`grader.stages.inert.csv_cell`).

Each state has one name in every human-facing output (:data:`LABEL`,
:data:`STATUS_LABEL`): a criterion passes, fails, is not attempted or is not
measured (``error`` in the JSON: the check could not be made); a report is
graded, not graded or a grader error.
"""
from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from dataclasses import dataclass, field

from grader import KIT_ROOT
from grader.stages.inert import clean, csv_cell, md, shorten  # noqa: F401 - the renderers' one cleaning, re-exported
from grader.stages.registry import section as section_of
from grader.stages.verdicts import ReportStatus, Status, Tier

SCHEMA = "kvkit.report/1"
SCHEMA_FILE = os.path.join(KIT_ROOT, "docs", "report.schema.json")  # shipped in the Gradescope bundle too
STATUSES = tuple(ReportStatus)
STATUS_LABEL = {ReportStatus.GRADED: "graded", ReportStatus.NOT_GRADED: "not graded",
                ReportStatus.GRADER_ERROR: "grader error"}
LABEL = {Status.PASS: "pass", Status.FAIL: "fail", Status.NOT_ATTEMPTED: "not attempted", Status.ERROR: "not measured"}
HEADLINE = {s: STATUS_LABEL[s].upper() for s in (ReportStatus.NOT_GRADED, ReportStatus.GRADER_ERROR)}


class ReportError(ValueError):
    """A report the kit cannot write: a field the schema (docs/report.schema.json) refuses, or one its layout
    has no place for. The message names the field."""


# ---------------------------------------------------------------------------------------- the model

@dataclass
class CriterionLine:
    """One criterion as a report lists it.

    ``id`` and ``title`` (the registry's), ``status`` (a :class:`Status`), ``points`` earned and
    ``max_points`` it is worth (both scaled by :func:`scaled_points`; 0 earned unless it passes),
    ``evidence`` (what was measured, in words) and ``mistakes`` (catalogue ids filed under it).
    ``section`` (``"numpy"`` or ``"torch"``), ``tier`` (the rubric's: ``Hire``, ``Strong Hire`` or
    ``none``) and ``counted`` (False: an optional criterion left out of the score) are written only when
    set: a report without a verdict has none of them.
    """

    id: str
    title: str
    status: Status
    points: float
    max_points: float
    evidence: str
    mistakes: list[str] = field(default_factory=list)
    section: str | None = None
    tier: str | None = None
    counted: bool | None = None

    def to_dict(self) -> dict:
        """The line as the report's JSON holds it (its keys in the schema's order, then section, tier, counted).

        Raises:
            ReportError: ``status`` is not a :class:`Status`.
        """
        out = {"id": self.id, "title": self.title, "status": _name(Status, self.status, f"criteria[{self.id}].status"),
               "points": self.points, "max_points": self.max_points, "evidence": self.evidence,
               "mistakes": list(self.mistakes)}
        for key in ("section", "tier", "counted"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def scaled_points(rubric, left_out: set | frozenset = frozenset()) -> dict:
    """``{criterion id: points it is worth}``: the rubric's points, those of the criteria ``left_out`` (see
    ``Rubric.left_out``) set to 0 and the rest scaled to add up to ``rubric.max_score``, in hundredths that
    add up exactly (largest remainder). The one place a criterion's points are scaled."""
    points = {cid: 0.0 if cid in left_out else float(spec["points"]) for cid, spec in rubric.criteria.items()}
    counted = sum(points.values())
    if not counted:
        return {cid: 0.0 for cid in points}
    total = rubric.max_score
    exact = {cid: p * total * 100 / counted for cid, p in points.items()}
    cents = {cid: int(e) for cid, e in exact.items()}
    left = round(total * 100) - sum(cents.values())
    for cid in sorted(exact, key=lambda c: exact[c] - cents[c], reverse=True)[:max(left, 0)]:
        cents[cid] += 1
    return {cid: c / 100 for cid, c in cents.items()}


# A report's keys in the order the kit writes them: a graded report's, then that of a report that says why
# nothing was checked (its ``error``: not graded, a grader error, or graded with nothing measured). The keys
# of _TAIL follow either, each only when set. Consumers read keys by name; the order keeps every report
# byte for byte as earlier kits wrote it.
_VERDICT_KEYS = ("schema", "submission", "seed", "status", "graded", "tier", "tier_reason", "score", "max_score",
                 "criteria", "mistakes", "mistake_evidence", "numpy_mistakes", "port_mistakes", "port_cap",
                 "smallest_failing", "notes", "diagnosis", "follow_ups", "isolation", "duration_s", "trials")
_ERROR_KEYS = ("schema", "submission", "seed", "status", "tier", "graded", "tier_reason", "score", "max_score",
               "criteria", "mistakes", "isolation", "error", "notes", "follow_ups", "smallest_failing", "duration_s")
_TAIL = ("probes", "figures", "output_tail", "hand_back_sha256", "grader_trace", "audience")


@dataclass
class Report:
    """One submission's report, schema ``kvkit.report/1`` (docs/report.schema.json).

    Always: ``submission`` (display name), ``seed`` (of the hidden trials), ``status`` (a
    :class:`ReportStatus`), ``tier`` (a :class:`Tier`; None unless graded), ``tier_reason``, ``score`` and
    ``max_score``, ``criteria`` (:class:`CriterionLine`, in the rubric's order), ``isolation`` (the
    sandbox's level, ``"none"`` when nothing ran), ``duration_s``, ``mistakes`` (catalogue ids, both
    sections), ``notes``, ``follow_ups`` (interviewer questions: dicts of mistake/about, question, answer)
    and ``smallest_failing``. ``error``: why nothing was checked (set by every constructor but
    :meth:`graded`; it also picks the key order :meth:`to_dict` writes). A graded report adds
    ``mistake_evidence``, ``numpy_mistakes``, ``port_mistakes``, ``port_cap`` (a :class:`Tier` or None),
    ``diagnosis``, ``trials``, ``probes`` and ``figures``. Any report may carry ``output_tail`` (the
    sandbox's last output), ``hand_back_sha256``, ``grader_trace`` and ``audience``. A field left None is
    not written, but for the keys of a graded report's layout (``port_cap``, ``diagnosis`` ... are null).
    """

    submission: str
    seed: int
    status: ReportStatus
    tier: Tier | None
    tier_reason: str
    score: float
    max_score: float
    criteria: list[CriterionLine]
    isolation: str
    duration_s: float
    mistakes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    follow_ups: list[dict] = field(default_factory=list)
    smallest_failing: str | None = None
    error: str | None = None
    mistake_evidence: dict | None = None
    numpy_mistakes: list[str] | None = None
    port_mistakes: list[str] | None = None
    port_cap: Tier | None = None
    diagnosis: dict | None = None
    trials: dict | None = None
    probes: list | None = None
    figures: dict | None = None
    output_tail: str | None = None
    hand_back_sha256: str | None = None
    grader_trace: str | None = None
    audience: str | None = None

    # ------------------------------------------------------------------ constructors

    @classmethod
    def graded(cls, submission: str, seed: int, rubric, criteria: dict, tier: Tier, tier_reason: str, *,
               numpy_named: dict, port_named: dict, port_cap: Tier | None, isolation: str, duration_s: float,
               smallest_failing: str | None = None, notes: list | None = None, diagnosis: dict | None = None,
               follow_ups: list | None = None, trials: dict | None = None) -> Report:
        """A report with a verdict, from the decided criteria (``{id: Criterion}``; one the rubric lists but
        ``criteria`` lacks is "not measured") and the mistakes named in each section (``{id: evidence}``).

        Each line is worth its rubric points scaled to ``max_score`` once the optional criteria left out
        (``Rubric.left_out``: not attempted, or no figure can judge it) are taken away; it earns them only
        when it passes. The score is the sum, to the hundredth.
        """
        statuses = {cid: c.status for cid, c in criteria.items()}
        left_out = rubric.left_out(statuses, {cid for cid, c in criteria.items() if c.unjudgeable})
        worth = scaled_points(rubric, left_out)
        lines = []
        for cid, spec in rubric.criteria.items():
            c = criteria.get(cid)
            status = Status(_name(Status, c.status, f"criteria[{cid}].status")) if c is not None else Status.ERROR
            lines.append(CriterionLine(cid, rubric.title(cid), status, worth[cid] if status == Status.PASS else 0.0,
                                       worth[cid], c.evidence if c is not None else "not measured",
                                       list(c.mistakes) if c is not None else [], section_of(cid), spec["tier"],
                                       cid not in left_out))
        named = sorted(set(numpy_named) | set(port_named))
        return cls(submission, seed, ReportStatus.GRADED, Tier(tier), tier_reason,
                   round(sum(line.points for line in lines), 2), rubric.max_score, lines, isolation, duration_s,
                   mistakes=named, notes=notes if notes is not None else [],
                   follow_ups=follow_ups if follow_ups is not None else [], smallest_failing=smallest_failing,
                   mistake_evidence={m: numpy_named.get(m) or port_named.get(m) for m in named},
                   numpy_mistakes=sorted(numpy_named), port_mistakes=sorted(port_named),
                   port_cap=Tier(port_cap) if port_cap is not None else None, diagnosis=diagnosis, trials=trials)

    @classmethod
    def not_graded(cls, submission: str, seed: int, rubric, reason: str, started: float | None = None) -> Report:
        """A report without a verdict for a hand-back that cannot be graded: ``reason`` says what to fix.
        ``started`` (``time.monotonic()`` at the start) gives its duration (0 without it)."""
        return cls._without_verdict(ReportStatus.NOT_GRADED, submission, seed, rubric, reason, started)

    @classmethod
    def crashed(cls, submission: str, seed: int, rubric, reason: str, started: float | None = None) -> Report:
        """A report without a verdict because the kit failed (``grader_error``): grade it again."""
        return cls._without_verdict(ReportStatus.GRADER_ERROR, submission, seed, rubric, reason, started)

    @classmethod
    def unmeasured(cls, submission: str, seed: int, rubric, why: str, *, isolation: str, notes: list,
                   output_tail: str, started: float | None = None,
                   lines: list[CriterionLine] | None = None) -> Report:
        """A graded report at the lowest tier: the candidate's code ran and failed before anything could be
        measured (``why``: an import error, a crash, answers that break the protocol). ``lines``: each
        criterion's line (default: every one not measured and worth its rubric points, as in a report
        without a verdict)."""
        report = cls._without_verdict(ReportStatus.NOT_GRADED, submission, seed, rubric, why, started)
        report.status, report.tier = ReportStatus.GRADED, rubric.lowest_tier()
        report.tier_reason = f"nothing could be measured: {why}"[:600]
        report.isolation, report.notes, report.output_tail = isolation, notes, output_tail
        if lines is not None:
            report.criteria = lines
        return report

    @classmethod
    def _without_verdict(cls, status: ReportStatus, submission: str, seed: int, rubric, reason: str,
                         started: float | None) -> Report:
        reason = clean(reason, 600)
        words = STATUS_LABEL[status]
        lines = [CriterionLine(cid, rubric.title(cid), Status.ERROR, 0.0, float(spec["points"]),
                               f"{words} (see the reason)", []) for cid, spec in rubric.criteria.items()]
        return cls(submission, seed, status, None, f"{words}: {reason}", 0.0, rubric.max_score, lines, "none",
                   round(time.monotonic() - started, 2) if started is not None else 0.0, error=reason)

    # ------------------------------------------------------------------ the ways out

    def to_dict(self) -> dict:
        """The report as JSON data (the one form every renderer and file reads), checked against the schema.

        Raises:
            ReportError: a field the schema refuses, or one set where this report's layout has no place for it
                (the message names it).
        """
        values = {
            "schema": SCHEMA, "submission": self.submission, "seed": self.seed,
            "status": _name(ReportStatus, self.status, "status"),
            "graded": _name(ReportStatus, self.status, "status") == ReportStatus.GRADED,
            "tier": _name(Tier, self.tier, "tier") if self.tier is not None else None,
            "tier_reason": self.tier_reason, "score": self.score, "max_score": self.max_score,
            "criteria": [line.to_dict() for line in self.criteria], "mistakes": list(self.mistakes),
            "mistake_evidence": _copy(self.mistake_evidence), "numpy_mistakes": _copy(self.numpy_mistakes),
            "port_mistakes": _copy(self.port_mistakes),
            "port_cap": _name(Tier, self.port_cap, "port_cap") if self.port_cap is not None else None,
            "smallest_failing": self.smallest_failing, "notes": list(self.notes), "diagnosis": self.diagnosis,
            "follow_ups": list(self.follow_ups), "isolation": self.isolation, "duration_s": self.duration_s,
            "trials": _copy(self.trials), "error": self.error, "probes": _copy(self.probes),
            "figures": _copy(self.figures), "output_tail": self.output_tail,
            "hand_back_sha256": self.hand_back_sha256, "grader_trace": self.grader_trace, "audience": self.audience,
        }
        layout = _ERROR_KEYS if self.error is not None else _VERDICT_KEYS
        out = {key: values[key] for key in layout}
        out.update((key, values[key]) for key in _TAIL if values[key] is not None)
        stray = [key for key, value in values.items() if value is not None and key not in out]
        if stray:
            raise ReportError(f"report of {self.submission!r}: {', '.join(stray)} set, but a report "
                              f"{'with an error' if self.error is not None else 'with a verdict'} has no such field")
        validate(out)
        return out

    def to_json(self) -> str:
        """The report as JSON text (what ``--out`` and ``--json`` write), checked against the schema.

        Raises:
            ReportError: as :meth:`to_dict`.
        """
        return json.dumps(self.to_dict(), indent=2)

    def to_gradescope(self, rubric=None, audience: str = "class") -> dict:
        """Gradescope's results.json for this report (see :func:`gradescope`), the report checked against
        the schema and the results against Gradescope's format.

        Raises:
            ReportError: as :meth:`to_dict`, or a results field Gradescope would refuse (named).
        """
        results = gradescope(self.to_dict(), rubric, audience)
        check_gradescope(results)
        return results


def _name(kind, value, where: str) -> str:
    """``value`` as the plain name of a member of the enum ``kind``; ReportError naming ``where`` if it is none."""
    try:
        return kind(value).value
    except ValueError:
        raise ReportError(f"report field {where}: {value!r} is not one of {', '.join(m.value for m in kind)}") \
            from None


def _copy(value):
    """A shallow copy of a list or dict (None stays None): the dict written never shares a container with the
    report it came from."""
    return type(value)(value) if isinstance(value, (list, dict)) else value


@functools.lru_cache(maxsize=1)
def _validator():
    """The schema's validator (jsonschema, which nbformat brings; format checks off), made once per process.

    Raises:
        ReportError: the schema file is missing or not JSON (an install without docs/report.schema.json).
    """
    from grader.stages.layout import without_iri_format_checker

    without_iri_format_checker()  # jsonschema's import would otherwise cost 1 to 2 CPU-s
    import jsonschema

    try:
        with open(SCHEMA_FILE, encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as exc:
        raise ReportError(f"the report schema {SCHEMA_FILE} cannot be read ({exc}): reports cannot be checked "
                          "or written") from exc
    return jsonschema.validators.validator_for(schema)(schema)


def validate(data: dict) -> None:
    """Check ``data`` (a report's JSON data) against docs/report.schema.json.

    Raises:
        ReportError: the first field the schema refuses, named by its path (``criteria[3].status``), with
            why; or the schema cannot be read.
    """
    validator = _validator()  # first: it keeps jsonschema's costly optional import out
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    submission = data.get("submission") if isinstance(data, dict) else None
    raise ReportError(f"report of {submission!r} does not follow {SCHEMA}: field {where or '(top level)'}: "
                      f"{shorten(error.message, 300)}")


# What Gradescope reads of results.json (its autograder specification): the fields the kit writes, with
# their types; a test's visibility is one of Gradescope's four.
_GRADESCOPE_TOP = {"score": (int, float), "output": str, "tests": list}
_GRADESCOPE_TEST = {"name": str, "score": (int, float), "max_score": (int, float), "output": str}
_VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")


def check_gradescope(results: dict) -> None:
    """Check Gradescope's results (as :func:`gradescope` makes them) before they are written.

    Raises:
        ReportError: a field missing or of the wrong type, named (``results.json tests[2].score``).
    """
    def check(obj, spec, where):
        for key, kind in spec.items():
            value = obj.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ReportError(f"results.json {where}{key}: {value!r} is not a "
                                  f"{'number' if kind == (int, float) else kind.__name__}")
        if obj.get("visibility", "visible") not in _VISIBILITY:
            raise ReportError(f"results.json {where}visibility: {obj['visibility']!r} is not one of "
                              f"{', '.join(_VISIBILITY)}")

    check(results, _GRADESCOPE_TOP, "")
    for i, test in enumerate(results["tests"]):
        if not isinstance(test, dict):
            raise ReportError(f"results.json tests[{i}]: not an object")
        check(test, _GRADESCOPE_TEST, f"tests[{i}].")


def read_report(path: str) -> dict | None:
    """A report read back from a JSON file (``--out``, ``--json`` with a folder): its dict, or None when the
    file cannot be read, is not JSON, or is not a whole report of this schema (an object whose ``schema`` is
    :data:`SCHEMA`). The rest of its fields are as the file has them: a reader checks what it uses."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


# ---------------------------------------------------------------------------------------- reading a report

def status_of(report: dict) -> ReportStatus:
    """The report's status; reports of older kits (no key) count as graded when they have a tier."""
    status = report.get("status")
    if status in STATUSES:
        return ReportStatus(status)
    return ReportStatus.GRADED if report.get("tier") and report.get("graded", True) else ReportStatus.NOT_GRADED


def reason(report: dict, rubric=None, audience: str = "hiring") -> str:
    """The tier reason in ``audience``'s words."""
    text = str(report.get("tier_reason", ""))
    return rubric.relabel(text, audience) if rubric is not None else text


def headline(report: dict, rubric=None, audience: str = "hiring") -> str:
    """The tier as ``audience`` reads it, or NOT GRADED / GRADER ERROR."""
    status = status_of(report)
    if status != ReportStatus.GRADED:
        return HEADLINE[status]
    return rubric.label(report["tier"], audience) if rubric is not None else str(report["tier"])


def criterion_label(report: dict, criterion: dict) -> str:
    """What a reader sees for one criterion: pass, fail, not attempted or not measured; in a report
    without a verdict, the report's own state (not graded, grader error), for nothing was checked."""
    status = status_of(report)
    if status != ReportStatus.GRADED:
        return STATUS_LABEL[status]
    return LABEL.get(criterion.get("status"), clean(criterion.get("status"), 40))


def merged_score(report: dict):
    """The score a gradebook merges: a graded report's score; 0 for a hand-back that cannot be graded
    (a blank notebook, no kv_cache.py: nothing of the student's earns points, as on Gradescope); None
    for a grader error (the kit failed: grade it again)."""
    status = status_of(report)
    if status == ReportStatus.GRADED:
        score = report.get("score")
        return score if isinstance(score, (int, float)) and not isinstance(score, bool) else None
    return 0.0 if status == ReportStatus.NOT_GRADED else None


def verdict_sentence(report: dict, rubric=None, audience: str = "hiring", word: str = "Verdict") -> str:
    """One sentence that says the verdict (or not graded, grader error) and why, each once:
    ``Result: Needs work — a mistake that decides the verdict alone: kv_repeat.``"""
    status = status_of(report)
    why = clean(reason(report, rubric, audience))
    if status != ReportStatus.GRADED:
        label = STATUS_LABEL[status]
        why = why.removeprefix(f"{label}: ")  # a report without a verdict says "<label>: <what to fix>"
    else:
        label = headline(report, rubric, audience)
        if why.startswith("capped by"):  # the cap is the verdict itself: said once
            why = why.replace(f" (caps the tier at {label})", "")
    if not why:
        return f"{word}: {label}."
    return f"{word}: {label} — {why}{'' if why.endswith('.') else '.'}"


def _error_said(report: dict, said: str) -> str:
    """The report's ``error`` cleaned, or "" when ``said`` (its reason, as shown) holds it already."""
    error = clean(report.get("error") or "")
    return "" if not error or error[:80] in said else error


def ungraded(name: str, seed: int, rubric, reason: str, status: str = ReportStatus.NOT_GRADED,
             started: float | None = None, **extra) -> dict:
    """A report without a verdict as its JSON dict: ``not_graded`` (fix the hand-back; :meth:`Report.not_graded`)
    or ``grader_error`` (the kit failed; :meth:`Report.crashed`); ``extra`` keys are added after.

    Raises:
        ValueError: ``status`` is neither.
    """
    if status not in (ReportStatus.NOT_GRADED, ReportStatus.GRADER_ERROR):
        raise ValueError(f"status must be not_graded or grader_error, got {status!r}")
    make = Report.crashed if status == ReportStatus.GRADER_ERROR else Report.not_graded
    report = make(name, seed, rubric, reason, started).to_dict()
    report.update(extra)
    return report

STYLE = {Status.PASS: "green", Status.FAIL: "red", Status.NOT_ATTEMPTED: "dim", Status.ERROR: "yellow"}
TIER_STYLE = {Tier.STRONG_HIRE: "bold green", Tier.HIRE: "bold cyan", Tier.WEAK: "bold red"}


def write_json_atomic(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    write_text_atomic(path, json.dumps(data, indent=2), suffix=".json")


def write_text_atomic(path: str, text: str, suffix: str = "") -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename; raises OSError (the temporary file
    removed) when the folder or the name cannot take it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    try:
        # A file name that is not UTF-8 (Linux allows any bytes) reaches here as a lone surrogate: escaped.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for the course staff to read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def print_report(report: dict, console=None, rubric=None, audience: str = "hiring") -> None:
    """The at-a-glance terminal view: tier, each criterion with one line of evidence, mistakes, questions.

    Every string is printed as rich ``Text`` (markup off) after :func:`clean`:
    a submission's exception message can neither style nor break the output.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    title = headline(report, rubric, audience)
    status = status_of(report)
    graded = status == ReportStatus.GRADED
    score = merged_score(report)
    rule = Text.assemble((clean(report["submission"], 200), "bold"), "  ",
                         (title, TIER_STYLE.get(report.get("tier") if graded else "", "bold yellow")),
                         f"  {score:g}/{report['max_score']:g}" if score is not None else "")
    console.rule(rule)
    if not graded:  # no verdict: the reason and what to fix, not a table of criteria that were never run
        ran = report.get("isolation") not in (None, "none")  # nothing of a hand-back refused before it ran
        console.print(Text(clean(reason(report, rubric, audience)) + (f" | isolation: {clean(report['isolation'])}"
                                                                      if ran else ""), style="yellow"))
        for note in report.get("notes", []):
            console.print(Text.assemble(("note: ", "yellow"), clean(note)))
        return
    said = clean(reason(report, rubric, audience))
    console.print(Text(f"{said} | seed {report['seed']} | {report['duration_s']} s | "
                       f"isolation: {clean(report['isolation'])}", style="dim"))
    error = _error_said(report, said)
    if error:
        console.print(Text(error, style="yellow"))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(width=max(map(len, LABEL.values())))
    table.add_column(no_wrap=False)
    table.add_column()
    for c in report["criteria"]:
        evidence = Text(clean(c["evidence"]), style="dim")
        if c["mistakes"]:
            evidence.append(f" ({', '.join(clean(m, 80) for m in c['mistakes'])})", style="red")
        table.add_row(Text(criterion_label(report, c), style=STYLE.get(c["status"], "")), Text(clean(c["title"])),
                      evidence)
    console.print(table)
    if report.get("mistakes"):
        console.print(Text.assemble(("Mistakes: ", "bold red"), clean(mistakes_line(report, rubric, audience))))
    if report.get("smallest_failing"):
        console.print(Text.assemble(("Smallest failing case: ", "bold"), clean(report["smallest_failing"])))
    diagnosis = report.get("diagnosis") or {}
    if diagnosis:
        console.print(Text.assemble(("Diagnosis: ", "bold"), clean(diagnosis.get("summary", ""))))
        for line in diagnosis.get("lines", []):
            console.print(Text("  " + clean(line)), highlight=False)
    for note in report.get("notes", []):
        console.print(Text.assemble(("note: ", "yellow"), clean(note)))
    if report.get("follow_ups") and audience == "hiring":
        console.print(Text("Ask next:", style="bold"))
        for q in report["follow_ups"]:
            console.print(Text.assemble(f"  - {clean(q['question'])}  ", (f"expect: {clean(q['answer'])}", "dim")))


def mistake_sections(report: dict) -> tuple[list, list]:
    """``(the NumPy part's mistakes, the port's)``: a name in the port caps the tier, the same name in
    NumPy may make it Weak, so the two are never counted as one."""
    port = list(report.get("port_mistakes") or [])
    numpy_side = report.get("numpy_mistakes")
    if numpy_side is None:  # reports of older kits
        numpy_side = [m for m in report.get("mistakes", []) if m not in port]
    return list(numpy_side), port


def mistakes_line(report: dict, rubric=None, audience: str = "hiring") -> str:
    """Named mistakes tagged by section: ``numpy: a, b; port: kv_repeat (caps the tier at Hire)``, the cap's
    tier in ``audience``'s words."""
    numpy_side, port = mistake_sections(report)
    parts = [f"numpy: {', '.join(numpy_side)}"] if numpy_side else []
    if port:
        cap = report.get("port_cap")
        if cap and rubric is not None:
            cap = rubric.label(cap, audience)
        parts.append(f"port: {', '.join(port)}" + (f" (caps the tier at {cap})" if cap else ""))
    return "; ".join(parts)


def write_markdown(path: str, reports: list[dict], rubric=None, audience: str = "hiring") -> None:
    """Write the Markdown report to ``path`` and each diagnosis picture as a PNG beside it (``<stem>-img/``)."""
    from grader.stages import pictures

    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.join(os.path.dirname(os.path.abspath(path)), f"{stem}-img")
    images = {}
    for i, r in enumerate(reports):
        for kind, pic in ((r.get("diagnosis") or {}).get("pictures") or {}).items():
            name = f"{i:03d}-{kind}.png"  # by position: no text of the submission's in a path or a link
            pictures.save(pic, kind, os.path.join(folder, name))
            images.setdefault(i, []).append((kind, f"{stem}-img/{name}"))
    write_text_atomic(path, markdown(reports, rubric, audience, images))


def markdown(reports: list[dict], rubric=None, audience: str = "hiring", images: dict | None = None) -> str:
    """All reports as one Markdown document (a summary table, then one section each); all text escaped.

    ``images``: report index -> ``[(kind, relative PNG path)]`` written by :func:`write_markdown`.
    """
    images = images or {}

    def score(r):
        merged = merged_score(r)
        return f"{merged:g}/{r['max_score']:g}" if merged is not None else f"-/{r['max_score']:g}"

    lines = ["# kvkit grading report", "", "| submission | tier | score | mistakes |", "| --- | --- | --- | --- |"]
    for r in reports:
        lines.append(f"| {md(r['submission'], 200)} | {md(headline(r, rubric, audience))} | "
                     f"{score(r)} | {md(', '.join(r['mistakes'])) or '-'} |")
    for i, r in enumerate(reports):
        said = md(reason(r, rubric, audience))
        lines += ["", f"## {md(r['submission'], 200)}: {md(headline(r, rubric, audience))} ({score(r)})", "",
                  f"{said}{'' if said.endswith('.') else '.'} Seed {r['seed']}, isolation: {md(r['isolation'])}."]
        if status_of(r) != ReportStatus.GRADED:  # no verdict: the reason says what to fix; no criterion was checked
            lines += [f"- note: {md(note)}" for note in r.get("notes", [])]
            continue
        error = _error_said(r, clean(reason(r, rubric, audience)))
        if error:
            lines += ["", md(error)]
        lines += ["", "| criterion | status | points | evidence |", "| --- | --- | --- | --- |"]
        for c in r["criteria"]:
            evidence = md(c["evidence"])
            if c["mistakes"]:
                evidence += f" (**{md(', '.join(c['mistakes']))}**)"  # catalogue ids, escaped all the same
            lines.append(f"| {md(c['title'])} | {criterion_label(r, c)} | {c['points']:g}/{c['max_points']:g} | "
                         f"{evidence} |")
        if r.get("mistakes"):
            lines += ["", f"Mistakes: {md(mistakes_line(r, rubric, audience))}"]
        if r.get("smallest_failing"):
            lines += ["", f"Smallest failing case: {md(r['smallest_failing'])}"]
        diagnosis = r.get("diagnosis") or {}
        if diagnosis:
            lines += ["", f"Diagnosis: {md(diagnosis.get('summary', ''))}"]
            if diagnosis.get("lines"):
                lines += ["", "```text", *[clean(line).replace("`", "'") for line in diagnosis["lines"]], "```"]
            lines += [f"![{kind}]({src})" for kind, src in images.get(i, [])]
        for note in r.get("notes", []):
            lines.append(f"- note: {md(note)}")
        if r.get("follow_ups") and audience == "hiring":
            lines += ["", "Interviewer follow-ups:"]
            lines += [f"- {md(q['question'])} *Expect:* {md(q['answer'])}" for q in r["follow_ups"]]
    return "\n".join(lines) + "\n"


def gradescope(report: dict, rubric=None, audience: str = "class") -> dict:
    """Gradescope's results.json: ``score``, ``max_score``, ``tests[]`` (name, score, max_score, output, visibility).

    Points per criterion; the tier in ``audience``'s words (a class by
    default). Evidence is already free of hidden values, so every test is
    visible; the follow-up questions are for interviewers and are left out.
    """
    tests = [{"name": clean(c["title"]), "score": c["points"], "max_score": c["max_points"],
              "status": "passed" if c["status"] == Status.PASS else "failed",
              "output": _test_output(report, c), "visibility": "visible"}
             for c in report["criteria"] if c.get("counted", True)]
    word = "Result" if audience == "class" else "Verdict"
    output = verdict_sentence(report, rubric, audience, word)
    if status_of(report) == ReportStatus.GRADED:
        for status in (Status.NOT_ATTEMPTED, Status.ERROR):
            left_out = [clean(c["title"]) for c in report["criteria"]
                        if not c.get("counted", True) and c.get("status") == status]
            if left_out:
                output += (f"\n{LABEL[status].capitalize()}, optional: {'; '.join(left_out)}. It counts neither "
                           f"for nor against: the other points are scaled to {report['max_score']:g}.")
    if report.get("smallest_failing"):
        output += f"\nSmallest failing case: {clean(report['smallest_failing'])}"
    diagnosis = report.get("diagnosis") or {}
    if diagnosis:
        output += f"\nDiagnosis: {clean(diagnosis.get('summary', ''))}"
        output += "".join(f"\n  {clean(line)}" for line in diagnosis.get("lines", []))
    error = _error_said(report, output)
    if error:
        output += f"\n{error}"
    score = merged_score(report)
    return {"score": score if score is not None else 0.0, "max_score": report["max_score"], "output": output,
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def _test_output(report: dict, criterion: dict) -> str:
    """One Gradescope test's output: the criterion's state in words, then its evidence and mistakes."""
    label = criterion_label(report, criterion)
    if status_of(report) != ReportStatus.GRADED:
        return label  # the headline says why, once
    evidence = clean(criterion.get("evidence") or "")
    text = evidence if evidence.lower().startswith(label) else f"{label}: {evidence}" if evidence else label
    mistakes = criterion.get("mistakes") or []
    return text + (f" Mistakes: {clean(', '.join(mistakes))}." if mistakes else "")
