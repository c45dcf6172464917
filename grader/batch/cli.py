"""``kvkit grade`` / ``python -m grader``: grade submissions and print their verdicts.

With no SUBMISSION it grades the bundled example submissions of the mistakes
catalogue (``catalogue/examples/``). A directory that holds no ``kv_cache.py``
(nor notebook) is a folder of submissions: each entry in it is graded.
Exit status: 0 when every submission was graded, whatever the verdicts; 2 on a
usage error; 130 when stopped by Ctrl-C (SIGINT): then within about a second
every sandbox is killed, every temporary folder removed, and one line says how
many reports were written and how to resume.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from grader import KIT_ROOT
from grader.sandbox import reaper
from grader.stages import report as report_mod
from grader.stages.grade import FULL_TRIALS, Options, grade_report, prepare_inputs
from grader.stages.rubric import AUDIENCES, RubricError, load as load_rubric
from grader.stages.verdicts import TIERS, ReportStatus
from grader.stages.layout import name_of

EXAMPLES = os.path.join(KIT_ROOT, "catalogue", "examples")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvkit grade", description=__doc__.split("\n\n")[0])
    p.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                   help="a directory, a .zip of one, a .py file, a .ipynb notebook, or a folder of them "
                        "(default: the bundled examples)")
    p.add_argument("--json", metavar="FILE", help="write the reports as JSON (a list; a directory: one file each)")
    p.add_argument("--markdown", metavar="FILE", help="write the reports as Markdown")
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json (one submission)")
    p.add_argument("--seed", type=int, help="seed of the hidden trials, 0 or more (default: random, recorded in the "
                                            "report; with --resume, the kept reports' seed)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-clock seconds per sandboxed run (default 60)")
    p.add_argument("--trials", type=int, help="random trials (default 200, a full grading; fewer are quicker, and "
                                              "each report says so; with --resume, the kept reports' count)")
    p.add_argument("--rubric", metavar="FILE", help="a rubric TOML file (default: grader/rubric.toml)")
    p.add_argument("--out", metavar="DIR", help="write each report into DIR/<name>.json as it completes, "
                                                "plus summary.md, summary.csv and grades.csv")
    p.add_argument("--resume", action="store_true", help="with --out: skip submissions already graded there")
    p.add_argument("--isolation", choices=["auto", "process", "namespaces"], default="auto",
                   help="process: child process and limits; namespaces: also Linux namespaces (auto: the best available)")
    p.add_argument("--quiet", action="store_true", help="no per-submission verdicts on the terminal")
    p.add_argument("--audience", choices=list(AUDIENCES),
                   help="whose words for the tiers: hiring (the default: Weak / Hire / Strong Hire, with interviewer "
                        "questions) or class (the rubric's classroom names, no questions); with --resume, the kept "
                        "reports' audience")
    return p


def expand(paths: list[str]) -> list[str]:
    """Submissions named by ``paths``: a folder without kv_cache.py (or a notebook) is a class, one row per entry.

    Every entry of a class folder but hidden ones gets a row: folders, ``.py``,
    ``.ipynb`` and ``.zip`` are graded; anything else, and any symbolic link,
    gets a ``not_graded`` report saying why (``grade`` refuses it).
    """
    found = []
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path) and _is_class(path):
            found += sorted(os.path.join(path, n) for n in os.listdir(path) if not n.startswith("."))
        else:
            found.append(path)
    return found


# Files that only a submission holds: a folder with one of them (and no kv_cache.py) is a submission
# whose kv_cache.py is missing, not a class.
SUBMISSION_FILES = ("cost.py", "kv_cache_torch.py", "conftest.py")


def _is_class(path: str) -> bool:
    """A folder is a class of submissions unless it is one itself (kv_cache.py, files only a submission
    holds, or a single notebook and nothing else to grade), or holds nothing to grade."""
    names = [n for n in os.listdir(path) if not n.startswith(".")]
    if not names or "kv_cache.py" in names:
        return False
    if any(n in SUBMISSION_FILES or (n.startswith("test_") and n.endswith(".py")) for n in names):
        return False
    notebooks = [n for n in names if n.endswith(".ipynb")]
    others = [n for n in names if n.endswith((".py", ".zip")) or os.path.isdir(os.path.join(path, n))]
    if len(notebooks) == 1 and not others:
        return False  # one notebook and its notes: a notebook hand-back
    if notebooks:
        return True  # several notebooks, or notebooks beside folders and files: a class
    # A class holds submissions: folders, .py files or zips. A folder of other files is one bad hand-back.
    return any(n.endswith((".py", ".zip")) or os.path.isdir(os.path.join(path, n)) for n in names)


def _grade_one(path: str, options: Options) -> report_mod.Report:
    """Grade one submission; a grader failure on hostile input becomes that submission's report (a grader
    error), never the batch's end. So does a report the kit could not write (``ReportError``): it is checked
    against the schema here, in the worker, before the batch takes it."""
    import time
    import traceback

    started = time.monotonic()
    try:
        report = grade_report(path, options)
        report.to_dict()  # checked now: a report that cannot be written is this submission's grader error
        return report
    except Exception as exc:  # noqa: BLE001
        report = report_mod.Report.crashed(name_of(path), options.seed, options.rubric,
                                           f"the grader failed on this submission ({type(exc).__name__}: "
                                           f"{str(exc)[:200]})", started)
        report.grader_trace = traceback.format_exc()[-1500:]
        return report


def finished_reports(paths: list[str], out_dir: str, changed: list | None = None, names: dict | None = None) -> dict:
    """``{path: report}`` for the submissions whose report in ``out_dir`` is finished, graded, and of the
    hand-back as it is now.

    Only a whole report of this schema with ``status: graded`` and this
    hand-back's name counts: a ``not_graded`` or ``grader_error`` report, a
    half-written or foreign file, another hand-back's report (the batch's names
    moved since) is graded again by ``--resume``, and so is a hand-back whose files differ
    from those its report graded (``hand_back_sha256``: a student handed in
    again), which ``changed``, when given, lists.
    """
    from grader.stages.layout import hand_back_sha256

    done = {}
    names = names or batch_names(paths)
    files = report_files(paths, names)
    for path in paths:
        previous = report_mod.read_report(os.path.join(out_dir, files[path]))  # None: unreadable, cut short, foreign
        if previous is None or previous.get("status") != ReportStatus.GRADED:
            continue
        if previous.get("submission") != names[path]:  # another hand-back's (the batch's names moved since)
            continue
        if not _well_formed(previous):  # edited by hand, or by another tool: the summaries could not read it
            continue
        if previous.get("hand_back_sha256") != hand_back_sha256(path):
            if changed is not None:
                changed.append(path)
            continue
        done[path] = previous
    return done


def _well_formed(report: dict) -> bool:
    """Whether a kept report has the fields the summaries read, of their types: a tier of the rubric, a
    number for its score, criteria each with a text id and status, lists of mistake ids."""
    texts = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)  # noqa: E731
    criteria = report.get("criteria")
    return (report.get("tier") in TIERS and isinstance(report.get("score"), (int, float))
            and not isinstance(report.get("score"), bool) and isinstance(criteria, list)
            and all(isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("status"), str)
                    for c in criteria)
            and all(texts(report.get(key, [])) for key in ("mistakes", "numpy_mistakes", "port_mistakes")))


def _resume(args, paths: list[str]) -> dict:
    """``--resume``: the finished reports kept (``finished_reports``), said on stderr. The rest of the class
    is graded on the same hidden trials and in the same words as them unless the command says otherwise:
    their seed, random trials' count and audience fill in what ``args`` leaves unset. A report in --out is a
    file like any other: only values the command line would accept are taken."""
    changed: list = []
    done = finished_reports(paths, args.out, changed, batch_names(paths))
    said = f" ({len(changed)} handed in again since: {report_mod.clean(', '.join(map(name_of, changed[:5])), 300)}" \
        f"{', ...' if len(changed) > 5 else ''})" if changed else ""
    kept = {"seed": _most_common(done, lambda r: r.get("seed"), lambda v: _is_int(v) and 0 <= v < 2**63),
            "trials": _most_common(done, lambda r: (r.get("trials") if isinstance(r.get("trials"), dict)
                                                    else {}).get("random"), lambda v: _is_int(v) and v >= 1),
            "audience": _most_common(done, lambda r: r.get("audience"), lambda v: v in AUDIENCES)}
    taken = []
    for name, value in kept.items():
        if value is not None and getattr(args, name) is None:
            setattr(args, name, value)
            taken.append(f"{name} {value}")
    if taken:
        said += f"; {', '.join(taken)}, as the kept reports"
    print(f"--resume: kept {len(done)} finished report(s) in {args.out}; grading {len(paths) - len(done)}{said}",
          file=sys.stderr)
    return done


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _most_common(reports: dict, read, valid):
    """The value ``read`` takes most often over ``reports`` among those ``valid`` accepts, or None."""
    values = Counter(v for v in map(read, reports.values()) if isinstance(v, (int, str)) and valid(v))
    return values.most_common(1)[0][0] if values else None


def batch_names(paths: list[str]) -> dict:
    """``{path: display name}``: each submission's file or folder name, with as many of its parent folders as
    tell apart hand-backs of one name (``alice/kv_cache/kv_cache.ipynb`` beside ``bob/kv_cache/kv_cache.ipynb``,
    nbgrader's ``submitted/`` layout), so that no report in ``--out`` overwrites another."""
    parts = {p: os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths}
    depth = dict.fromkeys(paths, 1)
    while True:
        names = {p: "/".join(parts[p][-depth[p]:]) for p in paths}
        seen = Counter(names.values())
        clash = [p for p in paths if seen[names[p]] > 1 and depth[p] < len(parts[p])]
        if not clash:
            return names
        for p in clash:
            depth[p] += 1


REPORT_NAME_BYTES = 200  # of a report's file name before ".json": a file system allows 255


def report_files(paths: list[str], names: dict | None = None) -> dict:
    """``{path: the file name of its report in --out}``: ``report_name`` of its display name, with ``-2``,
    ``-3`` ... on the later of hand-backs whose files would be one (the same name but for its case or its
    Unicode normal form, on a file system that ignores them, or a folder named like another's flattened
    name and digest)."""
    import unicodedata

    def folded(file: str) -> str:  # one name to a file system that ignores case and Unicode normal forms
        return unicodedata.normalize("NFC", file).casefold()

    names = names or batch_names(paths)
    files, taken = {}, set()
    for path in paths:
        stem = report_name(names[path])[:-len(".json")]
        file, n = stem + ".json", 1
        while folded(file) in taken:
            n += 1
            file = f"{stem}-{n}.json"
        files[path] = file
        taken.add(folded(file))
    return files


def report_name(name: str) -> str:
    """The file name the report of a submission of display name ``name`` (``batch_names``) gets in ``--out``:
    the name itself, or, for a name with folders in it or too long for a file name, the name flattened and
    cut, with a digest of the whole (``a/k.py`` beside a hand-back named ``a_k.py``)."""
    flat = name.replace("/", "_").replace(os.sep, "_")
    raw = flat.encode("utf-8", "surrogateescape")
    if flat == name and len(raw) <= REPORT_NAME_BYTES:
        return name + ".json"
    import hashlib

    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return raw[:REPORT_NAME_BYTES].decode("utf-8", "ignore") + f"-{digest}.json"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths = expand(args.submissions) if args.submissions else \
        [p for p in expand([EXAMPLES]) if os.path.isdir(p)]  # the bundled examples: one folder each
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        print(f"kvkit grade: no such submission: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.timeout <= 0 or (args.trials is not None and args.trials < 1):
        print("kvkit grade: --jobs, --timeout and --trials must be positive", file=sys.stderr)
        return 2
    if args.seed is not None and not 0 <= args.seed < 2**63:
        print(f"kvkit grade: --seed must be an integer from 0 to 2**63 - 1, got {args.seed}", file=sys.stderr)
        return 2
    if args.resume and not args.out:
        print("kvkit grade: --resume needs --out DIR", file=sys.stderr)
        return 2
    if args.gradescope and len(paths) != 1:
        print("kvkit grade: --gradescope writes one submission's results; give exactly one", file=sys.stderr)
        return 2
    try:
        rubric = load_rubric(args.rubric)
    except RubricError as exc:
        print(f"kvkit grade: {exc}", file=sys.stderr)
        return 2
    from grader.sandbox import isolation

    done = _resume(args, paths) if args.resume else {}
    args.audience = args.audience or "hiring"
    options = Options(seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
                      timeout=args.timeout, trials=args.trials or FULL_TRIALS, rubric=rubric,
                      isolation=isolation.choose(args.isolation))
    if options.isolation and options.isolation.warning:
        print(f"warning: {options.isolation.warning}", file=sys.stderr)
    todo = [p for p in paths if p not in done]
    reports = dict(done)
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=False)
    show_progress = len(todo) > 1 and (args.jobs > 1 or args.quiet)

    names = batch_names(paths)
    files = report_files(paths, names)
    unwritten: list = []

    def finished(path, report: report_mod.Report):
        report.submission = names[path]  # its folder too, where another hand-back has its name
        report.audience = args.audience  # what a --resume of this batch takes up
        rep = reports[path] = report.to_dict()  # the report's one serialisation: every file and view reads it
        if args.out:  # written before anything is printed: a rendering failure loses nothing
            try:
                report_mod.write_json_atomic(os.path.join(args.out, files[path]), rep)
            except OSError as exc:  # the disk, not the hand-back: say so, grade the rest, exit 1
                unwritten.append(path)
                print(f"kvkit grade: the report of {report_mod.clean(names[path], 200)!r} could not be written "
                      f"({type(exc).__name__}: {report_mod.clean(str(exc), 200)})", file=sys.stderr)
        if not args.quiet:
            try:
                report_mod.print_report(rep, console, rubric, args.audience)
            except SystemExit:  # rich's answer to a closed pipe (`| head`): stop printing, keep grading and writing
                args.quiet = args.pipe_closed = True
            except Exception as exc:  # noqa: BLE001 - the report is safe on disk; say so and go on
                print(f"{report_mod.clean(rep.get('submission'), 200)!r}: report not shown ({type(exc).__name__})",
                      file=sys.stderr)

    stop = _Interrupt()
    stop.install()
    try:
        if args.jobs == 1:
            with Progress(console=console, transient=True, disable=not show_progress) as progress:
                task = progress.add_task("grading", total=len(todo))
                for path in todo:
                    report = _grade_one(path, options)  # Ctrl-C raises KeyboardInterrupt in here
                    with stop.deferred():  # but not while the report is written and shown
                        finished(path, report)
                        progress.advance(task)
        else:
            prepare_inputs(options)  # once, here: the workers are forked from this process and share them
            pool = ProcessPoolExecutor(max_workers=args.jobs, initializer=_worker_init)
            try:
                with Progress(console=console, transient=True) as progress, stop.deferred():
                    task = progress.add_task("grading", total=len(todo))
                    futures = {pool.submit(_grade_one, p, options): p for p in todo}
                    pending = set(futures)
                    while pending:
                        ready, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                        if stop.hit:  # noted by the handler (deferred): act on it here, between results
                            raise KeyboardInterrupt
                        for future in ready:
                            finished(futures[future], future.result())
                            progress.advance(task)
            except KeyboardInterrupt:
                reaper.stop_workers()
                raise
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
    except KeyboardInterrupt:
        if args.jobs == 1:
            reaper.stop_own_sandboxes()
        written = len(reports) - len(done)
        left = len(paths) - len(reports)
        if args.out:
            line = (f"stopped: {written} report(s) written to {args.out} this run"
                    + (f" ({len(done)} kept from before)" if done else "")
                    + f", {left} left: rerun the same command with --resume to grade the rest")
        else:
            line = (f"stopped: {written} of {len(todo)} submission(s) graded, no report written (no --out DIR); "
                    f"rerun with --out DIR, then --out DIR --resume after a stop, to keep them")
        print(("\r" if sys.stderr.isatty() else "") + line, file=sys.stderr, flush=True)  # \r: over the "^C"
        return 130
    finally:
        stop.restore()

    ordered = [reports[p] for p in paths]
    if args.json:
        if args.json.endswith(os.sep) or os.path.isdir(args.json):
            for path in paths:
                report_mod.write_json_atomic(os.path.join(args.json, files[path]), reports[path])
        else:
            report_mod.write_json_atomic(args.json, ordered)
    if args.markdown:
        report_mod.write_markdown(args.markdown, ordered, rubric, args.audience)
    if args.gradescope:
        results = report_mod.gradescope(ordered[0], rubric, args.audience)
        report_mod.check_gradescope(results)
        report_mod.write_json_atomic(args.gradescope, results)
    if args.out:
        from grader.batch import summary

        summary.write(ordered, args.out, rubric=rubric, audience=args.audience)
    if len(ordered) > 1 and not getattr(args, "pipe_closed", False):
        from grader.batch import summary

        try:
            summary.print_summary(ordered, console, rubric, args.audience)
        except SystemExit:  # a closed pipe: every file is written already
            pass
    if unwritten:
        print(f"kvkit grade: {len(unwritten)} report(s) could not be written to {args.out} (see above)",
              file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- Ctrl-C
#
class _Interrupt:
    """The grader's SIGINT handler: the first SIGINT raises KeyboardInterrupt, or while deferred only sets
    ``hit``; a later one does nothing (the clean-up is not cut short)."""

    def __init__(self):
        self.hit = False
        self.defer = 0
        self.previous = None

    def __call__(self, signum, frame):
        first = not self.hit
        self.hit = True
        if first and not self.defer:
            raise KeyboardInterrupt

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def deferred(self):
        import contextlib

        @contextlib.contextmanager
        def block():
            self.defer += 1
            try:
                yield
            finally:
                self.defer -= 1
            if self.hit:
                raise KeyboardInterrupt

        return block()


def _worker_init() -> None:
    """In each --jobs worker: Ctrl-C is the grader's to handle (not SIG_IGN, which exec would pass on to the
    sandboxes)."""
    signal.signal(signal.SIGINT, _ignore_signal)


def _ignore_signal(signum, frame) -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
