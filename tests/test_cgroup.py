"""grader/sandbox/cgroup.py: a control group bounds and measures one child process tree.

Each test runs real children (`python -c ...`) inside a real group, so the whole module is
skipped where no memory+pids cgroup can be made (not root, no delegation, no controllers).
The module is loaded from its file when `grader.sandbox` is not (yet) a package.
"""
from __future__ import annotations

import errno
import glob
import importlib.util
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20


def _load():
    try:
        from grader.sandbox import cgroup  # type: ignore[attr-defined]
        return cgroup
    except ImportError:
        path = os.path.join(ROOT, "grader", "sandbox", "cgroup.py")
        spec = importlib.util.spec_from_file_location("kvkit_sandbox_cgroup", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


cgroup = _load()

if sys.platform != "linux":
    pytest.skip("control groups are Linux-only", allow_module_level=True)
if cgroup.available() is None:
    pytest.skip(f"no usable memory+pids cgroup here: {cgroup.why_unavailable()}",
                allow_module_level=True)


def run_child(cg, code: str, timeout: float = 30) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-c", code], preexec_fn=cg.join_fn(),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


def touch(mib: int) -> str:
    """Child code that makes `mib` MiB of anonymous memory resident, page by page."""
    return (f"b = bytearray({mib} * 2**20)\n"
            "for i in range(0, len(b), 4096):\n"
            "    b[i] = 1\n"
            "print(len(b))\n")


def test_available_and_version():
    assert cgroup.available() in ("v1", "v2")
    assert cgroup.why_unavailable() == ""
    with cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16) as cg:
        assert f"v{cg.version}" == cgroup.available()
        assert len(cg.paths) == (2 if cg.version == 1 else 1)
        for path in cg.paths:
            assert os.path.basename(path).startswith(f"kvkit-{os.getpid()}-")
            assert os.path.isdir(path)
        assert cg.usage() < 16 * MiB          # empty group: nothing charged yet
        assert cg.oom_killed() is False


def test_peak_counts_anonymous_memory_and_reset_peak_starts_over():
    with cgroup.Cgroup(memory_bytes=512 * MiB, max_pids=16) as cg:
        rc, out = run_child(cg, touch(200))
        assert (rc, out.strip()) == (0, str(200 * MiB))
        first = cg.peak()
        assert first >= 190 * MiB, first
        # The child has exited, so its anonymous memory is no longer charged.
        assert cg.usage() < 100 * MiB
        cg.reset_peak()
        rc, out = run_child(cg, touch(10))
        assert rc == 0
        second = cg.peak()
        assert 10 * MiB <= second < 100 * MiB, second
        assert cg.oom_killed() is False


def test_memfd_written_with_os_write_is_charged():
    code = ("import os\n"
            "fd = os.memfd_create('kvkit-test')\n"
            "chunk = b'\\x01' * 2**20\n"
            "for _ in range(150):\n"
            "    os.write(fd, chunk)\n"
            "print(os.fstat(fd).st_size)\n")
    with cgroup.Cgroup(memory_bytes=512 * MiB, max_pids=16) as cg:
        rc, out = run_child(cg, code)
        assert (rc, out.strip()) == (0, str(150 * MiB))
        assert cg.peak() >= 140 * MiB, cg.peak()
        # Closing the last reference to the memfd (at exit) uncharges its shmem pages.
        assert cg.usage() < 100 * MiB


def test_memory_limit_kills_the_child_and_is_reported():
    with cgroup.Cgroup(memory_bytes=64 * MiB, max_pids=16) as cg:
        rc, out = run_child(cg, touch(256))
        assert rc != 0 and out == "", (rc, out)
        assert rc == -signal.SIGKILL           # the OOM killer's signal
        assert cg.oom_killed() is True
        assert cg.peak() <= 64 * MiB + MiB     # the limit binds the peak too


def test_max_pids_makes_fork_fail_with_eagain():
    code = ("import os, time\n"
            "n, err = 0, None\n"
            "for _ in range(40):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError as e:\n"
            "        err = e.errno\n"
            "        break\n"
            "    if pid == 0:\n"
            "        os.close(1)\n"
            "        time.sleep(30)\n"
            "        os._exit(0)\n"
            "    n += 1\n"
            "print(n, err, flush=True)\n")
    with cgroup.Cgroup(memory_bytes=512 * MiB, max_pids=8) as cg:
        rc, out = run_child(cg, code)
        assert rc == 0
        forks, err = out.split()
        assert int(forks) < 40
        assert int(forks) <= 7                 # the child itself is one of the 8 tasks
        assert err == str(errno.EAGAIN)
        assert 2 <= cg.pids_peak_or_current() <= 8
    # close() (via __exit__) killed the sleeping grandchildren and removed the groups.
    assert not any(os.path.exists(p) for p in cg.paths)


def test_close_kills_what_is_left_and_removes_the_groups():
    cg = cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16)
    paths = cg.paths
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            preexec_fn=cg.join_fn())
    try:
        # Popen returns after exec, and the join ran before exec: the child is inside.
        assert cg.pids_peak_or_current() >= 1
        cg.close()
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not any(os.path.exists(p) for p in paths)
        cg.close()                             # idempotent, never raises
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # A closed group cannot be joined: Popen fails instead of starting an unbounded child.
    with pytest.raises(subprocess.SubprocessError):
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=cg.join_fn())


def test_groups_of_killed_workers_are_removed_all_at_once():
    """A stopped grader removes its workers' groups by name: every group's processes are killed first, so
    their exits overlap, and the groups are listed again until none is left."""
    groups = [cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16) for _ in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=g.join_fn())
             for g in groups]
    try:
        paths = [p for g in groups for p in g.paths]
        assert all(os.path.exists(p) for p in paths)
        cgroup.remove_groups_of({os.getpid()}, grace_s=5.0)
        assert [proc.wait(timeout=5) for proc in procs] == [-signal.SIGKILL] * 3
        assert not any(os.path.exists(p) for p in paths), paths
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for g in groups:
            g.close()


def test_cpu_seconds_count_a_child_nobody_waits_for():
    """The group's CPU figure holds what a process the kernel reaped by itself (SIGCHLD ignored) used, which
    no wait4 reports."""
    with cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16) as cg:
        before = cg.cpu_seconds()
        if before is None:
            pytest.skip("no CPU figure for a group on this machine (no writable cpuacct hierarchy)")
        code = ("import os, signal, time\n"
                "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    start = time.process_time()\n"
                "    while time.process_time() - start < 0.3:\n"
                "        pass\n"
                "    os._exit(0)\n"
                "try:\n"
                "    os.waitpid(pid, 0)\n"
                "except ChildProcessError:\n"
                "    pass\n")
        assert run_child(cg, code)[0] == 0
        assert cg.cpu_seconds() - before >= 0.25


def test_failed_setup_removes_the_partial_group(monkeypatch):
    with cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16) as cg:
        parents = {os.path.dirname(p) for p in cg.paths}
    real_write = cgroup._write

    def refuse_pids_max(path, value):
        if path.endswith("pids.max"):
            raise OSError(errno.EACCES, "refused by the test", path)
        real_write(path, value)

    monkeypatch.setattr(cgroup, "_write", refuse_pids_max)
    with pytest.raises(OSError) as info:
        cgroup.Cgroup(memory_bytes=128 * MiB, max_pids=16)
    assert "pids.max" in str(info.value)       # the message names the file
    left = [p for parent in parents for p in glob.glob(os.path.join(parent, f"kvkit-{os.getpid()}-*"))]
    assert left == []


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        cgroup.Cgroup(memory_bytes=0, max_pids=8)
    with pytest.raises(ValueError):
        cgroup.Cgroup(memory_bytes=64 * MiB, max_pids=0)
