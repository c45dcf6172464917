"""The learner's progress view, in the spirit of rustlings: ``kvkit progress`` and ``kvkit hint``.

Reads the step list from ``steps.toml`` in the exercises directory (step order,
goals, test files, what each step builds on, hints: data, not code), runs each
step's tests with pytest in its own process, and shows every step as done or
pending, the current step's goal in one sentence and its first failing check
in plain words.

    kvkit progress [--dir DIR] [--watch]     every step, done or pending; exit 0 only when all pass
    kvkit hint [--dir DIR] [--step N]        the next hint for the current step, one at a time

It answers at the speed of a save. The current step (the one the last run
stopped at, remembered in ``.kvkit-hints.json``) runs first, alone, and while
it passes so does each next step; the first failure is printed as soon as it
is known. Then the steps before it are checked again, and a step after it
runs only when every step it builds on (``needs`` in steps.toml) passes. One check that does not return within
``--timeout`` seconds (10; ``$KVKIT_CHECK_TIMEOUT``) fails its step with the
function it called and the line it was stuck on (the step tests'
stepkit.watch interrupts it; see ``run_step`` for the backstops), and stops
only the steps that build on it. ``--watch`` starts again when a file is
saved, even mid-run. Ctrl-C ends either command with one line and exit code 130.

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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

STEPS_FILE = "steps.toml"
HINTS_STATE = ".kvkit-hints.json"     # the hints shown per step, and the step the last run stopped at
CURRENT_KEY = "current_step"          # that step's key in it (the hints' keys are step numbers)
IMPL_ENV = "KVKIT_IMPL"
STEP_TIMEOUT_S = 600            # a whole step's pytest run, the last resort (step 7 runs many)
CHECK_TIMEOUT_ENV = "KVKIT_CHECK_TIMEOUT"  # read by the step tests (stepkit.py) too
CHECK_DUMP_ENV = "KVKIT_CHECK_DUMP"        # where the step tests' backstop writes the stuck stacks
CHECK_TIMEOUT_S = 10.0          # one check: one configuration's calls into the learner's code
INTERRUPTED = 130               # exit code after Ctrl-C, as a shell gives


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
    needs: list[int] = field(default_factory=list)          # the steps it builds on (directly)
    missed: dict[str, str] = field(default_factory=dict)    # step 7: how a test catches each planted mistake


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
    stopped: bool = False  # not run, or ended early: a step it builds on is not done, a save, or Ctrl-C
    waits_for: int | None = None  # stopped because this step (one it builds on) is not done


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
                        tests=list(raw["tests"]), fills=raw.get("fills", ""), hints=list(raw.get("hints", [])),
                        needs=[int(n) for n in raw.get("needs", [])], missed=dict(raw.get("missed", {})))
        except KeyError as exc:
            raise UsageError(f"{path}: step {i} has no {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path}: step {i}: {exc}") from exc
        for test in step.tests:
            if not (folder / test).is_file():
                raise UsageError(f"{path}: step {step.number} names {test}, which is not in {folder}")
        earlier = {s.number for s in steps}
        if not set(step.needs) <= earlier:
            raise UsageError(f"{path}: step {step.number} needs step(s) "
                             f"{', '.join(map(str, sorted(set(step.needs) - earlier)))}, which do not come before it")
        steps.append(step)
    if not steps:
        raise UsageError(f"{path} lists no [[step]]")
    return steps


def all_needs(steps: list[Step]) -> dict[int, set[int]]:
    """``{step number: every step of ``steps`` it builds on}``: its ``needs``, theirs, and so on (a step
    left out of ``steps`` counts as passed)."""
    found: dict[int, set[int]] = {}
    for step in steps:  # a step needs only steps before it (load_steps checks), so one pass is enough
        found[step.number] = {n for n in step.needs if n in found}.union(*(found.get(n, set()) for n in step.needs))
    return found


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


def _waiting(step: Step, blocker: Result, started: bool) -> Result:
    """The result of a step not run (or ended early) because ``blocker``, a step it builds on, is not done."""
    n = blocker.step.number
    why = f"step {n} got stuck first" if blocker.stuck else f"it builds on step {n}, which is not done yet"
    return Result(step, "pending", check="(stopped)" if started else "(not run)", stopped=True, waits_for=n,
                  failure=f"step {step.number}: {'stopped before it finished' if started else 'not run'}: {why}.")


def run_all(steps: list[Step], folder: Path, jobs: int | None = None, impl: Path | None = None,
            out=None, check_seconds: float | None = None, first: int | None = None, stop=None,
            on_current=None) -> list[Result]:
    """Every step's result, in step order: the current step first, alone, then the rest side by side.

    ``first`` is the step to run first (the one the last run stopped at; the
    first step when None or unknown). It runs alone, and while it passes so
    does each next step in order, so the first failure comes as soon as one
    step's tests can give it. Then the steps before ``first`` run again (they
    passed last time; a change may have broken one) and the steps left after
    the failure, up to ``jobs`` at a time, in step order. A step starts once every step
    it builds on (its ``needs``, and theirs) has passed in this run; one of
    them that fails or gets stuck keeps it from starting (or stops it): a
    failing or stuck step holds back only the steps that build on it. The
    steps before ``first`` count as passed until their new result says
    otherwise.

    Each step is announced on ``out`` (when given) as it starts.
    ``on_current(result)``, when given, is called once, as soon as the
    current step's failure is known: the first step in order that is not
    done, every step before it done (or, before ``first``, not yet checked
    again). ``stop()``, when given, is polled while steps run: a non-empty
    reason it returns ends every step (they are then ``stopped``). Ctrl-C
    (KeyboardInterrupt) ends every running step's processes and is raised again.
    """
    jobs = jobs or max(1, min(len(steps), os.cpu_count() or 1))
    needs = all_needs(steps)
    index = {s.number: i for i, s in enumerate(steps)}
    head = index.get(first, 0) if first is not None else 0
    trusted = {s.number for s in steps[:head]}  # passed at the last run; checked again after the first step
    results: dict[int, Result] = {}
    lock = threading.Lock()
    interrupted = threading.Event()
    shown: list[int] = []

    def blocker(step: Step) -> Result | None:
        with lock:
            return next((results[n] for n in sorted(needs[step.number], key=index.get)
                         if n in results and results[n].status != "done"), None)

    def halted() -> str:
        if interrupted.is_set():
            return "interrupted"
        return (stop() if stop is not None else "") or ""

    def current_known() -> Result | None:
        """The current step's result once it is known (call under the lock); None until then."""
        for s in steps:
            r = results.get(s.number)
            if r is None:
                if s.number in trusted:
                    continue  # not checked again yet: counts as done
                return None
            if r.status != "done":
                return None if r.stopped and r.waits_for is None else r  # a save or Ctrl-C ended it
        return None

    def record(result: Result) -> None:
        with lock:
            results[result.step.number] = result
            show = None if shown or on_current is None else current_known()
            if show is not None:
                shown.append(show.step.number)
        if show is not None:
            on_current(show)

    def run_one(step: Step) -> None:
        _announce(out, step)

        def reason() -> str:
            found = blocker(step)
            return halted() or (f"step {found.step.number} is not done" if found is not None else "")

        result = run_step(step, folder, impl=impl, check_seconds=check_seconds, stop=reason)
        if result.stopped and (found := blocker(step)) is not None and not halted():
            result = _waiting(step, found, started=True)
        record(result)

    def ready(step: Step) -> bool:
        """Every step it builds on passed in this run (or, before ``first``, is still being checked again)."""
        with lock:
            return all(n in results or n in trusted for n in needs[step.number])

    try:
        # The current step, and while each passes the next: alone, so the next failure comes as soon as one
        # step's tests can give it.
        for step in steps[head:]:
            run_one(step)
            if results[step.number].status != "done" or halted():
                break
        waiting_list = [s for s in steps if s.number not in results]
        running: dict = {}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            try:
                while waiting_list or running:
                    for step in list(waiting_list):
                        why = halted()
                        found = None if why else blocker(step)
                        if why or found is not None:
                            waiting_list.remove(step)
                            record(_waiting(step, found, started=False) if found is not None else
                                   Result(step, "pending", check="(not run)", stopped=True,
                                          failure=f"step {step.number}: not run: {why}."))
                        elif len(running) < jobs and ready(step):
                            waiting_list.remove(step)
                            running[pool.submit(run_one, step)] = step
                    if not running:
                        if waiting_list and not halted():  # cannot happen: the first step left is always ready
                            raise RuntimeError(f"steps {[w.number for w in waiting_list]} wait on nothing")
                        continue
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        del running[future]
                        future.result()
            except BaseException:  # Ctrl-C: every running step ends its process group at its next poll
                interrupted.set()
                raise
    except BaseException:
        interrupted.set()
        raise
    # A step that ran while a step before ``first`` it builds on was being checked again, and failed before
    # that one did: its failure is most likely that one's, so it waits for it like the steps that never started.
    for s in steps:
        r = results[s.number]
        if r.status != "done" and r.waits_for is None and not r.stopped and (found := blocker(s)) is not None:
            results[s.number] = _waiting(s, found, started=True)
    return [results[s.number] for s in steps]


def run_until_pending(steps: list[Step], folder: Path, out=None, check_seconds: float | None = None,
                      first: int | None = None) -> Result | None:
    """Run the steps in order from ``first`` (the first step when None) and stop at the first that is not done.

    The steps before ``first`` count as done (they passed at the last run).
    Returns None when every step from ``first`` on is done.
    """
    start = next((i for i, s in enumerate(steps) if s.number == first), 0)
    for step in steps[start:]:
        _announce(out, step)
        result = run_step(step, folder, check_seconds=check_seconds)
        if result.status != "done":
            return result
    return None


# --------------------------------------------------------------------------- output

class Out:
    """Prints with rich when it is installed (colour, wrapping), plain text otherwise; one line at a time
    from any thread, each flushed at once (a learner waits on the first)."""

    def __init__(self, console=None):
        self.console = console
        self._lock = threading.Lock()
        if console is None:
            try:
                from rich.console import Console
                self.console = Console(soft_wrap=not sys.stdout.isatty(), highlight=False)
            except ImportError:
                self.console = None

    def line(self, *parts) -> None:
        """Print one line made of ``(text, style)`` parts or plain strings (text is never read as markup)."""
        parts = [p if isinstance(p, tuple) else (p, "") for p in parts]
        with self._lock:
            if self.console is None:
                print("".join(text for text, _ in parts), flush=True)
                return
            from rich.text import Text
            line = Text()
            for text, style in parts:
                line.append(text, style=style or None)
            self.console.print(line)

    def last(self, text: str) -> None:
        """Print ``text`` as the last line, after Ctrl-C: straight to the output file, past rich's buffer
        (the interruption may have landed inside a print, between rich's write and the emptying of its buffer)."""
        stream = self.console.file if self.console is not None else sys.stdout
        stream.write(text + "\n")
        stream.flush()

    def clear(self) -> None:
        """Clear the terminal (nothing when the output is not one)."""
        if self.console is not None and self.console.is_terminal:
            self.console.clear()


def render_current(result: Result, out: Out) -> None:
    """The current step's goal and first failing check, in plain words (printed as soon as it is known)."""
    step = result.step
    out.line(("✘ ", "red"), (f"Step {step.number}: {step.title}", "bold"))
    out.line(("Goal: ", "bold"), step.goal)
    if step.fills:
        out.line(("Fills: ", "bold"), step.fills)
    out.line(("First failing check: ", "bold"), result.check or "(none ran)")
    for text in result.failure.splitlines() or ["(no message)"]:
        out.line(("  ", ""), (text, "red"))
    out.line("")


def _numbers(results: list[Result]) -> str:
    return f"step{'s' if len(results) > 1 else ''} {', '.join(str(r.step.number) for r in results)}"


def render(results: list[Result], folder: Path, out: Out, prog: str, shown: int | None = None) -> None:
    """Every step as done or pending, then the current step's goal and first failure.

    ``shown`` is the step whose failure was printed already, as soon as it was
    known (``render_current``): when it is still the current step, its
    failure is not printed again.
    """
    impl = os.environ.get(IMPL_ENV)
    out.line(("GQA over a preallocated KV cache: your progress", "bold"), f"  ({folder})")
    if impl:
        out.line(f"checking the code in {impl} (${IMPL_ENV})")
    out.line("")
    current = next((r for r in results if r.status != "done"), None)
    by_number = {r.step.number: r for r in results}
    for r in results:
        mark, style = ("✔", "green") if r.status == "done" else ("✘" if r is current else "·", "red" if r is current else "dim")
        count = f"{r.passed} check{'s' if r.passed != 1 else ''}" if r.status == "done" else ""
        note = f"waits for step {r.waits_for}" if r.waits_for is not None and r is not current else ""
        out.line((f" {mark} ", style), (f"step {r.step.number}  ", "bold" if r is current else ""),
                 (f"{r.step.title:<44}", ""), (f"{r.status:<8}", style), (f" {count}" if count else "", "dim"),
                 (f" {note}" if note else "", "dim"), ("   <- you are here" if r is current else "", "bold yellow"))
    waiting: dict[int, list[Result]] = {}
    for r in results:
        if r.waits_for is not None and r is not current:
            waiting.setdefault(r.waits_for, []).append(r)
    for number, held in waiting.items():
        blocker = by_number.get(number)
        if blocker is not None and blocker.stuck:
            out.line((f"   ({_numbers(held)} stopped early: step {number} got stuck first; they run again once it "
                      f"returns)", "dim"))
        else:
            out.line((f"   ({_numbers(held)} build{'s' if len(held) == 1 else ''} on step {number}: "
                      f"{'they run' if len(held) > 1 else 'it runs'} once it passes)", "dim"))
    out.line("")
    done = sum(r.status == "done" for r in results)
    if current is None:
        out.line((f"All {len(results)} steps done.", "bold green"))
    # Step 7's kill matrix, read back from its report, as soon as step 7 has run (the steps before it may not
    # be done: the port of step 6 is optional for a take-home).
    for r in results:
        matrix = r.properties.get("kill_matrix")
        if matrix:
            render_kill_matrix(matrix, r.step, out)
            break
    if current is None:
        return
    step = current.step
    out.line((f"Step {step.number}: {step.title}", "bold"), f"   ({done} of {len(results)} steps done)"
             + (": its first failing check is above." if shown == step.number else ""))
    if shown != step.number:
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


def render_kill_matrix(matrix: str, step: Step, out: Out) -> None:
    """Step 7's kill matrix in one line, and for each planted mistake the tests missed, how a test could catch it.

    ``matrix`` is the JSON step 7 records (``{variant: "pass" | "fail" | ...}``);
    the ways to catch each mistake are the step's ``missed`` table in steps.toml.
    """
    try:
        rows = json.loads(matrix)
        caught = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome == "fail"]
        missed = [name for name, outcome in rows.items() if name != "your kv_cache.py" and outcome != "fail"]
    except (ValueError, AttributeError):
        return
    out.line(f"Your own tests caught {len(caught)} of {len(caught) + len(missed)} planted mistakes"
             + (f"; they miss: {', '.join(missed)}." if missed else "."))
    for name in missed:
        if step.missed.get(name):
            out.line(("  ", ""), (f"{name}: ", "bold"), step.missed[name])


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
    """``kvkit progress [--dir DIR] [--watch]``: exit 0 when every step passes, 1 when not, 2 on a usage error,
    130 after Ctrl-C (one line, in --watch too)."""
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
    prog_shown = f"{prog} --dir {args.dir}" if args.dir else prog  # the commands it suggests act on that folder
    runs = 0
    try:
        while True:
            before = _mtimes(folder)
            saved = threading.Event()
            finished = threading.Event()
            if args.watch:
                def watch_saves() -> None:
                    while not finished.wait(args.interval):
                        if _mtimes(folder) != before:
                            saved.set()
                            return
                threading.Thread(target=watch_saves, daemon=True).start()
            shown: list[int] = []

            def show(result: Result) -> None:
                shown.append(result.step.number)
                render_current(result, out)

            try:
                results = run_all(steps, folder, args.jobs, out=out, check_seconds=args.timeout,
                                  first=_remembered(folder), stop=lambda: "a file was saved" if saved.is_set() else "",
                                  on_current=show)
            finally:
                finished.set()
            if saved.is_set():  # a save mid-run: start again at once, on the new code
                time.sleep(min(args.interval, 0.2))  # let the editor finish writing
                out.clear()
                out.line(("a file was saved: running again ...", "dim"))
                continue
            runs += 1
            current = next((r for r in results if r.status != "done"), None)
            _remember(folder, current.step.number if current is not None else None)
            render(results, folder, out, prog_shown, shown=shown[0] if shown else None)
            code = 0 if current is None else 1
            if not args.watch or (args.max_runs is not None and runs >= args.max_runs):
                return code
            out.line(("watching for changes (Ctrl-C to stop)...", "dim"))
            while _mtimes(folder) == before:
                time.sleep(args.interval)
            time.sleep(min(args.interval, 0.2))  # let the editor finish writing
            out.clear()
    except KeyboardInterrupt:
        out.last(f"{prog}: stopped (Ctrl-C).")
        return INTERRUPTED


def _load_state(folder: Path) -> dict:
    try:
        state = json.loads((folder / HINTS_STATE).read_text())
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_state(folder: Path, state: dict) -> None:
    """Write the state file whole (a file renamed into place: a hint and a --watch may write it at once)."""
    path = folder / HINTS_STATE
    try:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _remembered(folder: Path) -> int | None:
    """The step the last run in ``folder`` stopped at (None: none remembered, or it checked other code)."""
    state = _load_state(folder)
    if state.get("impl", "") != os.environ.get(IMPL_ENV, ""):
        return None
    value = state.get(CURRENT_KEY)
    return value if isinstance(value, int) else None


def _remember(folder: Path, number: int | None) -> None:
    """Remember the current step (None: every step done), so that the next run starts with it."""
    state = _load_state(folder)
    if state.get(CURRENT_KEY) == number and state.get("impl", "") == os.environ.get(IMPL_ENV, ""):
        return
    state[CURRENT_KEY] = number
    state["impl"] = os.environ.get(IMPL_ENV, "")
    _save_state(folder, state)


def hint_main(argv: list[str] | None = None, console=None, prog: str = "kvkit hint") -> int:
    """``kvkit hint [--dir DIR] [--step N] [--reset]``: the next hint for the current step.

    Exit 0; 2 on a usage error; 130 after Ctrl-C.
    """
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
    if args.reset:
        _save_state(folder, {k: v for k, v in _load_state(folder).items() if not k.isdigit()})
        out.line("Hints start from the first again.")
        return 0
    if args.step is not None:
        step = next((s for s in steps if s.number == args.step), None)
        if step is None:
            out.line((f"{prog}: there is no step {args.step} (steps: {', '.join(str(s.number) for s in steps)})", "red"))
            return 2
    else:
        try:
            pending = run_until_pending(steps, folder, out, check_seconds=args.timeout, first=_remembered(folder))
        except KeyboardInterrupt:
            out.last(f"{prog}: stopped (Ctrl-C).")
            return INTERRUPTED
        _remember(folder, pending.step.number if pending is not None else None)
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
    _save_state(folder, state)
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
