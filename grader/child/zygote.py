"""The sandbox's first process: trusted imports, then one forked process per task.

Run by path: ``python -I -S -B zygote.py JOBDIR TO_PARENT_FD FROM_PARENT_FD SITEDIR...`` with the working
directory holding the submission. It never imports or runs a submission file
itself, so what it reports (each task's exit status and the kernel's ``wait4``
figures: peak resident memory and CPU time) is the kernel's, not the
submission's. It is made non-dumpable, so a task process of the same uid can
neither trace it nor open its file descriptors.

For each task it sends ``{"ev": "ready"}`` and waits for the parent's go (the
parent resets the sandbox's memory high-water mark in between), forks, reads
the task's answer from a pipe of its own (bounded, with the task's timeout),
reaps it, and sends ``{"ev": "done", ...}`` with the answer. For a wrapped
own-tests task it also relays each call the task sends to the parent, and the
parent's reply back (``{"ev": "call", ...}``): the parent keeps the variant.
"""
from __future__ import annotations

import gc
import os
import select
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_sibling(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_kvkit_{name}", os.path.join(HERE, f"{name}.py"))
    sibling = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sibling
    spec.loader.exec_module(sibling)
    return sibling


protocol = _load_sibling("protocol")


def _rss_kib() -> int:
    """This process's resident set (VmRSS, KiB) from /proc, or 0 where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value: what a fresh process begins with


def _fixed_malloc() -> None:
    """Fix glibc's mmap threshold at its starting value, so that every task allocates the same way, whatever the
    zygote allocated and freed before its fork.

    glibc raises the threshold to the size of each large block freed (up to 32 MiB), and a forked task
    inherits it. Once the zygote had read one large answer (the hidden trials' outputs), the tasks forked
    after it took their K/V buffers from the heap, where calloc writes every page, and peaked about 1x the
    live K/V above the same code forked before it: the growth figure of an in-place cache read +0.9x in one
    run of four, and a decode with large temporaries cost up to 4x the CPU time in one reservation as in the
    other. Set explicitly, the threshold no longer moves (mallopt(3): M_MMAP_THRESHOLD), in the zygote or
    in a task: each large block is mapped when made and unmapped when freed."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD = -3
    except (OSError, AttributeError):
        pass  # not glibc: its allocator keeps no such state


def _non_dumpable() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        # PR_SET_CHILD_SUBREAPER = 36: what a task leaves behind becomes our child, so that we reap it and
        # add its CPU time to the task's (a child the task never waits for is counted all the same).
        libc.prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_orphans(grace_s: float = 0.5) -> tuple[float, int]:
    """Reap what a task left behind (its processes, killed by ``_sweep_leftovers``, come to us as subreaper):
    ``(their CPU seconds, how many)``. Only between serial tasks, when no other task is our child."""
    cpu, count = 0.0, 0
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return cpu, count
        if pid:
            cpu += usage.ru_utime + usage.ru_stime
            count += 1
        elif time.monotonic() > deadline:
            return cpu, count  # one still alive, out of reach (no PID namespace): not ours to wait for
        else:
            time.sleep(0.005)


FDS = {"to_parent": -1, "from_parent": -1}  # the channel's descriptors, from the command line


def _send(obj: dict, blob: bytes = b"") -> None:
    protocol.write_all(FDS["to_parent"], protocol.encode(obj, blob))


_INBOX = {"buffer": bytearray()}  # grows in place: a large frame is read in linear time


def _receive() -> dict:
    """The parent's next frame (``{"go": true}`` or ``{"secret": ...}``); the zygote ends if the parent is gone."""
    return _receive_frame()[0]


def _receive_frame():
    """``(obj, blob)`` of the parent's next frame; the zygote ends if the parent is gone."""
    while True:
        try:
            obj, blob, rest = protocol.decode(_INBOX["buffer"])
        except ValueError:
            os._exit(protocol.EXIT_PARENT_GONE)
        if obj is not None:
            _INBOX["buffer"] = bytearray(rest)
            return obj, blob
        try:
            data = os.read(FDS["from_parent"], 65536)
        except OSError:
            data = b""
        if not data:
            os._exit(protocol.EXIT_PARENT_GONE)
        _INBOX["buffer"] += data


def _wait_go() -> bool:
    return bool(_receive().get("go"))


def _hand_secret(task: dict, write_fd: int, lock=None) -> None:
    """Ask the parent for this task's secret (own tests: "none" or "wrapped") and pass it to the task's pipe only.

    The zygote learns it after the fork, so no task process inherits it. The
    variant itself never comes here: the parent keeps it and answers the
    wrapped task's calls (:class:`_Relay`).
    """
    if lock is not None:
        lock.acquire()
    try:
        _send({"ev": "secret", "task": task["name"]})
        secret = str(_receive().get("secret", ""))
    finally:
        if lock is not None:
            lock.release()
    try:
        protocol.write_all(write_fd, secret.encode())
    except OSError:
        pass
    _close_tracked(write_fd)


class _Relay:
    """Carries a wrapped own-tests task's calls to the parent and the parent's replies back, frame by frame.

    The zygote only checks the framing (bounded by the protocol's limits); the
    parent validates and answers. A malformed frame, or a task that does not
    take its reply before its deadline, ends the relay: the task's next call fails.
    """

    def __init__(self, task: str, call_fd: int, reply_fd: int, lock=None):
        self.task, self.call_fd, self.reply_fd, self.lock = task, call_fd, reply_fd, lock
        self.buffer = bytearray()  # grows in place: a large call is read in linear time

    def _read_more(self) -> bool:
        """Add what the task wrote to the buffer; False at its end (the pipe closed)."""
        try:
            data = os.read(self.call_fd, 1 << 20)
        except OSError:
            data = b""
        self.buffer += data
        return bool(data)

    def pump(self, deadline: float) -> bool:
        """Read what the task sent and relay every whole call in it; False once the relay has ended."""
        import contextlib

        if not self._read_more():
            return self.close()
        while True:
            try:
                call, blob, rest = protocol.decode(self.buffer)
            except ValueError:
                return self.close()
            if call is None:
                return True
            self.buffer = bytearray(rest)
            with (self.lock or contextlib.nullcontext()):
                _send({"ev": "call", "task": self.task, "call": call}, blob)
                reply, reply_blob = _receive_frame()
            if not _write_by(self.reply_fd, protocol.encode(reply, reply_blob), deadline):
                return self.close()

    def close(self) -> bool:
        for fd in (self.call_fd, self.reply_fd):
            if fd is not None:
                _close_tracked(fd)
        self.call_fd = self.reply_fd = None
        return False


def _write_by(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` to ``fd`` before ``deadline`` (the reader may never read); True when done."""
    view = memoryview(data)
    os.set_blocking(fd, False)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _, ready, _ = select.select([], [fd], [], min(left, 0.1))
        if ready:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except OSError:
                return False
    return True


def _read_answer(fd: int, pid: int, timeout: float, relay: _Relay | None = None):
    """``(answer bytes, why it was stopped, wait4 result or None)``.

    Reading ends when the task's own process has exited (its children may
    hold the pipe open: they are not waited for), on the timeout, or past the
    answer's size limit. Meanwhile ``relay`` carries the task's calls.
    """
    chunks, size, deadline = [], 0, time.monotonic() + timeout
    waited = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "timeout", waited
        watched = [fd] + ([relay.call_fd] if relay is not None and relay.call_fd is not None else [])
        ready, _, _ = select.select(watched, [], [], min(left, 0.1))
        if relay is not None and relay.call_fd is not None and relay.call_fd in ready:
            relay.pump(deadline)
        if fd in ready:
            data = os.read(fd, 1 << 20)
            if data:
                size += len(data)
                if size > protocol.ANSWER_LIMIT:
                    return b"", "oversized", waited
                chunks.append(data)
                continue
            if waited is not None:
                return b"".join(chunks), "", waited
        if waited is None:
            done_pid, status, usage = os.wait4(pid, os.WNOHANG)
            if done_pid:
                waited = (status, usage)
                os.set_blocking(fd, False)  # drain what it wrote before it ended, then stop
                try:
                    while True:
                        data = os.read(fd, 1 << 20)
                        if not data:
                            break
                        size += len(data)
                        if size > protocol.ANSWER_LIMIT:
                            return b"", "oversized", waited
                        chunks.append(data)
                except BlockingIOError:
                    pass
                return b"".join(chunks), "", waited


def _sweep_leftovers(pid: int) -> None:
    """Kill what a task left running: its process group; in our own PID namespace, every process we may signal."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() == 1 and os.getuid() != 0:  # PID 1 is the sandbox's init: kill(-1) stays inside
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass


_OPEN = set()  # the zygote's ends of every task's pipes: no task process may keep another task's
_FORKING = None  # a lock around pipe creation and fork (set in main when tasks run side by side)


def _close_tracked(fd: int) -> None:
    """Close one of the zygote's pipe ends and forget it, as one step between forks.

    Closing frees the descriptor's number for the next pipe another thread makes;
    were it still in ``_OPEN`` at that thread's fork, the new task process would
    close its own pipe (its answer, its mode or its calls lost).
    """
    import contextlib

    with (_FORKING or contextlib.nullcontext()):
        _OPEN.discard(fd)
        os.close(fd)


def _fork_task(task: dict, job: dict, tasks, lock=None):
    """Fork the task's process; ``(pid, read_fd, rss_kib, started, relay or None)``.

    A forked process inherits every descriptor, so each task process closes
    the pipes of all other tasks first: none can read, delay or write another's.
    An own-tests task also gets its secret's pipe and its two call pipes.
    """
    import contextlib

    with (_FORKING or contextlib.nullcontext()):
        read, write = os.pipe()
        own = bool(task.get("secret"))
        marked = task.get("kind") == "trials" and lock is None  # serial trials: measured between marks
        secret_read, secret_write = os.pipe() if own else (None, None)
        call_read, call_write = os.pipe() if own else (None, None)
        reply_read, reply_write = os.pipe() if own else (None, None)
        mark_read, mark_write = os.pipe() if marked else (None, None)
        go_read, go_write = os.pipe() if marked else (None, None)
        mine = {write, secret_read, call_write, reply_read, mark_write, go_read} - {None}
        theirs = {read, secret_write, call_read, reply_write, mark_read, go_write} - {None}
        rss = _rss_kib()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the task process: nothing of the zygote's channel or of other tasks survives into it
            try:
                for fd in (_OPEN | theirs) - mine:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                os.close(FDS["to_parent"])
                os.close(FDS["from_parent"])
                if own:
                    task = {**task, "secret_fd": secret_read, "call_fd": call_write, "reply_fd": reply_read}
                if marked:
                    task = {**task, "mark_fd": mark_write, "go_fd": go_read}
                os.setpgid(0, 0)
                tasks.serve(task, job, write)
            finally:
                os._exit(0)
        for fd in mine:
            os.close(fd)
        _OPEN.update(theirs)
    relay = None
    if own:
        _hand_secret(task, secret_write, lock)
        relay = _Relay(task["name"], call_read, reply_write, lock)
    if marked:
        relay = _Marks(task["name"], pid, mark_read, go_write)
    return pid, read, rss, started, relay


def run_task(task: dict, job: dict, tasks) -> str:
    """Run one task; return why it was stopped ("" when it ended by itself)."""
    pid, read, rss, started, relay = _fork_task(task, job, tasks)
    return _finish_task(task, pid, read, rss, started, relay=relay)


def _proc_figures(pid: int) -> dict:
    """The kernel's figures of task ``pid`` now: CPU seconds (its threads and the children it waited for),
    resident and peak resident KiB; then its peak is reset (clear_refs 5), where the kernel lets us."""
    figures = {"cpu_s": None, "rss_kib": None, "hwm_kib": None, "hwm_reset": False}
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        figures["cpu_s"] = sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks  # utime stime cutime cstime
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    figures["rss_kib" if line.startswith("VmRSS") else "hwm_kib"] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return figures
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        figures["hwm_reset"] = True
    except OSError:
        pass
    return figures


MARK_PAYLOAD_LIMIT = 4 * 2**20  # bytes a mark may send: the output of a probe's measured calls


class _Marks(_Relay):
    """A trials task's measurement points: each mark the task writes (``b"M"``, an 8-byte length, that many
    bytes of output) is relayed to the parent with the kernel's figures of the task, and the parent's go
    (and what it carries) is written back (``reply_fd``).
    """

    def __init__(self, task: str, pid: int, mark_fd: int, go_fd: int):
        super().__init__(task, mark_fd, go_fd)
        self.pid = pid

    def pump(self, deadline: float) -> bool:
        if not self._read_more():
            return self.close()
        while len(self.buffer) >= 9:
            size = int.from_bytes(self.buffer[1:9], "little")
            if self.buffer[:1] != b"M" or size > MARK_PAYLOAD_LIMIT:
                return self.close()
            if len(self.buffer) < 9 + size:
                return True
            payload = bytes(self.buffer[9:9 + size])
            del self.buffer[:9 + size]
            _send({"ev": "mark", "task": self.task, **_proc_figures(self.pid)}, payload)
            reply, blob = _receive_frame()
            go = len(blob).to_bytes(8, "little") + blob if reply.get("go") else b""
            del blob, payload
            # Armed: what this process holds to hand over is made now, before the parent takes its figures, and
            # writing it out allocates nothing, so the part that starts at the go holds nothing of ours.
            _send({"ev": "armed", "task": self.task})
            if not go or not _receive().get("deliver") or not _write_by(self.reply_fd, go, deadline):
                return self.close()
        return True


def run_parallel(group: list, job: dict, tasks, width: int) -> None:
    """Tasks that need no memory figure (the own tests), ``width`` at a time."""
    import threading

    global _FORKING
    pending = list(group)
    lock = threading.Lock()
    _FORKING = threading.Lock()

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                task = pending.pop(0)
            pid, read, rss, started, relay = _fork_task(task, job, tasks, lock)
            _finish_task(task, pid, read, rss, started, lock, relay)

    threads = [threading.Thread(target=worker) for _ in range(max(1, width))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _finish_task(task, pid, read, rss, started, lock=None, relay=None) -> str:
    answer, stopped, waited = _read_answer(read, pid, float(task.get("timeout", 60)), relay)
    if relay is not None:
        relay.close()
    if waited is None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        _, status, usage = os.wait4(pid, 0)
    else:
        status, usage = waited
    wall = time.monotonic() - started
    _close_tracked(read)
    left_cpu = 0.0
    if lock is None:
        _sweep_leftovers(pid)
        left_cpu, _ = _reap_orphans()
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    done = {"ev": "done", "task": task["name"], "stopped": stopped, "wall_s": wall,
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "rss_before_kib": rss, "maxrss_kib": int(usage.ru_maxrss),
            "cpu_s": float(usage.ru_utime + usage.ru_stime) + left_cpu}
    try:
        obj, blob, rest = protocol.decode(answer)
        if obj is None or rest:
            raise ValueError("an incomplete answer" if obj is None else "bytes after the answer")
        done["answer"] = obj
    except ValueError as exc:
        done["answer_error"] = str(exc)[:protocol.TEXT_LIMIT] if answer else "no answer"
        blob = b""
    if lock is None:
        _send(done, blob)
    else:
        with lock:
            _send(done, blob)
    return stopped


def _warm_pytest(job_dir: str, plugins: list) -> None:
    """Load pytest's plugins once, here, on a path that holds no test: each own-tests process
    forked afterwards starts warm (about a second saved per variant)."""
    import io

    saved, cwd = (sys.stdout, sys.stderr), os.getcwd()
    sys.stdout = sys.stderr = io.StringIO()
    try:
        # In the kit's job folder (no submission file there), with conftest files and ini files off:
        # nothing of the submission may run in this process, which every task is forked from.
        os.chdir(job_dir)
        sys.modules["pytest"].main(["-q", "-p", "no:cacheprovider", *plugins, "--noconftest", "-c", os.devnull, "--co",
                                    "--rootdir", job_dir, "--confcutdir", job_dir,
                                    os.path.join(job_dir, "no-tests-here.py")])
    except BaseException:  # noqa: BLE001 - a cold start is slower, not wrong
        pass
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(cwd)


def main(argv: list) -> int:
    import json

    _fixed_malloc()  # before anything large is allocated or freed here
    job_dir = os.path.abspath(argv[0])
    FDS["to_parent"], FDS["from_parent"] = int(argv[1]), int(argv[2])
    sys.path[:0] = list(argv[3:])  # site-packages only: the submission is not on the path here
    try:
        with open(os.path.join(job_dir, protocol.JOB_SPEC)) as f:
            job = json.load(f)
    except (OSError, ValueError):
        os._exit(protocol.EXIT_BAD_JOB)
    # Trusted code first: everything the tasks need, and every installed module the
    # submission names, is imported before any submission file can shadow it.
    for name in ["numpy"] + list(job.get("preimport", [])):
        if "__main__" in name.split("."):
            continue  # a module's __main__ runs a program on import (unittest.__main__ exits)
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - a module that fails (or exits) on import is the tasks' problem
            pass
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_num_threads(1)
        # Warm torch's lazy first-use costs here, once, so no task's memory figure carries them.
        (torch.ones(4, 4) @ torch.ones(4, 4)).softmax(-1).sum().item()
    import numpy

    (numpy.ones((4, 4)) @ numpy.ones((4, 4))).sum()
    try:
        # NumPy asks for huge pages for arrays of 4 MiB or more: the kernel then charges memory 2 MiB at a
        # time as pages are first written, which would blur what one call adds. Every task inherits this.
        numpy._core.multiarray._set_madvise_hugepage(False)
    except AttributeError:
        pass
    owntests = _load_sibling("run_own_tests") if any(t.get("kind") == "owntests" for t in job["tasks"]) else None
    if "pytest" in sys.modules:
        _warm_pytest(job_dir, owntests.plugin_args(job) if owntests else [])
    tasks = _load_sibling("tasks")
    tasks.prepare(job_dir, job)
    _non_dumpable()
    # What the zygote holds now lives as long as it does. Frozen, it is left out of every collection in the
    # tasks forked from here: a task's collections (pytest runs two per session) no longer walk, and by
    # writing to each object's header copy page by page, the whole inherited heap (CPython's gc.freeze,
    # meant for servers that fork).
    gc.collect()
    gc.freeze()
    serial = [t for t in job["tasks"] if not t.get("parallel")]
    parallel = [t for t in job["tasks"] if t.get("parallel")]
    timeouts = 0
    for task in serial:
        _send({"ev": "ready", "task": task["name"]})
        if not _wait_go():
            break
        if run_task(task, job, tasks) == "timeout":
            # One task past its time may be one slow probe (a cache copied on every append, at the probes'
            # sizes): the others still run. Code that hangs twice hangs again: the rest would only wait.
            timeouts += 1
            if timeouts == 2:
                break
    else:
        if parallel:
            _send({"ev": "ready", "task": "parallel"})
            if _wait_go():
                run_parallel(parallel, job, tasks, int(job.get("width", 2)))
    _send({"ev": "end"})
    os._exit(protocol.EXIT_OK)


if __name__ == "__main__":
    main(sys.argv[1:])
