"""Run untrusted code in a child process the grader can always take back.

Each child gets an isolated interpreter (``-I -S``: no user site, no
``PYTHONPATH``, no ``.pth`` hooks, so the kit's editable install is not on its
path; the parent hands it only the site-packages directories that hold NumPy,
torch and pytest), a working directory holding only the submission's files and
the job, a minimal environment, ``no_new_privs``, and rlimits on CPU seconds,
address space, file size, processes and core dumps. Its first code is the
audit-hook guard (``guard.py``), which refuses the network, new processes,
writes outside its directory and reads outside an allowlist, and logs the tools
of tampering. Where ``isolation.py`` allows, the child also runs as a uid of
its own and inside Linux namespaces.

Taking it back: a wall-clock timeout kills its process group; its output goes
through a pipe the parent drains and bounds (a flood costs the child time, not
the grader memory or disk); when it ran as its own uid, every process left
with that uid is killed; a watchdog kills it when its directory grows past
``DIR_BYTES_LIMIT`` bytes or ``SWEEP_ENTRY_LIMIT`` entries; and its directory
is swept of links, devices and FIFOs before the parent reads anything from it
(past the entry limit, the job folder is removed whole). The parent writes
into the job folder only with :func:`write_parent_file` and reads the child's
answers only with :func:`open_child_file`.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import resource
import shutil
import signal
import stat as stat_mod
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field

OUTPUT_KEEP = 2000  # characters of output a report may quote
FLOOD_NOTE = 1 * 2**20  # bytes of output worth a note
GUARD_LOG_LIMIT = 1 * 2**20  # the guard writes at most ~400 lines of ~500 bytes: more is tampering
GUARD_EVENTS_KEPT = 50  # "blocked" events kept; every distinct "seen" event is kept
SWEEP_ENTRY_LIMIT = 20000
DIR_BYTES_LIMIT = 256 * 2**20  # bytes a child may leave in its directory (the watchdog's bound)
WATCH_PERIOD_S = 0.2
GUARD_LOG_BROKEN = 97  # guard.LOG_BROKEN
JOB = ".kvkit"
HERE = os.path.dirname(os.path.abspath(__file__))
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def _memory_default() -> int:
    """6 GiB, or ``KVKIT_SANDBOX_MEMORY_MB`` (for small CI machines and tests)."""
    try:
        return int(os.environ["KVKIT_SANDBOX_MEMORY_MB"]) * 2**20
    except (KeyError, ValueError):
        return 6 * 2**30


@dataclass
class Limits:
    """Resource limits of one child: seconds of wall and CPU time, bytes of memory and file size, processes."""

    wall_s: float = 60.0
    cpu_s: int = 120
    memory_bytes: int = field(default_factory=_memory_default)
    file_bytes: int = 64 * 2**20
    processes: int = 256  # threads count too; binds only a child that runs as its own uid


@dataclass
class ChildResult:
    """How a child ended: its exit code, whether it was killed and why, its output's tail, what the guard saw."""

    returncode: int | None
    timed_out: bool
    seconds: float
    output_tail: str
    reason: str  # "" when the child exited 0 by itself
    output_bytes: int = 0
    events: list = field(default_factory=list)  # the guard's log: {"a", "e", "d", "w"}
    leftover: int = 0  # processes of the child's uid still running after it ended
    guard_closed: bool = False  # the guard wrote its closing line (the script ended normally)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def blocked(self) -> list[str]:
        """What the guard refused, in words: ``"network access: socket.connect (kv_cache.py:7)"``."""
        return [f"{e.get('d')}" + (f" ({e['w']})" if e.get("w") else "") for e in self.events if e.get("a") == "blocked"]

    @property
    def suspicious(self) -> list[str]:
        """The tools of tampering the submission's own code used: ``"ctypes.dlopen at kv_cache.py:3"``."""
        return [f"{e.get('e')}" + (f" at {e['w']}" if e.get("w") else "") for e in self.events if e.get("a") == "seen"]

    @property
    def notes(self) -> list[str]:
        """What happened that a report should say, beyond the exit reason."""
        notes = []
        if self.output_bytes > FLOOD_NOTE:
            notes.append(f"the child wrote {self.output_bytes / 2**20:.1f} MiB to stdout/stderr "
                         f"(the grader kept the last {OUTPUT_KEEP} characters)")
        blocked = self.blocked
        if blocked:
            notes.append(f"the sandbox refused {len(blocked)} action(s): " + "; ".join(blocked[:4]))
        seen = self.suspicious
        if seen:
            notes.append("tools of tampering used by the submission: " + "; ".join(seen[:4]))
        if self.leftover:
            notes.append(f"the child left {self.leftover} process(es) running; all were killed")
        return notes


def site_dirs() -> list[str]:
    """The directories the child may import third-party packages from (NumPy, torch, pytest)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def child_env(workdir: str) -> dict:
    """A minimal environment: no inherited secrets, one thread per library."""
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "USER": "sandbox", "LOGNAME": "sandbox"}
    # Some processors need these for OpenBLAS to compute correctly (see the env notes).
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


_LIBC = None


def _apply_limits(limits: Limits):
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        _LIBC = _libc()  # loaded here, not in the forked child
    libc = _LIBC

    def apply():
        for kind, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_bytes),
                            (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0),
                            (resource.RLIMIT_NPROC, limits.processes)):
            resource.setrlimit(kind, (value, value))
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the grader (after any uid change)
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary gives it privileges back

    return apply


def describe_exit(returncode: int | None, timed_out: bool, limits: Limits, output: str) -> str:
    """Why a child ended, in words a report can show."""
    if timed_out:
        return f"killed after {limits.wall_s:g} s of wall time (a hang or an endless loop)"
    if returncode is None or returncode == 0:
        return ""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"the child was killed by signal {-returncode}"
        why = {signal.SIGXCPU: f"ran past its {limits.cpu_s} s CPU limit",
               signal.SIGXFSZ: f"wrote past its {limits.file_bytes // 2**20} MiB file-size limit",
               signal.SIGSEGV: "crashed with a segmentation fault",
               signal.SIGBUS: "crashed with a bus error",
               signal.SIGILL: "crashed with an illegal instruction",
               signal.SIGFPE: "crashed with a floating-point exception",
               signal.SIGABRT: "aborted",
               signal.SIGKILL: "was killed (out of memory, or by its own hand)"}.get(sig, "was killed")
        return f"the child {why} ({sig.name})"
    if "MemoryError" in output:
        return f"the child ran out of memory (limit {limits.memory_bytes // 2**20} MiB)"
    if returncode == GUARD_LOG_BROKEN:
        return "the child closed or replaced the sandbox guard's log (tampering)"
    if returncode == 125 and "kvkit sandbox:" in output:
        line = next((ln for ln in output.splitlines() if "kvkit sandbox:" in ln), "")
        return f"the sandbox could not start the child ({line.strip()[:200]})"
    return f"the child exited with status {returncode} before finishing"


# ---------------------------------------------------------------------- the child's directory

def _owned_by(path: str, uid: int | None) -> None:
    """Hand ``path`` and everything in it to ``uid`` (so a child without root can write its results)."""
    if uid is None:
        return
    os.lchown(path, uid, uid)
    os.chmod(path, 0o700)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                os.lchown(os.path.join(root, name), uid, uid)
            except OSError:
                pass


def _remove(path: str) -> None:
    """Remove ``path`` without following it: a link or a file is unlinked, a real directory removed whole."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat_mod.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: never follows a link inside
    else:
        os.unlink(path)


def _sweep(workdir: str) -> tuple[int, bool]:
    """``(removed, overflow)``: see :func:`sweep`. The job folder is walked first."""
    removed, seen = 0, 0
    job = os.path.join(workdir, JOB)
    tops = [job] if os.path.isdir(job) and not os.path.islink(job) else []
    for top in tops + [workdir]:
        for root, dirs, files in os.walk(top, followlinks=False):
            if top == workdir and root == workdir and JOB in dirs:
                dirs.remove(JOB)  # walked already
            for name in dirs + files:
                seen += 1
                if seen > SWEEP_ENTRY_LIMIT:
                    _remove(job)  # the parent must never find a link planted where it writes or reads
                    return removed, True
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat_mod.S_ISDIR(st.st_mode):
                    continue
                if not stat_mod.S_ISREG(st.st_mode) or st.st_nlink > 1:
                    try:
                        os.unlink(path)
                        removed += 1
                    except OSError:
                        pass
    return removed, False


def sweep(workdir: str) -> int:
    """Remove what the parent must never follow or block on: links, FIFOs, sockets, devices, hard links.

    Returns the number of entries removed. Called after every child and before
    the parent reads or writes anything in ``workdir``. It never stops half way:
    past ``SWEEP_ENTRY_LIMIT`` entries it removes the job folder (``.kvkit``)
    whole, so nothing is left there to follow (see :func:`_sweep`).
    """
    return _sweep(workdir)[0]


def prepare_job_dir(workdir: str) -> str:
    """The job folder ``workdir/.kvkit`` as a real directory of the parent's (a link or a file there is removed)."""
    job = os.path.join(workdir, JOB)
    try:
        st = os.lstat(job)
    except FileNotFoundError:
        st = None
    if st is not None and not stat_mod.S_ISDIR(st.st_mode):
        os.unlink(job)
        st = None
    if st is None:
        os.mkdir(job, 0o700)
    return job


def _open_dir(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def write_parent_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` as a new file at ``path`` (in a folder the child can write) without following links.

    Whatever is at ``path`` is removed first, without following it (a link, a
    FIFO, a directory); the file is then created with ``O_EXCL|O_NOFOLLOW``
    relative to its folder, itself opened with ``O_NOFOLLOW``: a link planted at
    the last step makes this raise rather than write elsewhere.
    """
    folder, name = os.path.split(os.path.abspath(path))
    dfd = _open_dir(folder)
    try:
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat_mod.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def open_child_file(path: str, limit: int):
    """Open a file the child wrote, for reading (binary), only if it is safe to read.

    ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK`` (its folder opened with ``O_NOFOLLOW`` too),
    then ``fstat``: it must be a regular file with one link and at most ``limit``
    bytes. Raises ``FileNotFoundError`` when it is not there, ``ValueError``
    naming why when it is there but must not be read, ``OSError`` otherwise.
    Use as ``with open_child_file(p, LIMIT) as f: data = f.read(LIMIT + 1)``.
    """
    folder, name = os.path.split(os.path.abspath(path))
    try:
        dfd = _open_dir(folder)
    except NotADirectoryError as exc:
        raise ValueError(f"{folder} is not a directory (a link?)") from exc
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a link
            raise ValueError(f"{folder} is a symbolic link") from exc
        raise
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == 40:
                raise ValueError(f"{name} is a symbolic link") from exc
            raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise ValueError(f"{name} is not a regular file")
        if st.st_nlink != 1:
            raise ValueError(f"{name} has {st.st_nlink} hard links")
        if st.st_size > limit:
            raise ValueError(f"{name} is {st.st_size} bytes, over the {limit}-byte limit")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _dir_usage(workdir: str, stop_bytes: int, stop_entries: int) -> tuple[int, int]:
    """``(bytes, entries)`` under ``workdir`` (allocated blocks, links not followed), stopping past either bound."""
    total, entries = 0, 0
    stack = [workdir]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += max(st.st_blocks * 512, 0)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                if total > stop_bytes or entries > stop_entries:
                    return total, entries
    return total, entries


class _Watchdog(threading.Thread):
    """Polls the child's directory; kills the child's process group past the bytes or entries bound."""

    def __init__(self, proc, workdir: str, max_bytes: int, max_entries: int):
        super().__init__(daemon=True)
        self.proc, self.workdir = proc, workdir
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.reason = ""
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(WATCH_PERIOD_S):
            used, entries = _dir_usage(self.workdir, self.max_bytes, self.max_entries)
            if used > self.max_bytes or entries > self.max_entries:
                self.reason = (f"killed for writing more than {self.max_bytes // 2**20} MiB into its directory"
                               if used > self.max_bytes else
                               f"killed for leaving too many files (more than {self.max_entries}) in its directory")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return


def _processes_of(uid: int) -> list[int]:
    pids = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return pids
    for name in names:
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def _tasks_of(uid: int) -> int:
    """Threads running as ``uid`` (what RLIMIT_NPROC counts)."""
    total = 0
    for pid in _processes_of(uid):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return total


def _kill_all_as(uid: int) -> None:
    """Run in a helper that has become ``uid``: kill(-1) reaches every process of that uid but itself."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def reap_uid(uid: int | None) -> int:
    """Kill every process running as ``uid`` (a child's own); return how many there were."""
    if uid is None or uid == 0 or not sys.platform.startswith("linux"):
        return 0
    found = _processes_of(uid)
    for _ in range(5):
        if not _processes_of(uid):
            break
        try:
            subprocess.run(["/bin/sh", "-c", ":"], user=uid, group=uid, extra_groups=[], preexec_fn=lambda: _kill_all_as(uid),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=10, close_fds=True)
        except (OSError, subprocess.SubprocessError):
            for pid in _processes_of(uid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.05)
    return len(found)


def _guard_config(workdir: str, job: str) -> dict:
    from grader import isolation

    workdir = os.path.realpath(workdir)
    sites = [os.path.realpath(p) for p in site_dirs()]
    paths = sysconfig.get_paths()
    stdlib = list(dict.fromkeys(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)))
    allow = [workdir, os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable)),
             *stdlib, *sites, "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
             "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/shm", "/dev/fd", "/sys/devices/system/cpu",
             "/sys/fs/cgroup"]
    deny = [*isolation.kit_dirs(), "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh"]
    return {"workdir": workdir, "allow_read": allow, "deny_read": deny, "stdlib": stdlib,
            "library": sites + [os.path.realpath(job)], "log": os.path.join(job, "guard.log"), "job": job,
            "protected": [os.path.join(job, n) for n in ("guard.log", "guard.json", "guard.py")]}


def _tamper(detail: str) -> dict:
    return {"a": "seen", "e": f"guard log: {detail}"[:200], "d": detail[:200], "w": ""}


def _read_guard_log(path: str) -> tuple[list[dict], bool]:
    """``(events, closed)``: the guard's log, one entry per distinct event, and whether it has its closing line.

    Every distinct "seen" event is kept (the guard bounds them); "blocked" ones up
    to ``GUARD_EVENTS_KEPT``. A log that is oversized, holds a line the guard did
    not write, or whose line numbers are not 1, 2, 3... (cut, truncated, forged)
    adds a "seen" event of its own: the log was tampered with.
    """
    events, seen, blocked, closed, problems = [], set(), 0, False, []
    try:
        with open_child_file(path, GUARD_LOG_LIMIT) as f:
            data = f.read(GUARD_LOG_LIMIT + 1)
    except FileNotFoundError:
        return [_tamper("the guard's log is missing")], False
    except (OSError, ValueError) as exc:
        return [_tamper(f"the guard's log could not be read safely ({exc})"[:200])], False
    expected = 1
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or event.get("n") != expected:
            problems.append("a line the guard did not write, or lines missing")
            break
        expected += 1
        if event.get("a") == "end":
            closed = True
            continue
        event = {k: str(event.get(k, ""))[:200] for k in ("a", "e", "d", "w")}
        key = (event["a"], event["e"], event["d"][:60] if event["a"] == "blocked" else "", event["w"])
        if key in seen:
            continue
        if event["a"] == "blocked":
            if blocked >= GUARD_EVENTS_KEPT:
                continue
            blocked += 1
        seen.add(key)
        events.append(event)
    for problem in problems:
        events.append(_tamper(f"the guard's log was tampered with ({problem})"))
    return events, closed and not problems


class _Drain(threading.Thread):
    """Reads a child's output as it comes: counts it, keeps the last bytes, stores nothing else."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe = pipe
        self.total = 0
        self.tail = collections.deque()
        self.kept = 0

    def run(self):
        try:
            while True:
                chunk = self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536)
                if not chunk:
                    break
                self.total += len(chunk)
                self.tail.append(chunk)
                self.kept += len(chunk)
                while self.kept - len(self.tail[0]) >= 4 * OUTPUT_KEEP:
                    self.kept -= len(self.tail.popleft())
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        return b"".join(self.tail)[-4 * OUTPUT_KEEP:].decode("utf-8", "replace")[-OUTPUT_KEEP:]


def run_child(argv: list[str], workdir: str, limits: Limits, wrap=None) -> ChildResult:
    """Run ``python -I -S -B guard.py CONFIG argv...`` in ``workdir`` under ``limits``.

    ``wrap`` is an ``isolation.Sandbox`` (a uid of its own, namespaces) or any
    callable ``wrap(command, workdir)`` that prefixes the command. The report
    quotes at most the last ``OUTPUT_KEEP`` characters of the child's output.
    """
    prepare_job_dir(workdir)
    _, overflow = _sweep(workdir)
    job = prepare_job_dir(workdir)  # again: the sweep removes it whole past its entry limit
    with open(os.path.join(HERE, "guard.py"), "rb") as f:
        write_parent_file(os.path.join(job, "guard.py"), f.read())
    log_path = os.path.join(job, "guard.log")
    _remove(log_path)
    write_parent_file(os.path.join(job, "guard.json"), json.dumps(_guard_config(workdir, job)).encode())
    command = [sys.executable, "-I", "-S", "-B", os.path.join(job, "guard.py"), os.path.join(job, "guard.json"), *argv]

    uid = wrap.child_uid() if hasattr(wrap, "child_uid") else None
    if uid is None and hasattr(os, "getuid") and os.getuid() != 0:
        # The child keeps our uid, and RLIMIT_NPROC counts every task of it: leave room for ours.
        limits = dataclasses.replace(limits, processes=limits.processes + _tasks_of(os.getuid()))
    namespaces = bool(getattr(wrap, "namespaces", False))
    if hasattr(wrap, "child_uid"):
        command = wrap(command, workdir, uid)
    elif wrap is not None:
        command = wrap(command, workdir)
    _owned_by(workdir, uid)
    as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None and not namespaces else {}

    start = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(command, cwd=workdir, env=child_env(workdir), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_apply_limits(limits),
                                start_new_session=True, close_fds=True, **as_user)
    except (OSError, subprocess.SubprocessError) as exc:
        return ChildResult(None, False, 0.0, "", f"the sandbox could not start the child ({exc})")
    drain = _Drain(proc.stdout)
    drain.start()
    watchdog = _Watchdog(proc, workdir, DIR_BYTES_LIMIT, SWEEP_ENTRY_LIMIT)
    watchdog.start()
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        watchdog.done.set()
        # Take back everything it started, hung or not (a fork keeps the group).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    leftover = reap_uid(uid)
    if namespaces:
        leftover = 0  # the namespace's processes died with its init; what the sweep saw were corpses
    drain.join(timeout=5)
    if not drain.is_alive():  # else a process we could not reach holds the pipe: leave it to the daemon thread
        proc.stdout.close()
    watchdog.join(timeout=5)
    _, swept_over = _sweep(workdir)
    tail = drain.text()
    returncode = proc.returncode
    reasons = [watchdog.reason] if watchdog.reason else [describe_exit(returncode, timed_out, limits, tail)]
    if (swept_over or overflow) and "too many files" not in watchdog.reason:
        reasons.append(f"the child left too many files (more than {SWEEP_ENTRY_LIMIT}) in its directory; "
                       "its job folder was removed")
        events, closed = [], False
    else:
        events, closed = _read_guard_log(log_path)
        if returncode == 0 and not timed_out and not closed:
            events.append(_tamper("the child exited 0 without the guard's closing line "
                                  "(it ended before the script's end, or its log was cut)"))
    return ChildResult(returncode, timed_out, time.monotonic() - start, tail, "; ".join(r for r in reasons if r),
                       drain.total, events, leftover, closed)
