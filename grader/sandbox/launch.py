"""Run a submission's tasks in a sandbox and measure them from outside.

One *session* per implementation (the NumPy one, the port): the parent lays
out a job folder (read-only to the child) and the submission's files, starts
``grader/child/zygote.py`` inside the isolation chosen by ``isolation.py``,
inside a memory/pids cgroup of its own where the machine allows one, and talks
to the zygote over two pipes only the zygote holds. Before each task the
parent resets the cgroup's memory high-water mark and reads its usage; after
it, the peak. So each task's memory figure is the kernel's (shared memory,
memfd and tmpfs pages included), its CPU time is the kernel's (``wait4`` in the
zygote, which never runs submission code), and its wall time is the parent's.

Taking it back: a wall-clock deadline for the whole session; the child's
process group, its uid (where it has one) and its cgroup are killed at the end;
its output is drained and bounded; the job folder is removed with ``rm -rf``
(never a recursion in Python). Inside the namespaces the working directory is
a size-capped tmpfs that disappears with them.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field

from grader.child import protocol
from grader.sandbox import cgroup as cgroup_mod

OUTPUT_KEEP = 2000  # characters of output a report may quote
FLOOD_NOTE = 1 * 2**20  # bytes of output worth a note
WORKDIR_BYTES = 256 * 2**20  # the tmpfs working directory's size
WORKDIR_INODES = 20000  # and its files
DIR_BYTES_LIMIT = WORKDIR_BYTES  # the fallback's watchdog bound (no tmpfs there)
WATCH_PERIOD_S = 0.2
CHILD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "child")
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# Every fork of the grader's process holds this lock, and so does any long NumPy work on another
# thread: OpenBLAS's fork handler stops its thread pool, and spins forever if a BLAS call is running.
FORK_LOCK = threading.RLock()


def _memory_default() -> int:
    """6 GiB, or ``KVKIT_SANDBOX_MEMORY_MB`` (for small CI machines and tests)."""
    try:
        return int(os.environ["KVKIT_SANDBOX_MEMORY_MB"]) * 2**20
    except (KeyError, ValueError):
        return 6 * 2**30


@dataclass
class Limits:
    """Resource limits of one session: seconds of wall and CPU time, bytes of memory and file size, processes."""

    wall_s: float = 60.0
    cpu_s: int = 120
    memory_bytes: int = field(default_factory=_memory_default)
    file_bytes: int = 64 * 2**20
    processes: int = 256  # threads count too


@dataclass
class TaskResult:
    """One task as the parent saw it: the answer (data from the submission's process) and the measurements
    (from the kernel: exit, CPU seconds, memory)."""

    name: str
    answer: dict | None = None
    blob: bytes = b""
    answer_error: str = ""
    exit: int | None = None
    signal: int | None = None
    stopped: str = ""  # "timeout", "oversized" or ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    memory_bytes: int = 0  # peak after the task's first mark (its import done) above the fresh sandbox's usage
    memory_source: str = ""  # "cgroup" or "rss"
    # The kernel's figures at each mark the task made and at its end (see ``segments``): "cpu_s" (seconds
    # so far), "usage" (bytes now) and "peak" (the highest usage since the point before), None where unknown.
    points: list = field(default_factory=list)
    sent: list = field(default_factory=list)  # what the task sent with each mark (bytes; the calls' outputs)

    def segments(self) -> list[dict]:
        """The task's parts between its marks, in order: ``{"cpu_s", "peak", "start", "end"}`` each, the
        kernel's CPU seconds spent in the part, its highest memory use, and the use at its start and end
        (bytes; None where the machine gives no such figure). Part 0 follows the first mark (the import)."""
        out = []
        for before, after in zip(self.points, self.points[1:]):
            cpu = None if before["cpu_s"] is None or after["cpu_s"] is None else max(after["cpu_s"] - before["cpu_s"], 0.0)
            out.append({"cpu_s": cpu, "peak": after["peak"], "start": before["usage"], "end": after["usage"]})
        return out

    @property
    def ended_well(self) -> bool:
        return self.exit == 0 and not self.stopped and self.answer is not None

    def why(self) -> str:
        """Why the task has no usable answer, in words ("" when it has one)."""
        if self.stopped == "timeout":
            return "did not finish in time (a hang, an endless loop, or work far beyond what the sizes call for?)"
        if self.stopped == "oversized":
            return "sent an answer larger than the grader reads"
        if self.signal:
            name = {signal.SIGKILL: "was killed (out of memory, or by its own hand)",
                    signal.SIGSEGV: "crashed with a segmentation fault", signal.SIGXCPU: "ran past its CPU limit",
                    signal.SIGXFSZ: "wrote past its file-size limit", signal.SIGABRT: "aborted",
                    signal.SIGBUS: "crashed with a bus error"}.get(self.signal, f"was killed by signal {self.signal}")
            return f"the process {name}"
        if self.answer is None:
            return f"the process ended (exit {self.exit}) without an answer ({self.answer_error or 'none'})"
        return ""


@dataclass
class SessionResult:
    """A whole session: per-task results, why it ended early ("" when it did not), the output's tail."""

    tasks: dict = field(default_factory=dict)
    reason: str = ""
    output_tail: str = ""
    output_bytes: int = 0
    memory_limit_hit: bool = False
    notes: list = field(default_factory=list)
    tasks_started: int = 0  # "ready" events: 0 means the sandbox never reached a task (no submission code ran)
    served: dict = field(default_factory=dict)  # own-tests task -> calls the parent answered (grader/stages/variants.py)


def site_dirs() -> list[str]:
    """The directories the child may import third-party packages from (NumPy, torch, pytest)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def child_env(workdir: str) -> dict:
    """A minimal environment: no inherited secrets, one thread per library."""
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           # The own tests' pytest loads only the plugins named (grader/child/run_own_tests.py, plugin_args).
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "USER": "sandbox", "LOGNAME": "sandbox"}
    # Some processors need these for OpenBLAS to compute correctly (see the env notes).
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


_LIBC = None


def _preexec(limits: Limits, join=None, uid: int | None = None):
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child
    libc = _LIBC

    def apply():
        if join is not None:
            join()  # into the cgroup before anything else runs
        for kind, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_FSIZE, limits.file_bytes),
                            (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, limits.processes)):
            resource.setrlimit(kind, (value, value))
        if join is None:  # no cgroup: address space is the only memory bound left
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        if uid is not None:
            # A uid of its own, dropped here rather than by Popen (which drops it before this function runs):
            # only the grader's uid may move the child into the cgroup above.
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the grader (after the uid change)
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary gives it privileges back

    return apply


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
                chunk = self.pipe.read1(65536)
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
    """The fallback's disk bound (no tmpfs there): kills the child's group past the bytes or entries bound."""

    def __init__(self, pid: int, workdir: str):
        super().__init__(daemon=True)
        self.pid, self.workdir = pid, workdir
        self.reason = ""
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(WATCH_PERIOD_S):
            used, entries = _dir_usage(self.workdir, DIR_BYTES_LIMIT, WORKDIR_INODES)
            if used > DIR_BYTES_LIMIT or entries > WORKDIR_INODES:
                self.reason = (f"killed for writing more than {DIR_BYTES_LIMIT // 2**20} MiB into its directory"
                               if used > DIR_BYTES_LIMIT else
                               f"killed for leaving too many files (more than {WORKDIR_INODES}) in its directory")
                _killpg(self.pid)
                return


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def reap_uid(uid: int | None) -> int:
    """Kill every process running as ``uid`` (a child's own); return how many there were."""
    if uid is None or uid == 0 or not sys.platform.startswith("linux"):
        return 0
    found = _processes_of(uid)
    for _ in range(5):
        pids = _processes_of(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return len(found)


def remove_tree(path: str) -> None:
    """Remove ``path`` whole without recursing in Python (a 2,000-deep tree must not crash the grader)."""
    if os.path.lexists(path):
        with FORK_LOCK:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", path], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)


STALE_PREFIXES = ("kvkit-run-", "kvkit-sub-", "kvkit-zip-", "kvkit-probe-data-")


def temp_dir(prefix: str, parent: str | None = None) -> str:
    """A new temporary folder named ``<prefix><our pid>-...``, so that a later run can tell it is stale."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def sweep_stale(parent: str | None = None) -> None:
    """Remove the kit's temporary folders left by a grader that was killed (their pid, in the name, is gone)."""
    parent = parent or tempfile.gettempdir()
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        prefix = next((p for p in STALE_PREFIXES if name.startswith(p)), None)
        pid = name[len(prefix):].split("-")[0] if prefix else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            remove_tree(os.path.join(parent, name))
        except OSError:
            pass


def _own(path: str, uid: int | None) -> None:
    """Hand the working directory to the child's uid (the job folder stays the parent's, read-only)."""
    if uid is None:
        return
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            try:
                os.lchown(name, uid, uid)
            except OSError:
                pass


class _Channel:
    """The parent's ends of the two pipes, with a bounded, framed reader."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = bytearray()
        self.total = 0

    def next_frame(self, deadline: float):
        """``(obj, blob)``, or ``(None, why)`` at EOF, on the deadline, or for a malformed frame."""
        while True:
            try:
                obj, blob, rest = protocol.decode(self.buffer)
            except ValueError as exc:
                return None, f"malformed answer from the sandbox ({exc})"
            if obj is not None:
                consumed = len(self.buffer) - len(rest)
                if isinstance(rest, memoryview):
                    rest.release()
                del self.buffer[:consumed]
                return obj, blob
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            ready, _, _ = select.select([self.read_fd], [], [], min(left, 0.5))
            if not ready:
                continue
            data = os.read(self.read_fd, 1 << 20)
            if not data:
                return None, "eof"
            self.total += len(data)
            self.buffer += data  # a bytearray grows in place: reading a large frame stays linear

    def send(self, obj: dict, blob: bytes = b"", deadline: float | None = None) -> bool:
        """Write one frame before ``deadline`` (monotonic seconds): False when the zygote stopped reading
        (gone, or stopped by a task of its uid) or the deadline passed, so the session never waits on it."""
        view = memoryview(protocol.encode(obj, blob))
        os.set_blocking(self.write_fd, False)
        while view:
            left = (deadline - time.monotonic()) if deadline is not None else 1.0
            if left <= 0:
                return False
            try:
                _, ready, _ = select.select([], [self.write_fd], [], min(left, 0.5))
                if ready:
                    view = view[os.write(self.write_fd, view):]
            except BlockingIOError:
                continue
            except OSError:
                return False
        return True

    def close(self):
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _clip(value, depth: int = 0):
    """The child's JSON made safe to keep: strings cut, bounded depth."""
    if depth > 40:
        raise ValueError("an answer nested too deep")
    if isinstance(value, str):
        return value[:protocol.TEXT_LIMIT]
    if isinstance(value, list):
        return [_clip(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k)[:80]: _clip(v, depth + 1) for k, v in value.items()}
    return value


def _start(command: list[str], workdir: str, job: str, limits: Limits, isolation, group, fds: tuple,
           shared: list | None = None):
    """Popen the zygote (wrapped by the isolation), its output piped, the channel fds passed."""
    uid = isolation.child_uid() if isolation is not None else None
    namespaces = bool(getattr(isolation, "namespaces", False))
    if namespaces:
        command = isolation(command, workdir, uid, job=job, shared=shared or [],
                            tmpfs={"bytes": WORKDIR_BYTES, "inodes": WORKDIR_INODES})
    else:
        _own(workdir, uid)
    if uid is None and hasattr(os, "getuid") and os.getuid() != 0:
        # The child keeps our uid, and RLIMIT_NPROC counts every task of it: leave room for ours.
        limits = dataclasses.replace(limits, processes=limits.processes + len(_processes_of(os.getuid())) * 64)
    drop = uid if uid is not None and not namespaces else None  # inside the namespaces, their init drops it
    with FORK_LOCK:
        proc = subprocess.Popen(command, cwd=workdir, env=child_env(workdir), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_preexec(limits, group.join_fn() if group else None, drop),
                                start_new_session=True, close_fds=True, pass_fds=fds)
    return proc, uid, namespaces


def run_session(submission_dir: str, job: dict, job_files: dict, limits: Limits, isolation=None,
                shared: list | None = None, started: threading.Event | None = None,
                secrets: dict | None = None, serve=None, marks: dict | None = None) -> SessionResult:
    """Run ``job["tasks"]`` against the submission laid out in ``submission_dir``.

    ``job`` is the JSON spec the zygote reads; ``job_files`` maps extra file
    names of the job folder to their bytes (the trial inputs, the planted
    mistakes); ``shared`` are folders of the parent's the child may read
    (bound read-only: the probes' prefill inputs); ``started`` is set once
    the child is started (or could not be); ``secrets`` maps a task's name to
    what only that task's process may learn, handed over after its fork (the
    own-tests mode, "none" or "wrapped"); ``serve(task, call, blob) -> (reply, blob)`` answers a
    wrapped task's calls (relayed by the zygote; ``call`` and ``blob`` are the child's data, never run);
    ``marks`` maps a trials task's name to what its marks' goes carry, in order (a measured query that
    the task gets only at the mark before its attention).
    ``submission_dir`` is copied, never changed. Returns every
    task's :class:`TaskResult`; a session that ends early says why in
    ``reason`` and leaves the tasks it did not reach out of ``tasks``.
    """
    base = temp_dir("kvkit-run-")
    result = SessionResult()
    group = None
    if started is not None:
        started.clear()
    try:
        os.chmod(base, 0o755)
        job_dir, workdir = os.path.join(base, "job"), os.path.join(base, "work")
        os.mkdir(job_dir, 0o755)
        shutil.copytree(submission_dir, workdir, symlinks=True)
        for name in protocol.CHILD_FILES:
            src = os.path.join(CHILD_DIR, name)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(job_dir, name))
        for name, data in job_files.items():
            with open(os.path.join(job_dir, name), "wb") as f:
                f.write(data)
        with open(os.path.join(job_dir, protocol.JOB_SPEC), "w") as f:
            json.dump(job, f)
        if cgroup_mod.available():
            try:
                group = cgroup_mod.Cgroup(limits.memory_bytes, limits.processes)
            except OSError as exc:
                result.notes.append(f"no cgroup for this run ({exc}); memory is bounded by rlimits only")
        to_parent_r, to_parent_w = os.pipe()
        from_parent_r, from_parent_w = os.pipe()
        command = [sys.executable, "-I", "-S", "-B", os.path.join(job_dir, protocol.ZYGOTE), job_dir,
                   str(to_parent_w), str(from_parent_r), *site_dirs()]
        try:
            proc, uid, namespaces = _start(command, workdir, job_dir, limits, isolation, group,
                                           (to_parent_w, from_parent_r), shared or [])
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in (to_parent_r, to_parent_w, from_parent_r, from_parent_w):
                os.close(fd)
            result.reason = f"the sandbox could not start the child ({exc})"
            return result
        finally:
            if started is not None:
                started.set()
        os.close(to_parent_w)
        os.close(from_parent_r)
        channel = _Channel(to_parent_r, from_parent_w)
        drain = _Drain(proc.stdout)
        drain.start()
        watchdog = None
        if not namespaces:
            watchdog = _Watchdog(proc.pid, workdir)
            watchdog.start()
        try:
            _converse(channel, job, group, limits, result, secrets or {}, serve, marks or {})
        finally:
            channel.close()
            _killpg(proc.pid)
            if group is not None:
                result.memory_limit_hit = group.oom_killed()
                group.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            leftover = 0 if namespaces else reap_uid(uid)
            if leftover:
                result.notes.append(f"the child left {leftover} process(es) running; all were killed")
            if watchdog is not None:
                watchdog.done.set()
                watchdog.join(timeout=5)
                if watchdog.reason:
                    result.reason = watchdog.reason
            drain.join(timeout=5)
            result.output_tail, result.output_bytes = drain.text(), drain.total
            if result.output_bytes > FLOOD_NOTE:
                result.notes.append(f"the child wrote {result.output_bytes / 2**20:.1f} MiB to stdout/stderr "
                                    f"(the grader kept the last {OUTPUT_KEEP} characters)")
            if result.memory_limit_hit and not result.reason:
                result.notes.append(f"the sandbox's memory limit ({limits.memory_bytes // 2**20} MiB, shared "
                                    "memory and files included) was reached")
            if proc.returncode not in (0, None) and not result.reason and "end" not in result.tasks:
                if proc.returncode == 125 or "kvkit sandbox:" in result.output_tail:
                    line = next((ln for ln in result.output_tail.splitlines() if "kvkit sandbox:" in ln), "")
                    result.reason = f"the sandbox could not start the child ({line.strip()[:200]})"
        return result
    finally:
        if group is not None:
            group.close()
        remove_tree(base)


def _answer(event: str, obj: dict, blob: bytes, group, result: SessionResult, secrets: dict, serve):
    """``(frame, blob)`` the zygote waits for after ``event``, or None when the session must end
    (``result.reason`` says why)."""
    if event == "ready":
        result.tasks_started += 1
        if group is not None:
            group.reset_peak()
        return {"go": True}, b""
    name = str(obj.get("task", ""))[:80]
    if event == "secret":
        # A task's secret (its own-tests mode) goes to the zygote only after that task is forked.
        return {"secret": secrets.get(name, "")}, b""
    # A wrapped own-tests task's call, relayed: answered here, where its variant is kept.
    if name not in secrets or name in result.tasks:
        result.reason = "malformed answer from the sandbox (a call from no running own-tests task)"
        return None
    return serve(name, obj.get("call"), blob) if serve else ({"ok": False, "error": "no server"}, b"")


def _point(group, figures: dict, rss_before: int = 0) -> dict:
    """The kernel's figures at one of a task's marks (or its end): from the cgroup where there is one, else
    from the task's own /proc entries as the zygote read them (peak resident size since its last mark)."""
    if group is not None:
        cpu = group.cpu_seconds()
        return {"cpu_s": cpu if cpu is not None else figures.get("cpu_s"), "usage": group.usage(),
                "peak": group.peak()}
    kib = lambda key: None if figures.get(key) is None else int(figures[key]) * 1024 - rss_before  # noqa: E731
    return {"cpu_s": figures.get("cpu_s"), "usage": kib("rss_kib"),
            "peak": kib("hwm_kib") if figures.get("hwm_ok", True) else None}


def _converse(channel: _Channel, job: dict, group, limits: Limits, result: SessionResult, secrets: dict,
              serve=None, marks: dict | None = None) -> None:
    """The session's dialogue: ready -> (reset the high-water mark) go -> [mark -> go ...] -> done, per task."""
    deadline = time.monotonic() + limits.wall_s
    base_usage = None
    cpu_marks: dict = {}  # serial task -> the group's CPU seconds at its "ready"
    points: dict = {}  # task -> the kernel's figures at each of its marks
    sent: dict = {}  # task -> what it sent with each mark
    arming: dict = {}  # task -> the figures of its mark, until the zygote has its go ready
    marks = marks or {}
    known = {str(t.get("name")) for t in job["tasks"]}
    while True:
        obj, blob = channel.next_frame(deadline)
        if obj is None:
            why = blob
            if why == "timeout":
                result.reason = f"killed after {limits.wall_s:g} s of wall time (a hang or an endless loop?)"
            elif why == "eof":
                if len(result.tasks) < len(job["tasks"]):
                    result.reason = result.reason or "the sandbox ended before every task ran"
            else:
                result.reason = why
            return
        event = obj.get("ev")
        if event == "mark":
            # A trials task's measurement point: what it sent, then what its go carries (the zygote arms it).
            name = str(obj.get("task", ""))[:80]
            if name not in known or name in result.tasks or len(points.get(name, [])) > 64 or name in arming:
                result.reason = "malformed answer from the sandbox (a mark from no running task)"
                return
            taken = points.setdefault(name, [])
            figures = {k: obj.get(k) for k in ("cpu_s", "rss_kib", "hwm_kib")
                       if isinstance(obj.get(k), (int, float)) and not isinstance(obj.get(k), bool)}
            figures["hwm_ok"] = bool(taken[-1].get("reset")) if taken else False
            arming[name] = (figures, bool(obj.get("hwm_reset")))
            sent.setdefault(name, []).append(bytes(blob[:protocol.BLOB_LIMIT]))
            given = marks.get(name, [])
            blob_out = given[len(taken)] if len(taken) < len(given) else b""
            if not channel.send({"go": True}, blob_out, deadline=deadline):
                result.reason = "the sandbox stopped listening (or stopped reading before the session's deadline)"
                return
            continue
        if event == "armed":
            # The go is ready to be written: the kernel's figures now, a new peak period, then the go itself.
            name = str(obj.get("task", ""))[:80]
            if name not in arming:
                result.reason = "malformed answer from the sandbox (an armed mark that was never made)"
                return
            figures, reset = arming.pop(name)
            point = _point(group, figures)
            point["reset"] = reset
            if group is not None:
                group.reset_peak()
            points[name].append(point)
            if not channel.send({"deliver": True}, deadline=deadline):
                result.reason = "the sandbox stopped listening (or stopped reading before the session's deadline)"
                return
            continue
        if event in ("ready", "secret", "call"):
            # The zygote waits for an answer to each of these.
            reply = _answer(event, obj, blob, group, result, secrets, serve)
            if reply is None:
                return
            if event == "ready" and group is not None:
                # The baseline is the fresh sandbox's usage, before any task: memory an earlier task left
                # behind (shared memory, files in the tmpfs) counts against the next, never as a credit.
                base_usage = group.usage() if base_usage is None else base_usage
                # The group's CPU time at a serial task's start: what every process in the sandbox uses until
                # its "done" is the task's (a child it never waited for, or one the kernel reaped for it, too).
                cpu_marks[str(obj.get("task", ""))[:80]] = group.cpu_seconds()
            if not channel.send(*reply, deadline=deadline):
                result.reason = "the sandbox stopped listening (or stopped reading before the session's deadline)"
                return
        elif event == "done":
            name = str(obj.get("task", ""))[:80]
            if name not in known or name in result.tasks:
                # Only the job's tasks, once each: anything else is the sandbox misbehaving, and its
                # frames (up to 64 MiB each) are not kept.
                result.reason = "malformed answer from the sandbox (an unknown or repeated task)"
                return
            task = TaskResult(name=name, blob=blob, answer_error=str(obj.get("answer_error", ""))[:300],
                              exit=obj.get("exit"), signal=obj.get("signal"), stopped=str(obj.get("stopped") or ""),
                              wall_s=float(obj.get("wall_s") or 0.0), cpu_s=float(obj.get("cpu_s") or 0.0))
            try:
                task.answer = _clip(obj["answer"]) if isinstance(obj.get("answer"), dict) else None
            except (ValueError, RecursionError) as exc:
                task.answer, task.answer_error = None, str(exc)
            taken = points.get(name, [])
            task.sent = sent.get(name, [])
            if group is not None:
                task.memory_bytes, task.memory_source = max(group.peak() - (base_usage or 0), 0), "cgroup"
                start, now = cpu_marks.get(name), group.cpu_seconds()
                if start is not None and now is not None:
                    task.cpu_s = max(task.cpu_s, now - start)
                if taken:
                    end = _point(group, {})
                    task.points = [*taken, end]
                    # From the first mark on: what the module ran at import is not the calls' doing.
                    task.memory_bytes = max(max(p["peak"] for p in task.points[1:]) - (base_usage or 0), 0)
                    if end["cpu_s"] is not None and taken[0]["cpu_s"] is not None:
                        task.cpu_s = max(end["cpu_s"] - taken[0]["cpu_s"], 0.0)
            else:
                rss_before = int(obj.get("rss_before_kib") or 0) * 1024
                task.memory_bytes = max(int(obj.get("maxrss_kib") or 0) * 1024 - rss_before, 0)
                task.memory_source = "rss"
                if taken:
                    end = {"cpu_s": float(obj.get("cpu_s") or 0.0), "usage": None,
                           "peak": int(obj.get("maxrss_kib") or 0) * 1024 - rss_before if taken[-1]["reset"] else None}
                    less = lambda v: None if v is None else v - rss_before  # noqa: E731 - as the end's figures
                    task.points = [*({**p, "usage": less(p["usage"]), "peak": less(p["peak"])} for p in taken), end]
                    peaks = [p["peak"] for p in task.points[1:]]
                    if all(p is not None for p in peaks):
                        task.memory_bytes = max(max(peaks), 0)
                    if taken[0]["cpu_s"] is not None:
                        task.cpu_s = max(end["cpu_s"] - taken[0]["cpu_s"], 0.0)
            result.tasks[name] = task
        elif event == "end":
            stopped = [t.name for t in result.tasks.values() if t.stopped == "timeout"]
            if stopped and len(result.tasks) < len(job["tasks"]):
                result.reason = (f"{' and '.join(stopped)} did not finish in time; the tasks after "
                                 f"{'them' if len(stopped) > 1 else 'it'} were not run (a hang or an endless loop?)")
            return
        else:
            result.reason = "malformed answer from the sandbox (an unknown event)"
            return


def run_script(source: str, argv: list[str], isolation=None, limits: Limits | None = None):
    """Run a one-file probe script in the sandbox: ``(facts, result)``.

    The script gets ``sys.argv[1:] == argv + [fd]`` and writes one JSON object
    to the file descriptor ``fd``. Used to find out what the isolation really
    gives (``isolation.probe``).
    """
    limits = limits or Limits(wall_s=30, cpu_s=30)
    base = tempfile.mkdtemp(prefix="kvkit-probe-")
    group = None
    try:
        os.chmod(base, 0o755)
        job_dir, workdir = os.path.join(base, "job"), os.path.join(base, "work")
        os.mkdir(job_dir, 0o755)
        os.mkdir(workdir)
        with open(os.path.join(job_dir, "probe.py"), "w") as f:
            f.write(source)
        read_fd, write_fd = os.pipe()
        command = [sys.executable, "-I", "-S", "-B", os.path.join(job_dir, "probe.py"), *argv, str(write_fd)]
        result = SessionResult()
        try:
            proc, uid, namespaces = _start(command, workdir, job_dir, limits, isolation, None, (write_fd,))
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(read_fd)
            os.close(write_fd)
            result.reason = str(exc)
            return None, result
        os.close(write_fd)
        try:
            out, _ = proc.communicate(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            out, _ = proc.communicate()
        result.output_tail = (out or b"").decode("utf-8", "replace")[-OUTPUT_KEEP:]
        data = b""
        while True:
            ready, _, _ = select.select([read_fd], [], [], 0)
            chunk = os.read(read_fd, 65536) if ready else b""
            if not chunk:
                break
            data += chunk
        os.close(read_fd)
        reap_uid(uid)
        try:
            facts = json.loads(data) if data else None
        except ValueError:
            facts = None
        if facts is None and proc.returncode:
            result.reason = f"the probe exited with status {proc.returncode}"
        return facts if isinstance(facts, dict) else None, result
    finally:
        remove_tree(base)
