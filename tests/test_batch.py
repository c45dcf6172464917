"""Batch grading of a class: 6 submissions (bundled examples of mixed tiers, and 3 hostile ones)
with --jobs 2; the batch is killed halfway and rerun with --resume, which grades only the rest and
loses nothing. Every report is written atomically, so what the kill leaves behind is either a whole
report or nothing.

And Ctrl-C: a batch interrupted while its sandboxes run stops within 2 s, says in one line how many
reports it wrote and how to resume, and leaves no sandbox process and no temporary folder behind.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_hostile  # noqa: E402 - the hostile acts, built on one honest base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "catalogue", "examples")
HOSTILE = {"segfault_ctypes": "Weak", "exit_at_import": "Weak",
           "output_flood": "Hire"}
# Examples whose verdict the hidden trials decide, so that their probes cost little: what is tested here
# is the stop and the resume, not the probes.
PICKS = ["chunk_local_mask", "hire_basic", "off_by_one_mask"]
CLASS_SIZE = len(PICKS) + len(HOSTILE)
KILL_AFTER = 2  # reports written before the batch is killed


def make_class(directory: str) -> dict:
    """``CLASS_SIZE`` submission folders in ``directory``; returns ``{folder name: expected tier}``."""
    with open(os.path.join(EXAMPLES, "expected.toml"), "rb") as f:
        expected = tomllib.load(f)
    picks = PICKS
    tiers = {}
    for i, name in enumerate(picks):
        folder = f"student{i:02d}_{name}"
        shutil.copytree(os.path.join(EXAMPLES, name), os.path.join(directory, folder))
        tiers[folder] = expected[name]["tier"]
    for j, (case, tier) in enumerate(sorted(HOSTILE.items())):
        folder = f"student{len(picks) + j:02d}_{case}"
        os.makedirs(os.path.join(directory, folder))
        with open(os.path.join(directory, folder, "kv_cache.py"), "w") as f:
            f.write(test_hostile.BASE + test_hostile.ACTS[case])  # the same hostile acts, on the honest base
        tiers[folder] = tier
    return tiers


def reports_in(out: str) -> dict:
    found = {}
    for name in os.listdir(out) if os.path.isdir(out) else []:
        if name.endswith(".json") and not name.startswith("."):
            path = os.path.join(out, name)
            with open(path, "rb") as f:
                found[name[:-5]] = (os.stat(path).st_mtime_ns, f.read())
    return found


def command(class_dir: str, out: str, *extra: str, kept: bool = False) -> list[str]:
    """The batch's command; ``kept``: without --seed, --trials and --audience (a --resume takes the kept
    reports')."""
    given = [] if kept else ["--trials", "20", "--seed", "11", "--audience", "class"]
    return [sys.executable, "-m", "grader", class_dir, "--jobs", "2", "--out", out, "--quiet", "--timeout", "60",
            *given, *extra]


def test_batch_kill_and_resume(tmp_path):
    class_dir, out = str(tmp_path / "class"), str(tmp_path / "out")
    os.makedirs(class_dir)
    tiers = make_class(class_dir)
    assert len(tiers) == CLASS_SIZE

    # First run: killed (the whole process group, workers included) once some reports are in.
    first = subprocess.Popen(command(class_dir, out), cwd=ROOT, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 400
    while len(reports_in(out)) < KILL_AFTER and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = reports_in(out)
    assert KILL_AFTER <= len(before) < CLASS_SIZE, f"{len(before)} reports when killed"
    for name, (_, data) in before.items():
        assert json.loads(data)["schema"] == "kvkit.report/1", name  # whole reports only

    # Second run: --resume grades only the rest, with the kept reports' seed when none is given.
    started = time.monotonic()
    second = subprocess.run(command(class_dir, out, "--resume", kept=True), cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    after = reports_in(out)
    assert sorted(after) == sorted(tiers)
    for name, (mtime, data) in before.items():
        assert after[name] == (mtime, data), f"{name} was graded again"
    assert "seed 11, trials 20, audience class, as the kept reports" in second.stderr, second.stderr
    kept_up = [json.loads(data) for _, data in after.values()]
    assert {(r["seed"], r["audience"]) for r in kept_up} == {(11, "class")}
    assert {r["trials"]["random"] for r in kept_up if "trials" in r} == {20}  # (a crashed one records none)
    graded_now = CLASS_SIZE - len(before)
    print(f"\nresumed {graded_now} submissions in {elapsed:.1f} s with --jobs 2: "
          f"{60 * graded_now / elapsed:.1f} submissions per minute")

    wrong = {}
    for name, (_, data) in after.items():
        report = json.loads(data)
        assert report["submission"] == name
        if report["tier"] != tiers[name]:
            wrong[name] = (report["tier"], tiers[name], report.get("tier_reason"))
    assert not wrong, wrong

    # The class summary: tier counts and each criterion's pass rate, as Markdown and CSV.
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert f"# Batch summary: {CLASS_SIZE} submissions" in summary
    with open(os.path.join(out, "summary.csv")) as f:
        rows = list(csv.DictReader(f))
    from grader.stages.rubric import load

    counts = {r["id"]: int(r["count"]) for r in rows if r["section"] == "tier"}
    want = {t: list(tiers.values()).count(t) for t in ("Strong Hire", "Hire", "Weak")}
    # A class's summary names its tiers in its own words, in the id column too: no hiring word.
    assert counts == {load().label(t, "class"): n for t, n in want.items()}

    for t, n in want.items():  # in the class's words: the resumed half took up the kept reports' audience
        assert f"| {load().label(t, 'class')} | {n} |" in summary
    criteria = [r for r in rows if r["section"] == "criterion"]
    assert len(criteria) >= 10 and all(int(r["total"]) <= CLASS_SIZE for r in criteria)
    hire = {"preallocated_in_place", "no_kv_repeat", "head_mapping", "decode", "full_prefill"}
    assert all(int(r["total"]) == CLASS_SIZE for r in criteria if r["id"] in hire)  # never optional
    with open(os.path.join(out, "grades.csv")) as f:
        assert len(list(csv.DictReader(f))) == CLASS_SIZE


def _processes() -> dict:
    """``{pid: (parent pid, state, process group)}`` from /proc."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                found[int(name)] = (int(fields[1]), fields[0], int(fields[2]))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _below(root: int) -> set:
    table = _processes()
    found, todo = set(), [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _sandboxes_running(grader: int) -> bool:
    """A worker's child that leads a process group of its own: a sandbox (launch.run_session) has started."""
    table = _processes()
    return any(pgid == pid and table.get(ppid, (None,))[0] == grader for pid, (ppid, _, pgid) in table.items())


def _grading_started(tmp: str) -> bool:
    """A worker has laid out its first submission (launch.temp_dir's kvkit-sub-<pid>-...)."""
    return any(name.startswith("kvkit-sub-") for name in os.listdir(tmp))


@pytest.mark.parametrize("target,when", [("group", "sandboxes"), ("grader", "start")],
                         ids=["ctrl-c at the terminal, sandboxes running", "kill -INT, grading starting"])
def test_ctrl_c_stops_within_2_s_and_leaves_nothing_behind(tmp_path, target, when):
    class_dir, out, tmp = tmp_path / "class", str(tmp_path / "out"), str(tmp_path / "tmp")
    os.mkdir(tmp)
    for i in range(4):
        shutil.copytree(os.path.join(EXAMPLES, "strong_hire"), class_dir / f"student{i}")
    env = dict(os.environ, TMPDIR=tmp)  # the grader's temporary folders (launch.temp_dir) land here
    grader = subprocess.Popen(command(str(class_dir), out), cwd=ROOT, env=env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Interrupt once the stage is under way (or the first report is written, or 20 s have passed).
        ready = (lambda: _sandboxes_running(grader.pid)) if when == "sandboxes" else (lambda: _grading_started(tmp))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and grader.poll() is None and not reports_in(out) and not ready():
            time.sleep(0.05)
        assert grader.poll() is None, grader.communicate()
        time.sleep(0.3)
        below = _below(grader.pid)  # the workers, the sandboxes, the processes inside them
        workers = {pid for pid, (ppid, _, _) in _processes().items() if ppid == grader.pid}
        sent = time.monotonic()
        if target == "group":
            os.killpg(grader.pid, signal.SIGINT)  # what Ctrl-C at a terminal does: the whole foreground group
        else:
            os.kill(grader.pid, signal.SIGINT)
        stdout, stderr = grader.communicate(timeout=30)
        elapsed = time.monotonic() - sent
    finally:
        if grader.poll() is None:
            os.killpg(grader.pid, signal.SIGKILL)
            grader.wait()
    print(f"\nCtrl-C ({target}) with {len(below)} processes below the grader: stopped in {elapsed:.2f} s")
    assert elapsed < 2.0, f"took {elapsed:.2f} s to stop"
    assert grader.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr, stdout + stderr
    lines = [line for line in (stdout + stderr).splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1, lines
    written = len(reports_in(out))
    assert re.fullmatch(rf"stopped: {written} report\(s\) written to {re.escape(out)} this run, "
                        rf"{4 - written} left: rerun the same command with --resume to grade the rest", lines[0]), lines
    time.sleep(0.2)  # killed processes are reaped by init
    table = _processes()
    alive = sorted(pid for pid in below if pid in table and table[pid][1] != "Z")
    assert not alive, f"still running after the stop: {alive}"
    assert not [name for name in os.listdir(tmp) if name.startswith("kvkit-")], os.listdir(tmp)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # where the probe data goes by default
    pids = workers | {grader.pid}
    left = [n for n in (os.listdir(shm) if shm else []) if n.startswith("kvkit-") and
            any(n.startswith(f"kvkit-probe-data-{pid}-") for pid in pids)]
    assert not left, left
    groups = []  # the sandboxes' cgroups, kvkit-<pid>-<n> (grader/sandbox/cgroup.py), where the machine has them
    for depth in range(1, 5):
        for pid in pids:
            groups += glob.glob(os.path.join("/sys/fs/cgroup", *["*"] * depth, f"kvkit-{pid}-*"))
    assert not groups, groups


def test_the_stop_waits_for_every_worker_not_the_first(tmp_path):
    """The Ctrl-C stop lists the workers' cgroups only once all of them are gone: a worker still dying could
    finish a mkdir after the listing (the cause of a group left behind in CI). ``multiprocessing.connection.wait``
    alone returns when the first worker is."""
    import multiprocessing

    from grader.sandbox.reaper import wait_for_all

    context = multiprocessing.get_context("fork")
    quick, slow = context.Process(target=time.sleep, args=(0,)), context.Process(target=time.sleep, args=(2,))
    started = time.monotonic()
    quick.start(), slow.start()
    try:
        quick.join(10)  # gone (however loaded the machine); the slow one sleeps on
        assert wait_for_all([quick.sentinel, slow.sentinel], timeout_s=0.1) == [slow.sentinel]
        assert wait_for_all([quick.sentinel, slow.sentinel], timeout_s=30) == []
        assert time.monotonic() - started >= 2  # it waited for the slow one
        # (its sentinel closes as it exits, a moment before it can be reaped: nothing of it runs any more)
    finally:
        for process in (quick, slow):
            process.join(5)


def test_a_session_never_waits_on_a_zygote_that_stopped_reading():
    """The parent's replies to the zygote are written by the session's deadline: a zygote stopped by a task
    of its uid (SIGSTOP) once left the grader blocked in a write for good."""
    from grader.sandbox.launch import _Channel

    read_fd, write_fd = os.pipe()
    channel = _Channel(os.open(os.devnull, os.O_RDONLY), write_fd)
    try:
        started = time.monotonic()
        assert not channel.send({"reply": 1}, b"x" * (4 << 20), deadline=time.monotonic() + 0.5)  # nobody reads
        assert time.monotonic() - started < 5
    finally:
        channel.close()
        os.close(read_fd)
