"""Run untrusted code in a child process the grader can always take back.

Each child gets an isolated interpreter (``-I -S``: no user site, no
``PYTHONPATH``, no ``.pth`` hooks, so the kit's editable install is not on its
path; the parent hands it only the site-packages directories that hold NumPy,
torch and pytest), a working directory holding only the submission's files and
the job, a minimal environment, and rlimits on CPU seconds, address space,
file size and core dumps. Where the machine allows, ``isolation.py`` adds Linux
namespaces on top. A wall-clock timeout kills the whole process group.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass

OUTPUT_LIMIT = 8 * 2**20  # bytes of stdout/stderr kept on disk (RLIMIT_FSIZE stops more)
TAIL = 2000  # characters of output a report may quote


@dataclass
class Limits:
    """Resource limits of one child: seconds of wall and CPU time, bytes of memory and file size."""

    wall_s: float = 60.0
    cpu_s: int = 120
    memory_bytes: int = 6 * 2**30
    file_bytes: int = 64 * 2**20


@dataclass
class ChildResult:
    """How a child ended: its exit code, whether it was killed and why, its output's tail."""

    returncode: int | None
    timed_out: bool
    seconds: float
    output_tail: str
    reason: str  # "" when the child exited 0 by itself

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def site_dirs() -> list[str]:
    """The directories the child may import third-party packages from (NumPy, torch, pytest)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def child_env(workdir: str) -> dict:
    """A minimal environment: no inherited secrets, one thread per library."""
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    # Some processors need these for OpenBLAS to compute correctly (see the env notes).
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _apply_limits(limits: Limits):
    def apply():
        os.setsid()
        for kind, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_bytes),
                            (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(kind, (value, value))

    return apply


def describe_exit(returncode: int | None, timed_out: bool, limits: Limits, output: str) -> str:
    """Why a child ended, in words a report can show."""
    if timed_out:
        return f"killed after {limits.wall_s:g} s of wall time (a hang or an endless loop)"
    if returncode is None or returncode == 0:
        return ""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        why = {signal.SIGXCPU: f"ran past its {limits.cpu_s} s CPU limit",
               signal.SIGXFSZ: f"wrote past its {limits.file_bytes // 2**20} MiB file-size limit (flooded output?)",
               signal.SIGSEGV: "crashed with a segmentation fault",
               signal.SIGKILL: "was killed (out of memory, or by its own hand)"}.get(sig, "was killed")
        return f"the child {why} ({sig.name})"
    if "MemoryError" in output:
        return f"the child ran out of memory (limit {limits.memory_bytes // 2**20} MiB)"
    return f"the child exited with status {returncode} before finishing"


def run_child(argv: list[str], workdir: str, limits: Limits, wrap=None) -> ChildResult:
    """Run ``python -I -S argv...`` in ``workdir`` under ``limits``.

    ``wrap`` (from ``isolation.py``) may prefix the command with a namespace
    launcher. Output goes to a file in ``workdir`` bounded by RLIMIT_FSIZE; the
    report quotes at most its last ``TAIL`` characters.
    """
    command = [sys.executable, "-I", "-S", *argv]
    if wrap is not None:
        command = wrap(command, workdir)
    log_path = os.path.join(workdir, ".kvkit", "child.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=workdir, env=child_env(workdir), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_apply_limits(limits),
                                close_fds=True)
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Take back everything it started, hung or not (a fork keeps the group).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    with open(log_path, "rb") as log:
        log.seek(max(0, os.path.getsize(log_path) - TAIL))
        tail = log.read().decode("utf-8", "replace")
    returncode = proc.returncode
    return ChildResult(returncode, timed_out, time.monotonic() - start, tail,
                       describe_exit(returncode, timed_out, limits, tail))
