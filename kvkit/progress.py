"""The learner's progress view, in the spirit of rustlings: ``kvkit progress`` and ``kvkit hint``.

Reads the step list from ``steps.toml`` in the exercises directory (step order,
goals, test files, hints: data, not code), runs each step's tests with pytest
in its own process, and shows every step as done or pending, the current
step's goal in one sentence and its first failing check in plain words.

    kvkit progress [--dir DIR] [--watch]     every step, done or pending; exit 0 only when all pass
    kvkit hint [--dir DIR] [--step N]        the next hint for the current step, one at a time

It says which step is running before it runs it. One check that does not
return within ``--timeout`` seconds (10; ``$KVKIT_CHECK_TIMEOUT``) fails its
step with the function it called and the line it was stuck on (the step
tests' stepkit.watch interrupts it; see ``run_step`` for the backstops), and
the steps after a stuck one are stopped: the learner fixes that loop first.

This file is self-contained (the standard library, plus rich when it is
installed), so the starter bundle ships a copy of it as ``progress.py``:

    python progress.py [--watch]            python progress.py hint
"""
from __future__ import annotations

import argparse
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

STEPS_FILE = "steps.toml"
HINTS_STATE = ".kvkit-hints.json"
IMPL_ENV = "KVKIT_IMPL"
STEP_TIMEOUT_S = 600            # a whole step's pytest run, the last resort (step 7 runs many)
CHECK_TIMEOUT_ENV = "KVKIT_CHECK_TIMEOUT"  # read by the step tests (stepkit.py) too
CHECK_DUMP_ENV = "KVKIT_CHECK_DUMP"        # where the step tests' backstop writes the stuck stacks
CHECK_TIMEOUT_S = 10.0          # one check: one configuration's calls into the learner's code


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
    stuck: bool = False    # a check ran past the timeout (or the whole run past its limit)
    stopped: bool = False  # not run, or ended early: an earlier step got stuck, or Ctrl-C


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


def check_timeout(given: float | None = None) -> float:
    """Seconds one check may run: ``given``, else ``$KVKIT_CHECK_TIMEOUT``, else 10 (0: no limit)."""
    if given is not None:
        return given
    try:
        return float(os.environ.get(CHECK_TIMEOUT_ENV, "") or CHECK_TIMEOUT_S)
    except ValueError:
        return CHECK_TIMEOUT_S


def _stop_group(proc: subprocess.Popen) -> None:
    """Kill the step's pytest and whatever it started (step 7 runs pytest again), running or left behind."""
    if os.name == "posix":
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is its pid
        except (ProcessLookupError, PermissionError):
            pass
    elif proc.poll() is None:
        proc.kill()


def _run_pytest(cmd: list, folder: Path, env: dict, limit: float, stop) -> tuple[str, str, str, int]:
    """Run ``cmd``: ``(why, stdout, stderr, exit code)``; ``why`` is '' when it ended on its own,
    "limit" past ``limit`` seconds, or the reason ``stop()`` gave for ending it early."""
    extra = {"start_new_session": True} if os.name == "posix" else {}
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **extra)
    deadline = time.monotonic() + limit
    why, stdout, stderr = "", "", ""
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                why = (stop() if stop is not None else "") or ("limit" if time.monotonic() > deadline else "")
                if why:
                    break
    finally:
        _stop_group(proc)  # also on Ctrl-C here, and after a run whose grandchildren outlived it
    if why:
        stdout, stderr = proc.communicate()
    return why, stdout, stderr, proc.returncode


_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>.+)$')


def _learner_file(path: Path, learner: Path, tests: Path) -> bool:
    if not path.is_absolute():  # "<frozen runpy>", "<string>": no file, and not the learner's
        return False
    try:
        path = path.resolve()
        return (path.is_relative_to(learner) and not path.is_relative_to(tests)
                and not any(p.startswith(".") or p == "site-packages" for p in path.relative_to(learner).parts))
    except (OSError, ValueError):
        return False


def _from_dump(text: str, number: int, learner: Path, tests: Path) -> str:
    """The plain-words failure from the step tests' backstop dump ('' when it holds no stack).

    The dump is a header (``step:``, ``seconds:``, ``check:``) and faulthandler's
    stack of every thread, innermost frame first.
    """
    if "most recent call first" not in text:
        return ""
    header = {}
    blocks: list[list] = []
    for line in text.splitlines():
        if "most recent call first" in line:
            blocks.append([])
        elif not blocks:
            key, sep, value = line.partition(": ")
            if sep:
                header[key] = value
        elif (m := _DUMP_FRAME.match(line)) and _learner_file(Path(m["file"]), learner, tests):
            blocks[-1].append((m["name"], Path(m["file"]), int(m["line"])))
    frames = next((b for b in blocks if b), [])
    seconds = header.get("seconds", "?")
    check = f" on {header['check']}" if header.get("check") else ""
    note = ("It did not stop when interrupted (stuck inside one NumPy or PyTorch call, or an `except` that "
            "swallowed the interruption), so its tests were ended.")
    if not frames:
        return f"step {number}: a check did not finish within {seconds} s{check}; an endless loop? {note}"
    (name, path, lineno), called = frames[0], frames[-1][0]
    source = linecache.getline(str(path), lineno).strip()
    where = f"{path.name} line {lineno}" + (f", in {name}" if name != called else "") + (f": `{source}`" if source else "")
    return f"step {number}: {called} did not return within {seconds} s{check} ({where}); an endless loop? {note}"


def run_step(step: Step, folder: Path, timeout: float = STEP_TIMEOUT_S, impl: Path | None = None,
             check_seconds: float | None = None, stop=None) -> Result:
    """Run one step's tests with pytest in a fresh process and read back the first failure.

    The tests check the code in ``impl`` when given, else in ``$KVKIT_IMPL``
    when set, else in ``folder``. One check may run ``check_seconds``
    (``check_timeout()`` when None). ``stop``, if given, is called while the
    tests run: a non-empty reason it returns ends them (the step is then
    "pending", ``stopped``).

    A stuck check ends in one of three ways, each with the function and line:
    the step tests interrupt it (SIGALRM, stepkit.watch; an ordinary failure
    in the report, with the property ``check_timeout``); their faulthandler
    backstop writes its stack to a file here and ends pytest; or, last, the
    whole run passes ``timeout`` seconds and this process group is killed.
    """
    start = time.monotonic()
    learner = Path(impl or os.environ.get(IMPL_ENV) or folder).resolve()
    with tempfile.TemporaryDirectory(prefix="kvkit-progress-") as tmp:
        report = Path(tmp) / "report.xml"
        dump = Path(tmp) / "stuck.txt"
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--tb=short",
               f"--junitxml={report}", "-o", "junit_family=xunit1", *step.tests]
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        if "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in env:
            # The step tests need no plugin; skipping them halves pytest's start. Step 7 runs the learner's
            # own tests with Hypothesis's plugin alone, as the grader does.
            env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
            env.pop("PYTEST_ADDOPTS", None)  # options for plugins that are now off (say, -n of xdist)
        if impl is not None:
            env[IMPL_ENV] = str(impl)
        env[CHECK_TIMEOUT_ENV] = f"{check_timeout(check_seconds):g}"
        env[CHECK_DUMP_ENV] = str(dump)
        why, stdout, stderr, returncode = _run_pytest(cmd, folder, env, timeout, stop)
        seconds = time.monotonic() - start
        try:
            stuck = _from_dump(dump.read_text(encoding="utf-8", errors="replace"), step.number, learner,
                               folder.resolve() / "tests")
        except OSError:
            stuck = ""
        if why and why != "limit":
            return Result(step, "pending", check="(stopped)", seconds=seconds, stopped=True,
                          failure=f"step {step.number}: stopped before it finished: {why}.")
        if stuck:
            return Result(step, "pending", check="(timeout)", failure=stuck, seconds=seconds, stuck=True)
        if why == "limit":
            return Result(step, "pending", check="(timeout)", seconds=seconds, stuck=True,
                          failure=f"step {step.number}: its tests were still running after {timeout:.0f} s: "
                                  f"is there an endless loop?")
        if report.is_file():
            passed, failed, check, message, props = _first_failure(report)
        else:
            passed, failed, check, message, props = 0, 0, "", "", {}
    if returncode == 0 and failed == 0 and passed > 0:
        return Result(step, "done", passed=passed, seconds=seconds, properties=props)
    if not message:
        tail = [line for line in (stdout + stderr).splitlines() if line.strip()][-6:]
        message = (f"step {step.number}: pytest could not run its tests (exit code {returncode}):\n"
                   + "\n".join(tail))
    return Result(step, "pending", passed=passed, failed=failed, check=check, failure=message,
                  seconds=seconds, properties=props, stuck="check_timeout" in props)


def _announce(out, step: Step) -> None:
    if out is not None:
        out.line((f"running step {step.number}: {step.title} ...", "dim"))


def run_all(steps: list[Step], folder: Path, jobs: int | None = None, impl: Path | None = None,
            out=None, check_seconds: float | None = None) -> list[Result]:
    """Every step's result, in step order; steps run side by side in ``jobs`` processes.

    Each step is announced on ``out`` (when given) as it starts. Once a step
    gets stuck (a check ran past the timeout), the steps after it are stopped
    or not started: they would likely hang on the same loop, and the current
    step is the stuck one (or one before it) either way.
    """
    jobs = jobs or max(1, min(len(steps), os.cpu_count() or 1))
    lock = threading.Lock()
    first_stuck: list[int] = []
    interrupted = threading.Event()

    def reason(index: int) -> str:
        if interrupted.is_set():
            return "interrupted"
        with lock:
            before = [i for i in first_stuck if i < index]
        return f"step {steps[min(before)].number} got stuck first" if before else ""

    def one(index: int) -> Result:
        step = steps[index]
        why = reason(index)
        if why:
            return Result(step, "pending", check="(not run)", stopped=True,
                          failure=f"step {step.number}: not run: {why}.")
        _announce(out, step)
        result = run_step(step, folder, impl=impl, check_seconds=check_seconds, stop=lambda: reason(index))
        if result.stuck:
            with lock:
                first_stuck.append(index)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, i) for i in range(len(steps))]
        try:
            return [f.result() for f in futures]
        except BaseException:  # Ctrl-C: every running step ends its process group at its next poll
            interrupted.set()
            raise


def run_until_pending(steps: list[Step], folder: Path, out=None, check_seconds: float | None = None) -> Result | None:
    """Run the steps in order and stop at the first that is not done; None when all are."""
    for step in steps:
        _announce(out, step)
        result = run_step(step, folder, check_seconds=check_seconds)
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
    stopped = [r for r in results if r.stopped and r is not current]
    stuck = next((r for r in results if r.stuck), None)
    if stopped and stuck is not None:
        numbers = ", ".join(str(r.step.number) for r in stopped)
        out.line((f"   (step{'s' if len(stopped) > 1 else ''} {numbers} stopped early: step {stuck.step.number} got stuck "
                  f"first; they run again once it returns)", "dim"))
    out.line("")
    done = sum(r.status == "done" for r in results)
    if current is None:
        out.line((f"All {len(results)} steps done.", "bold green"))
    # Step 7's kill matrix, read back from its report, as soon as step 7 has run (the steps before it may not
    # be done: the port of step 6 is optional for a take-home).
    matrix = next((r.properties.get("kill_matrix") for r in results if r.properties.get("kill_matrix")), None)
    if matrix:
        try:
            rows = json.loads(matrix)
            caught = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome == "fail"]
            missed = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome != "fail"]
            out.line(f"Your own tests caught {len(caught)} of {len(caught) + len(missed)} planted mistakes"
                     + (f"; they miss: {', '.join(missed)}." if missed else "."))
        except (ValueError, AttributeError):
            pass
    if current is None:
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
    hint_cmd = "python progress.py hint" if "progress.py" in prog else "kvkit hint"
    if " --dir " in prog:
        hint_cmd += " --dir " + prog.split(" --dir ", 1)[1]
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
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help=f"how long one check may run before its step fails as stuck "
                             f"(default: ${CHECK_TIMEOUT_ENV}, else {CHECK_TIMEOUT_S:g}; 0: no limit)")
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
            results = run_all(steps, folder, args.jobs, out=out, check_seconds=args.timeout)
            runs += 1
            if args.watch:
                out.clear()
            # The commands it suggests name the folder when it was given (else they would run the default one).
            render(results, folder, out, f"{prog} --dir {args.dir}" if args.dir else prog)
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
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help=f"how long one check may run (default: ${CHECK_TIMEOUT_ENV}, else {CHECK_TIMEOUT_S:g})")
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
        pending = run_until_pending(steps, folder, out, check_seconds=args.timeout)
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
