"""Batch grading of a class: 10 submissions (the bundled examples, mixed tiers, and 5 hostile ones)
with --jobs 2; the batch is killed halfway and rerun with --resume, which grades only the rest and
loses nothing. Every report is written atomically, so what the kill leaves behind is either a whole
report or nothing.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_hostile  # noqa: E402 - the hostile acts, built on one honest base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "catalogue", "examples")
HOSTILE = {"segfault_ctypes": "Weak", "exit_at_import": "Weak",
           "output_flood": "Hire"}
SLOW = {"strong_hire", "torch_port_repeat"}  # torch ports and nine pytest runs: once each
CLASS_SIZE = 10
KILL_AFTER = 4  # reports written before the batch is killed


def make_class(directory: str) -> dict:
    """40 submission folders in ``directory``; returns ``{folder name: expected tier}``."""
    with open(os.path.join(EXAMPLES, "expected.toml"), "rb") as f:
        expected = tomllib.load(f)
    names = sorted(n for n in expected if os.path.isdir(os.path.join(EXAMPLES, n)))
    fast = [n for n in names if n not in SLOW]
    picks = [n for n in names if n in SLOW]
    while len(picks) < CLASS_SIZE - len(HOSTILE):
        picks.append(fast[len(picks) % len(fast)])
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


def command(class_dir: str, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grader", class_dir, "--jobs", "2", "--out", out, "--quiet",
            "--trials", "50", "--timeout", "60", "--seed", "11", *extra]


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

    # Second run: --resume grades only the rest.
    started = time.monotonic()
    second = subprocess.run(command(class_dir, out, "--resume"), cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    elapsed = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    after = reports_in(out)
    assert sorted(after) == sorted(tiers)
    for name, (mtime, data) in before.items():
        assert after[name] == (mtime, data), f"{name} was graded again"
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
    counts = {r["id"]: int(r["count"]) for r in rows if r["section"] == "tier"}
    want = {t: list(tiers.values()).count(t) for t in ("Strong Hire", "Hire", "Weak")}
    assert counts == want
    for t, n in want.items():
        assert f"| {t} | {n} |" in summary
    criteria = [r for r in rows if r["section"] == "criterion"]
    assert len(criteria) >= 10 and all(int(r["total"]) <= CLASS_SIZE for r in criteria)
    hire = {"preallocated_in_place", "no_kv_repeat", "head_mapping", "decode", "full_prefill"}
    assert all(int(r["total"]) == CLASS_SIZE for r in criteria if r["id"] in hire)  # never optional
    with open(os.path.join(out, "grades.csv")) as f:
        assert len(list(csv.DictReader(f))) == CLASS_SIZE
