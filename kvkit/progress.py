"""The learner's progress view, in the spirit of rustlings: ``kvkit progress`` and ``kvkit hint``.

Reads the step list from ``steps.toml`` in the exercises directory (step order,
goals, test files, hints: data, not code), runs each step's tests with pytest
in its own process, and shows every step as done or pending, the current
step's goal in one sentence and its first failing check in plain words.

    kvkit progress [--dir DIR] [--watch]     every step, done or pending; exit 0 only when all pass
    kvkit hint [--dir DIR] [--step N]        the next hint for the current step, one at a time

This file is self-contained (the standard library, plus rich when it is
installed), so the starter bundle ships a copy of it as ``progress.py``:

    python progress.py [--watch]            python progress.py hint
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

STEPS_FILE = "steps.toml"
HINTS_STATE = ".kvkit-hints.json"
IMPL_ENV = "KVKIT_IMPL"
STEP_TIMEOUT_S = 600


class UsageError(Exception):
    """A problem with the command line or the exercises directory (exit code 2)."""


@dataclass
class Step:
    """One step of ``steps.toml``."""

    number: int
    title: str
    goal: str
    tests: list[str]
    fills: str = ""
    hints: list[str] = field(default_factory=list)


@dataclass
class Result:
    """What running one step's tests gave.

    ``status`` is "done" (every check passed) or "pending"; ``failure`` is the
    first failing check in plain words ('' when done), ``check`` its test id.
    """

    step: Step
    status: str
    passed: int = 0
    failed: int = 0
    check: str = ""
    failure: str = ""
    seconds: float = 0.0
    properties: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- steps

def find_exercises(given: str | None) -> Path:
    """The exercises directory: ``given``; else ./exercises, ., or this file's own directory, whichever holds steps.toml.

    Raises:
        UsageError: no such directory, or no steps.toml in it.
    """
    if given:
        folder = Path(given).expanduser().resolve()
        if not (folder / STEPS_FILE).is_file():
            raise UsageError(f"{folder} is not an exercises directory: it has no {STEPS_FILE}")
        return folder
    for folder in (Path("exercises"), Path("."), Path(__file__).resolve().parent):
        if (folder / STEPS_FILE).is_file():
            return folder.resolve()
    raise UsageError(f"no exercises directory here (looked for ./exercises/{STEPS_FILE} and ./{STEPS_FILE}); "
                     f"pass --dir DIR, or run this inside the kit or a starter bundle")


def load_steps(folder: Path) -> list[Step]:
    """The steps of ``folder/steps.toml``, in file order.

    Raises:
        UsageError: the file is not valid TOML, or a step lacks a field or names a missing test file.
    """
    path = folder / STEPS_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    steps = []
    for i, raw in enumerate(data.get("step", []), start=1):
        try:
            step = Step(number=int(raw.get("number", i)), title=raw["title"], goal=raw["goal"],
                        tests=list(raw["tests"]), fills=raw.get("fills", ""), hints=list(raw.get("hints", [])))
        except KeyError as exc:
            raise UsageError(f"{path}: step {i} has no {exc.args[0]!r}") from exc
        for test in step.tests:
            if not (folder / test).is_file():
                raise UsageError(f"{path}: step {step.number} names {test}, which is not in {folder}")
        steps.append(step)
    if not steps:
        raise UsageError(f"{path} lists no [[step]]")
    return steps


# --------------------------------------------------------------------------- running

def _first_failure(xml_path: Path) -> tuple[int, int, str, str, dict]:
    """``(passed, failed, check, message, properties)`` from a pytest JUnit XML report."""
    root = ET.parse(xml_path).getroot()
    passed = failed = 0
    check = message = ""
    properties: dict = {}
    for case in root.iter("testcase"):
        for prop in case.iter("property"):
            properties[prop.get("name", "")] = prop.get("value", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            if case.find("skipped") is None:
                passed += 1
            continue
        failed += 1
        if check:
            continue
        name = case.get("name", "")
        module = (case.get("classname", "") or "").split(".")[-1]
        check = f"{module}.py::{name}" if module else name
        text = (bad.text or "").strip()
        attr = (bad.get("message") or "").strip()
        if attr.startswith("Failed: ") and text:
            message = text  # a plain-words failure (pytest.fail(..., pytrace=False)): the whole message
        else:
            # An exception the step tests did not explain: its message and where it was raised.
            where = [line.strip() for line in text.splitlines() if line.strip()][-1:] if text else []
            message = attr + (f"  ({where[0]})" if where and where[0] != attr else "")
    return passed, failed, check, message, properties


def run_step(step: Step, folder: Path, timeout: float = STEP_TIMEOUT_S, impl: Path | None = None) -> Result:
    """Run one step's tests with pytest in a fresh process and read back the first failure.

    The tests check the code in ``impl`` when given, else in ``$KVKIT_IMPL``
    when set, else in ``folder``.
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvkit-progress-") as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--tb=short",
               f"--junitxml={report}", "-o", "junit_family=xunit1", *step.tests]
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        if "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in env:
            # The step tests need no plugin; skipping them halves pytest's start. Step 7 turns them back
            # on for the learner's own tests.
            env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", KVKIT_PLUGINS_OFF="1")
            env.pop("PYTEST_ADDOPTS", None)  # options for plugins that are now off (say, -n of xdist)
        if impl is not None:
            env[IMPL_ENV] = str(impl)
        try:
            proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(step, "pending", check="(timeout)", seconds=time.monotonic() - start,
                          failure=f"step {step.number}: its tests were still running after {timeout:.0f} s: "
                                  f"is there an endless loop?")
        seconds = time.monotonic() - start
        if report.is_file():
            passed, failed, check, message, props = _first_failure(report)
        else:
            passed, failed, check, message, props = 0, 0, "", "", {}
    if proc.returncode == 0 and failed == 0 and passed > 0:
        return Result(step, "done", passed=passed, seconds=seconds, properties=props)
    if not message:
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-6:]
        message = (f"step {step.number}: pytest could not run its tests (exit code {proc.returncode}):\n"
                   + "\n".join(tail))
    return Result(step, "pending", passed=passed, failed=failed, check=check, failure=message,
                  seconds=seconds, properties=props)


def run_all(steps: list[Step], folder: Path, jobs: int | None = None, impl: Path | None = None) -> list[Result]:
    """Every step's result, in step order; steps run side by side in ``jobs`` processes."""
    jobs = jobs or max(1, min(len(steps), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda s: run_step(s, folder, impl=impl), steps))


def run_until_pending(steps: list[Step], folder: Path) -> Result | None:
    """Run the steps in order and stop at the first that is not done; None when all are."""
    for step in steps:
        result = run_step(step, folder)
        if result.status != "done":
            return result
    return None


# --------------------------------------------------------------------------- output

class Out:
    """Prints with rich when it is installed (colour, wrapping), plain text otherwise."""

    def __init__(self, console=None):
        self.console = console
        if console is None:
            try:
                from rich.console import Console
                self.console = Console(soft_wrap=not sys.stdout.isatty(), highlight=False)
            except ImportError:
                self.console = None

    def line(self, *parts) -> None:
        """Print one line made of ``(text, style)`` parts or plain strings (text is never read as markup)."""
        parts = [p if isinstance(p, tuple) else (p, "") for p in parts]
        if self.console is None:
            print("".join(text for text, _ in parts))
            return
        from rich.text import Text
        line = Text()
        for text, style in parts:
            line.append(text, style=style or None)
        self.console.print(line)

    def clear(self) -> None:
        if self.console is not None and self.console.is_terminal:
            self.console.clear()


def render(results: list[Result], folder: Path, out: Out, prog: str) -> None:
    """Every step as done or pending, then the current step's goal and first failure."""
    impl = os.environ.get(IMPL_ENV)
    out.line(("GQA over a preallocated KV cache: your progress", "bold"), f"  ({folder})")
    if impl:
        out.line(f"checking the code in {impl} (${IMPL_ENV})")
    out.line("")
    current = next((r for r in results if r.status != "done"), None)
    for r in results:
        mark, style = ("✔", "green") if r.status == "done" else ("✘" if r is current else "·", "red" if r is current else "dim")
        count = f"{r.passed} check{'s' if r.passed != 1 else ''}" if r.status == "done" else ""
        out.line((f" {mark} ", style), (f"step {r.step.number}  ", "bold" if r is current else ""),
                 (f"{r.step.title:<44}", ""), (f"{r.status:<8}", style), (f" {count}" if count else "", "dim"),
                 ("   <- you are here" if r is current else "", "bold yellow"))
    out.line("")
    done = sum(r.status == "done" for r in results)
    if current is None:
        out.line((f"All {len(results)} steps done.", "bold green"))
        matrix = next((r.properties.get("kill_matrix") for r in results if r.properties.get("kill_matrix")), None)
        if matrix:
            try:
                rows = json.loads(matrix)
                caught = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome == "fail"]
                missed = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome != "fail"]
                out.line(f"Your own tests caught {len(caught)} of {len(caught) + len(missed)} planted mistakes"
                         + (f"; they miss: {', '.join(missed)}." if missed else "."))
            except ValueError:
                pass
        return
    step = current.step
    out.line((f"Step {step.number}: {step.title}", "bold"), f"   ({done} of {len(results)} steps done)")
    out.line(("Goal: ", "bold"), step.goal)
    if step.fills:
        out.line(("Fills: ", "bold"), step.fills)
    out.line(("First failing check: ", "bold"), current.check or "(none ran)")
    for text in current.failure.splitlines() or ["(no message)"]:
        out.line(("  ", ""), (text, "red"))
    out.line("")
    hint_cmd = "python progress.py hint" if prog.endswith("progress.py") else "kvkit hint"
    stuck = (f" Stuck? `{hint_cmd}` ({len(step.hints)} hint{'s' if len(step.hints) != 1 else ''} for this step, "
             f"one at a time)." if step.hints else "")
    out.line(f"Fix it and save; `{prog} --watch` reruns on every save.{stuck}")


# --------------------------------------------------------------------------- commands

def _mtimes(folder: Path) -> dict:
    """Modification times of the files a learner edits: every .py and .toml under ``folder`` (and $KVKIT_IMPL)."""
    roots = [folder] + ([Path(os.environ[IMPL_ENV])] if os.environ.get(IMPL_ENV) else [])
    seen = {}
    for root in roots:
        for pattern in ("*.py", "*.toml"):
            for path in root.rglob(pattern):
                if "__pycache__" in path.parts or any(p.startswith(".") for p in path.relative_to(root).parts):
                    continue
                try:
                    seen[str(path)] = path.stat().st_mtime_ns
                except OSError:
                    pass
    return seen


def progress_main(argv: list[str] | None = None, console=None, prog: str = "kvkit progress") -> int:
    """``kvkit progress [--dir DIR] [--watch]``: exit 0 when every step passes, 1 when not, 2 on a usage error."""
    parser = argparse.ArgumentParser(prog=prog, description="Show every step of the exercises as done or pending.")
    parser.add_argument("--dir", help="the exercises directory (default: ./exercises, or . when it holds steps.toml)")
    parser.add_argument("--watch", action="store_true", help="rerun whenever a file is saved (Ctrl-C to stop)")
    parser.add_argument("--jobs", type=int, default=None, help="steps run side by side (default: one per CPU)")
    parser.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--max-runs", type=int, default=None, help=argparse.SUPPRESS)  # for tests of --watch
    args = parser.parse_args(argv)
    out = Out(console)
    try:
        folder = find_exercises(args.dir)
        steps = load_steps(folder)
    except UsageError as exc:
        out.line((f"{prog}: {exc}", "red"))
        return 2
    runs = 0
    code = 1
    try:
        while True:
            before = _mtimes(folder)
            results = run_all(steps, folder, args.jobs)
            runs += 1
            if args.watch:
                out.clear()
            render(results, folder, out, prog)
            code = 0 if all(r.status == "done" for r in results) else 1
            if not args.watch or (args.max_runs is not None and runs >= args.max_runs):
                return code
            out.line(("watching for changes (Ctrl-C to stop)...", "dim"))
            while _mtimes(folder) == before:
                time.sleep(args.interval)
            time.sleep(min(args.interval, 0.2))  # let the editor finish writing
    except KeyboardInterrupt:
        return code


def _load_state(folder: Path) -> dict:
    try:
        return json.loads((folder / HINTS_STATE).read_text())
    except (OSError, ValueError):
        return {}


def hint_main(argv: list[str] | None = None, console=None, prog: str = "kvkit hint") -> int:
    """``kvkit hint [--dir DIR] [--step N] [--reset]``: the next hint for the current step (exit 0; 2 on a usage error)."""
    parser = argparse.ArgumentParser(prog=prog, description="Show the next hint for the current step, one at a time.")
    parser.add_argument("--dir", help="the exercises directory (default: ./exercises, or . when it holds steps.toml)")
    parser.add_argument("--step", type=int, help="hints for this step instead of the current one")
    parser.add_argument("--reset", action="store_true", help="start every step's hints from the first again")
    args = parser.parse_args(argv)
    out = Out(console)
    try:
        folder = find_exercises(args.dir)
        steps = load_steps(folder)
    except UsageError as exc:
        out.line((f"{prog}: {exc}", "red"))
        return 2
    state_path = folder / HINTS_STATE
    if args.reset:
        state_path.unlink(missing_ok=True)
        out.line("Hints start from the first again.")
        return 0
    if args.step is not None:
        step = next((s for s in steps if s.number == args.step), None)
        if step is None:
            out.line((f"{prog}: there is no step {args.step} (steps: {', '.join(str(s.number) for s in steps)})", "red"))
            return 2
    else:
        pending = run_until_pending(steps, folder)
        if pending is None:
            out.line(("Every step is done: no hint needed.", "green"))
            return 0
        step = pending.step
    if not step.hints:
        out.line(f"Step {step.number}: {step.title}. There are no hints for it here (this copy of the "
                 f"exercises came without them); its goal: {step.goal}")
        return 0
    state = _load_state(folder)
    shown = int(state.get(str(step.number), 0))
    out.line((f"Step {step.number}: {step.title}", "bold"))
    out.line(("Goal: ", "bold"), step.goal)
    if shown >= len(step.hints):
        out.line(f"That was the last hint for step {step.number}; here they all are again:")
        for i, text in enumerate(step.hints, start=1):
            out.line((f"  {i}. ", "bold"), text)
        return 0
    out.line((f"Hint {shown + 1} of {len(step.hints)}: ", "bold yellow"), step.hints[shown])
    state[str(step.number)] = shown + 1
    try:
        state_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass
    if shown + 1 < len(step.hints):
        out.line(("Run it again for the next one.", "dim"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python progress.py [--watch] [--dir DIR]`` or ``python progress.py hint [...]`` (the standalone copy)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hint"]:
        return hint_main(argv[1:], prog="python progress.py hint")
    if argv[:1] == ["progress"]:
        argv = argv[1:]
    return progress_main(argv, prog="python progress.py")


if __name__ == "__main__":
    sys.exit(main())
