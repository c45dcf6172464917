"""Hostile submissions: each gets a report that names what happened, no better tier than its
honest work earns (the base, the reference, is Hire: no cost.py, no tests), and the grader goes on.

Each fixture is built at test time from one honest base plus its act (``ACTS``). A batch grades
the fixtures (with a well-behaved submission after them) through the CLI, at the best isolation
this machine allows: every ``make test`` grades the acts that cost little; the acts that spend
the sandbox's limits of CPU time, memory, processes and output, and most malformed answers
(``EXHAUSTING``), are graded by ``make test-slow``. Few random trials keep it fast: these tests are about containment, not
verdict accuracy (the attacks on the evidence are in test_attacks.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WELL_BEHAVED = os.path.join(ROOT, "catalogue", "examples", "hire_basic")
TIERS = ["Weak", "Hire", "Strong Hire"]
SENTINEL = "/tmp/kvkit-hostile-sentinel.txt"
ESCAPES = ["/tmp/kvkit-hostile-escape.txt", "/tmp/kvkit-hostile-escape-home.txt",
           os.path.join(ROOT, "solutions", "kvkit-hostile-escape.txt")]

# One honest base (the reference), plus each hostile act appended at test time.
BASE = open(os.path.join(ROOT, "solutions", "kv_cache.py")).read()
WRAP_OUT = """
_honest_attention = gqa_attention
_CALLS = [0]


def gqa_attention(q, cache, n_new):
    out = _honest_attention(q, cache, n_new)
    _CALLS[0] += 1
    return {act}
"""
WRAP_APPEND = """
_honest_append = KVCache.append


def _append(self, k_new, v_new, n_new):
    {act}
    return _honest_append(self, k_new, v_new, n_new)


KVCache.append = _append
"""
# Bounded to 300 forks (a broken sandbox cannot take the test machine down); a refused fork ends it.
BOMB = """
{setup}
import time as _time
_FORKED = []


def _bomb():
    if _FORKED:
        return
    _FORKED.append(True)
    for _ in range(300):
        try:
            pid = {fork}
        except OSError:
            return
        if pid == 0:
            _time.sleep(60)
            {exit}
"""
ACTS = {
    "infinite_loop": "\nwhile True:\n    pass\n",
    "sleeps_forever": "\nimport time as _time\n_time.sleep(10**6)\n",  # the same hang, at no CPU cost
    "memory_hog": "\n_hog = []\nwhile True:\n    _hog.append(bytearray(64 * 2**20))\n    _hog[-1][::4096] = b'x' * len(_hog[-1][::4096])\n",
    "fork_bomb": WRAP_APPEND.format(act="_bomb()") + BOMB.format(setup="import os as _os", fork="_os.fork()",
                                                                  exit="_os._exit(0)"),
    "fork_bomb_ctypes": WRAP_APPEND.format(act="_bomb()") + BOMB.format(
        setup="import ctypes as _ctypes\n_LIBC = _ctypes.CDLL(None)", fork="_LIBC.fork()", exit="_LIBC._exit(0)"),
    "exit_at_import": "\nimport os as _os\n_os._exit(0)\n",
    "sys_exit_at_import": "\nimport sys as _sys\n_sys.exit(3)\n",
    "exits_in_append": WRAP_APPEND.format(act="raise SystemExit(4)"),
    "segfault_ctypes": WRAP_APPEND.format(act="__import__('ctypes').string_at(0)"),
    "output_flood": "\nimport sys as _sys\nfor _ in range(40):\n    _sys.stdout.write('x' * 2**20)\n",
    "read_solutions": """
import glob as _glob, os as _os, sys as _sys
for _root in ["/work/main", "/autograder/source"] + [_os.path.join(e, "..", "..", "..", "..") for e in _sys.path]:
    try:
        exec(open(_os.path.join(_root, "solutions", "kv_cache.py")).read())
        break
    except Exception:
        pass
""",
    "network": WRAP_APPEND.format(act="_phone_home()") + """
import socket as _socket


def _phone_home():
    for attempt in (lambda: _socket.create_connection(("93.184.216.34", 80), timeout=1),
                    lambda: _socket.gethostbyname("example.com")):
        try:
            attempt()
        except Exception:
            pass


_phone_home()
""",
    "write_outside": """
import os as _os
for _target in ["/tmp/kvkit-hostile-escape.txt", _os.path.join(_os.path.expanduser("~"), "..", "kvkit-hostile-escape-home.txt")]:
    try:
        with open(_target, "w") as _f:
            _f.write("escaped")
    except OSError:
        pass
try:
    _os.remove("/tmp/kvkit-hostile-sentinel.txt")
except OSError:
    pass
""",
    "not_arrays": WRAP_OUT.format(act='["not an array", None, {"out": 1}, object(), out.tolist()[:1]][_CALLS[0] % 5]'),
    "wrong_dtype": WRAP_OUT.format(act="[out.astype(np.complex128), out.astype(object), out.astype(str), out > 0][_CALLS[0] % 4]"),
    "wrong_shape": WRAP_OUT.format(act="out[:, :1]"),
    "huge_array": WRAP_OUT.format(act="np.broadcast_to(np.float64(0.0), (1 << 20, 1 << 20, 1 << 10))"),
    # One task far past its time, the others quick: many one-token appends to a long row (the growth
    # probe) each sleep, as a cache copied on every append takes minutes there on a loaded machine.
    "slow_growth_probe": WRAP_APPEND.format(
        # one-token appends past the growth probe's prefill (about 2,048 tokens, d = 128; the live-length
        # probes' have d = 64, the memory probes' append once)
        act="self._ones = getattr(self, '_ones', 0) + (int(np.max(self.lens, initial=0)) > 1500 and k_new.shape[2] == 1"
            " and k_new.shape[3] == 128)\n"
            "    if self._ones > 50:\n        __import__('time').sleep(0.2)"),
}

# case -> (the best tier it may get, what its report must say)
EXPECT = {
    "infinite_loop": ("Weak", r"did not finish in time|wall time"),
    "sleeps_forever": ("Weak", r"did not finish in time|wall time"),
    "memory_hog": ("Weak", r"memory|killed"),
    "fork_bomb": ("Hire", r"."),
    "fork_bomb_ctypes": ("Hire", r"."),
    "exit_at_import": ("Weak", r"without an answer"),
    "sys_exit_at_import": ("Weak", r"failed to import: SystemExit: 3"),
    "exits_in_append": ("Weak", r"raised SystemExit"),
    "segfault_ctypes": ("Weak", r"segmentation fault"),
    "output_flood": ("Hire", r"MiB to stdout/stderr"),
    "read_solutions": ("Hire", r"."),
    "network": ("Hire", r"."),
    "write_outside": ("Hire", r"."),
    "not_arrays": ("Weak", r"returned (NoneType|str|dict|object|list)"),
    "wrong_dtype": ("Weak", r"dtype (complex128|object|bool|<U)"),
    "wrong_shape": ("Weak", r"expected an array of shape"),
    "huge_array": ("Weak", r"returned ndarray of shape \[1048576, 1048576, 1024\]"),
    "slow_growth_probe": ("Weak", r"growth probe: did not finish in time"),
}
FAKED: dict = {}
TIERS = [None, "Weak", "Hire", "Strong Hire"]


# The acts that spend the sandbox's limits of CPU time, memory, processes and output, or a probe's time
# (seconds each), and the malformed answers that test_grader.py's broken submissions also cover, are graded
# in a batch of their own that `make test` leaves to `make test-slow` (CI runs both). The rest (a hang past
# its time that sleeps, crashes, exits, escapes, a huge answer) run in every `make test`; an output flood is
# also in test_batch.py's class.
EXHAUSTING = ["fork_bomb", "fork_bomb_ctypes", "infinite_loop", "memory_hog", "not_arrays", "output_flood",
              "slow_growth_probe", "wrong_dtype", "wrong_shape"]
CORE = sorted(set(EXPECT) - set(EXHAUSTING))


def build_fixtures(directory, cases) -> list[str]:
    """Each of ``cases`` as a submission folder: the honest base plus its act."""
    paths = []
    for case in cases:
        folder = os.path.join(directory, case)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "kv_cache.py"), "w") as f:
            f.write(BASE + ACTS[case])
        paths.append(folder)
    return paths


def grade_batch(paths: list[str], out: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVKIT_SANDBOX_MEMORY_MB": "1024"}  # the memory hog stops at 1 GiB
    return subprocess.run([sys.executable, "-m", "grader", *paths, "--out", out, "--quiet", "--jobs", "2",
                           "--timeout", "5", "--trials", "20", "--seed", "7", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def read_reports(out: str) -> dict:
    reports = {}
    for name in os.listdir(out):
        if name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                report = json.load(f)
            reports[report["submission"]] = report
    return reports


def leftover_processes() -> list[str]:
    """Processes still working in a grading directory that is gone (a child the grader failed to take back)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if "kvkit-sub-" in cwd and cwd.endswith("(deleted)"):
            found.append(f"{pid}: {cwd}")
    return found


def _grade_once(tmp_path_factory, batch: str, cases: list[str], sentinel: bool = False) -> tuple[dict, str]:
    """``cases``, then a well-behaved submission, graded in one batch: ``(reports, stderr)``. With
    ``sentinel``, the files ``test_nothing_escaped`` checks are laid out first (one batch does it).

    Under pytest-xdist the batch runs once per session, whichever worker comes first; the others
    wait for it and read its reports.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, marker = shared / batch, shared / f"{batch}.done"
    with open(shared / f"{batch}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            if sentinel:
                for path in ESCAPES:
                    if os.path.exists(path):
                        os.remove(path)
                with open(SENTINEL, "w") as f:
                    f.write("must survive the hostile batch\n")
            fixtures = build_fixtures(str(shared / f"{batch}-fixtures"), cases)
            done = grade_batch(fixtures + [WELL_BEHAVED], str(out))
            assert done.returncode == 0, done.stderr[-3000:]
            marker.write_text(done.stderr)
    return read_reports(str(out)), marker.read_text()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The hostile acts of every `make test`, then a well-behaved submission."""
    return _grade_once(tmp_path_factory, "hostile-batch", CORE, sentinel=True)


@pytest.fixture(scope="module")
def graded_exhausting(tmp_path_factory):
    """The acts that spend the sandbox's limits (`make test-slow`), then a well-behaved submission."""
    return _grade_once(tmp_path_factory, "hostile-exhausting-batch", EXHAUSTING)


def text_of(report: dict) -> str:
    return json.dumps(report)


def test_every_case_has_an_act():
    assert sorted(EXPECT) == sorted(ACTS)


def _contained(reports, case):
    report = reports[case]
    best, says = EXPECT[case]
    assert report["schema"] == "kvkit.report/1"
    assert TIERS.index(report["tier"]) <= TIERS.index(best), (report["tier"], report.get("tier_reason"))
    assert report["status"] in ("graded", "not_graded"), report.get("tier_reason")
    assert re.search(says, text_of(report)), (report.get("error"), report.get("notes"))
    for cid in FAKED.get(case, []):
        status = {c["id"]: c["status"] for c in report["criteria"]}[cid]
        assert status != "pass", f"{case}: {cid} passed on faked evidence"


@pytest.mark.parametrize("case", CORE)
def test_hostile_case(graded, case):
    _contained(graded[0], case)


@pytest.mark.slow
@pytest.mark.parametrize("case", EXHAUSTING)
def test_hostile_case_that_spends_a_limit(graded_exhausting, case):
    _contained(graded_exhausting[0], case)


@pytest.mark.slow
def test_one_task_past_its_time_leaves_the_others_graded(graded_exhausting):
    """A probe that times out errors its own criterion; the hidden trials and the other probes still run."""
    report = graded_exhausting[0]["slow_growth_probe"]
    status = {c["id"]: c["status"] for c in report["criteria"]}
    assert status["preallocated_in_place"] == "error", report["tier_reason"]
    assert all(status[c] == "pass" for c in ("decode", "full_prefill", "chunked_prefill", "head_mapping",
                                             "no_kv_repeat")), status
    assert report["score"] > 50, report["score"]


def _goes_on(reports, cases):
    assert len(reports) == len(cases) + 1
    after = reports["hire_basic"]
    assert after["tier"] == "Hire" and not after.get("error"), after.get("tier_reason")
    # nothing from the hostile ones leaks into the next report (its one note: the batch's few trials)
    assert [n for n in after["notes"] if not n.startswith("a quick grading")] == [], after["notes"]


def test_the_grader_goes_on(graded):
    _goes_on(graded[0], CORE)


@pytest.mark.slow
def test_the_grader_goes_on_after_the_limits_are_spent(graded_exhausting):
    _goes_on(graded_exhausting[0], EXHAUSTING)
    assert not leftover_processes()


def test_nothing_escaped(graded):
    try:
        with open(SENTINEL) as f:
            assert "must survive" in f.read()
    finally:
        try:
            os.remove(SENTINEL)  # the test's own file: gone once checked
        except OSError:
            pass
    for path in ESCAPES:
        assert not os.path.exists(path), path
    assert os.path.exists(os.path.join(ROOT, "solutions", "kv_cache.py"))
    assert not leftover_processes()


def test_isolation_is_named(graded):
    from grader.sandbox import isolation

    reports, stderr = graded
    level = isolation.choose("auto")
    assert reports["hire_basic"]["isolation"] == level.level
    if level.warning:
        assert "weaker than full" in stderr  # even with --quiet
    else:
        assert level.level.startswith("namespaces")
        # at the full level the kit is not even there to read: no better than the honest base (Hire)
        assert reports["read_solutions"]["tier"] in ("Weak", "Hire")


def test_fallback_says_plainly_there_is_no_isolation():
    from grader.sandbox import isolation

    level, short = isolation._describe(isolation.Sandbox(namespaces=False), {"uid": 0})
    assert level.startswith("process") and any("NO ISOLATION" in s for s in short)
    assert any("ROOT" in s for s in short)


