"""``kvkit grade`` / ``python -m grader``: grade submissions and print their verdicts.

With no SUBMISSION it grades the bundled example submissions of the mistakes
catalogue (``catalogue/examples/``). A directory that holds no ``kv_cache.py``
(nor notebook) is a folder of submissions: each entry in it is graded.
Exit status: 0 when every submission was graded, whatever the verdicts; 2 on a
usage error.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

from grader import report as report_mod
from grader.grade import SCHEMA, Options, grade
from grader.rubric import AUDIENCES, RubricError, load as load_rubric

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "catalogue", "examples")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvkit grade", description=__doc__.split("\n\n")[0])
    p.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                   help="a directory, a .py file, a .ipynb notebook, or a folder of them (default: the bundled examples)")
    p.add_argument("--json", metavar="FILE", help="write the reports as JSON (a list; a directory: one file each)")
    p.add_argument("--markdown", metavar="FILE", help="write the reports as Markdown")
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json (one submission)")
    p.add_argument("--seed", type=int, help="seed of the hidden trials (default: random, recorded in the report)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-clock seconds per sandboxed run (default 60)")
    p.add_argument("--trials", type=int, default=200, help="random trials (at least 200 for a verdict; default 200)")
    p.add_argument("--rubric", metavar="FILE", help="a rubric TOML file (default: grader/rubric.toml)")
    p.add_argument("--out", metavar="DIR", help="write each report into DIR/<name>.json as it completes, "
                                                "plus summary.md and summary.csv")
    p.add_argument("--resume", action="store_true", help="with --out: skip submissions already graded there")
    p.add_argument("--isolation", choices=["auto", "process", "namespaces"], default="auto",
                   help="process: child process and limits; namespaces: also Linux namespaces (auto: the best available)")
    p.add_argument("--quiet", action="store_true", help="no per-submission verdicts on the terminal")
    p.add_argument("--audience", choices=list(AUDIENCES), default="hiring",
                   help="whose words for the tiers: hiring (Weak / Hire / Strong Hire, with interviewer "
                        "questions) or class (the rubric's classroom names, no questions)")
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
    """A folder is a class of submissions unless it is one itself (kv_cache.py, a notebook, or files only a
    submission holds), or holds nothing to grade."""
    names = [n for n in os.listdir(path) if not n.startswith(".")]
    if not names or "kv_cache.py" in names or any(n.endswith(".ipynb") for n in names):
        return False
    if any(n in SUBMISSION_FILES or (n.startswith("test_") and n.endswith(".py")) for n in names):
        return False
    # A class holds submissions: folders, .py files or zips. A folder of other files is one bad hand-back.
    return any(n.endswith((".py", ".zip")) or os.path.isdir(os.path.join(path, n)) for n in names)


def _grade_one(path: str, options: Options) -> dict:
    """Grade one submission; a grader failure on hostile input becomes that submission's report, never the batch's end."""
    import time
    import traceback

    started = time.monotonic()
    try:
        return grade(path, options)
    except Exception as exc:  # noqa: BLE001
        from grader.grade import _error_report
        from grader.submission import name_of

        report = _error_report(name_of(path), options, f"the grader failed on this submission ({type(exc).__name__}: "
                               f"{str(exc)[:200]})", started, status="grader_error")
        report["grader_trace"] = traceback.format_exc()[-1500:]
        return report


def finished_reports(paths: list[str], out_dir: str) -> dict:
    """``{path: report}`` for the submissions whose report in ``out_dir`` is finished and graded.

    Only a whole report of this schema with ``status: graded`` counts: a
    ``not_graded`` or ``grader_error`` report, a half-written or foreign file
    is graded again by ``--resume``.
    """
    import json

    done = {}
    for path in paths:
        try:
            with open(os.path.join(out_dir, report_name(path))) as f:
                previous = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(previous, dict) and previous.get("schema") == SCHEMA and previous.get("status") == "graded":
            done[path] = previous
    return done


def report_name(path: str) -> str:
    """The file name a submission's report gets in ``--out``."""
    return os.path.basename(os.path.normpath(path)).replace(os.sep, "_") + ".json"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths = expand(args.submissions) if args.submissions else \
        [p for p in expand([EXAMPLES]) if os.path.isdir(p)]  # the bundled examples: one folder each
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        print(f"kvkit grade: no such submission: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.timeout <= 0 or args.trials < 1:
        print("kvkit grade: --jobs, --timeout and --trials must be positive", file=sys.stderr)
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

    options = Options(seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
                      timeout=args.timeout, trials=args.trials, rubric=rubric,
                      isolation=isolation.choose(args.isolation))
    if options.isolation and options.isolation.warning:
        print(f"warning: {options.isolation.warning}", file=sys.stderr)

    done = {}
    if args.resume:
        done = finished_reports(paths, args.out)
        print(f"--resume: kept {len(done)} finished report(s) in {args.out}; grading {len(paths) - len(done)}",
              file=sys.stderr)
    todo = [p for p in paths if p not in done]
    reports = dict(done)
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=False)
    show_progress = len(todo) > 1 and (args.jobs > 1 or args.quiet)

    def finished(path, rep):
        reports[path] = rep
        if args.out:  # written before anything is printed: a rendering failure loses nothing
            report_mod.write_json_atomic(os.path.join(args.out, report_name(path)), rep)
        if not args.quiet:
            try:
                report_mod.print_report(rep, console, rubric, args.audience)
            except Exception as exc:  # noqa: BLE001 - the report is safe on disk; say so and go on
                print(f"{rep.get('submission')!r}: report not shown ({type(exc).__name__})", file=sys.stderr)

    try:
        if args.jobs == 1:
            with Progress(console=console, transient=True, disable=not show_progress) as progress:
                task = progress.add_task("grading", total=len(todo))
                for path in todo:
                    finished(path, _grade_one(path, options))
                    progress.advance(task)
        else:
            pool = ProcessPoolExecutor(max_workers=args.jobs)
            try:
                with Progress(console=console, transient=True) as progress:
                    task = progress.add_task("grading", total=len(todo))
                    futures = {pool.submit(_grade_one, p, options): p for p in todo}
                    for future in as_completed(futures):
                        finished(futures[future], future.result())
                        progress.advance(task)
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
    except KeyboardInterrupt:
        _stop_workers()
        where = f"; rerun with --out {args.out} --resume to grade the rest" if args.out else ""
        print(f"\nstopped: {len(reports) - len(done)} report(s) written this run, {len(done)} kept{where}",
              file=sys.stderr)
        return 130

    ordered = [reports[p] for p in paths]
    if args.json:
        if args.json.endswith(os.sep) or os.path.isdir(args.json):
            for path in paths:
                report_mod.write_json_atomic(os.path.join(args.json, report_name(path)), reports[path])
        else:
            report_mod.write_json_atomic(args.json, ordered)
    if args.markdown:
        report_mod.write_text_atomic(args.markdown, report_mod.markdown(ordered, rubric, args.audience))
    if args.gradescope:
        report_mod.write_json_atomic(args.gradescope, report_mod.gradescope(ordered[0], rubric, args.audience))
    if args.out:
        from grader import summary

        summary.write(ordered, args.out, rubric=rubric, audience=args.audience)
    if len(ordered) > 1:
        from grader import summary

        summary.print_summary(ordered, console, rubric, args.audience)
    return 0


def _stop_workers() -> None:
    """Kill this process's children (pool workers; their sandboxes die with them)."""
    import signal

    try:
        import multiprocessing

        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signal.SIGKILL)
            except OSError:
                pass
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


if __name__ == "__main__":
    sys.exit(main())
