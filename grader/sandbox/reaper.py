"""The reaper: stopping a grading's workers and sandboxes from outside, and removing what they left.

What there is to stop. Each sandboxed session is a child process that starts
a session (process group) of its own, under a cgroup of its own named
kvkit-<pid>-<n> where the machine has cgroups, with temporary folders named
kvkit-<kind>-<pid>-... (launch.temp_dir), <pid> being the process that runs
the session: a --jobs worker, or the grader itself with --jobs 1. Sessions
run in threads, so nothing of that process can be frozen from inside it.

So, with --jobs N: the workers never act on SIGINT (a no-op handler: Ctrl-C
at a terminal reaches the whole foreground group, and a KeyboardInterrupt in
a worker would print a traceback). The grader notes it within 0.1 s, then
from outside: SIGSTOP each worker (no thread of it runs again: nothing new
starts), then, level by level until no new one appears, SIGSTOP everything
below them; SIGKILL each stopped process and each process group one of them
leads (the sandboxes' groups); when the workers are gone, remove their
cgroups and temporary folders by name. Nothing waits on a worker's
cooperation, so the stop takes a few hundred milliseconds.

With --jobs 1 the grader is its own worker: KeyboardInterrupt unwinds the
grading; the grader kills everything below itself the same way, lets its
session threads run their own clean-up (at most WORKER_GRACE_S), then
removes what is left of its own by name.
"""
from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

WORKER_GRACE_S = 1.0  # seconds a dying worker or session thread gets to clean up after itself


def processes() -> dict:
    """``{pid: (parent pid, process group)}`` of every process this one can see (Linux /proc; {} elsewhere)."""
    found = {}
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return found
    for name in names:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (command) ": state, ppid, pgrp
            found[int(name)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            pass
    return found


def kill_below(roots: set, with_roots: bool) -> None:
    """SIGKILL every process below ``roots`` (and ``roots`` too when ``with_roots``), frozen first with
    SIGSTOP so that none can start another in between, and every process group one of them leads."""
    def send(pid, sig):
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    if with_roots:
        for pid in roots:
            send(pid, signal.SIGSTOP)
    stopped, leaders = set(), set()
    for _ in range(100):  # one level of new descendants per round, at most
        table = processes()
        below, todo = set(), list(roots)
        while todo:
            parent = todo.pop()
            for pid, (ppid, _) in table.items():
                if ppid == parent and pid not in below:
                    below.add(pid)
                    todo.append(pid)
        leaders |= {pid for pid in below if table[pid][1] == pid}
        new = below - stopped
        if not new:
            break
        for pid in new:
            send(pid, signal.SIGSTOP)
        stopped |= new
    for pid in leaders - roots:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in stopped | (roots if with_roots else set()):
        send(pid, signal.SIGKILL)


def remove_cgroups(pids: set) -> None:
    """Remove the cgroups the processes ``pids`` made (``grader.sandbox.cgroup.remove_groups_of``)."""
    from grader.sandbox import cgroup

    cgroup.remove_groups_of(pids, WORKER_GRACE_S)


def remove_temp_folders(pids: set) -> None:
    """Remove the kit's temporary folders that the processes ``pids`` made (named by launch.temp_dir)."""
    from grader.sandbox import launch

    parents = {tempfile.gettempdir(), os.environ.get("KVKIT_PROBE_DATA") or "", "/dev/shm"} - {""}
    for parent in parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            prefix = next((p for p in launch.STALE_PREFIXES if name.startswith(p)), None)
            pid = name[len(prefix):].split("-")[0] if prefix else ""
            if pid.isdigit() and int(pid) in pids:
                launch.remove_tree(os.path.join(parent, name))


def stop_workers() -> None:
    """--jobs N: stop the pool's workers and everything they started, then remove what they left."""
    import multiprocessing

    workers = multiprocessing.active_children()  # the pool's workers: this process starts no other
    pids = {worker.pid for worker in workers}
    kill_below(pids, with_roots=True)
    # Every worker must be gone before its cgroups are listed: one still dying may finish a mkdir it had
    # under way, and a group made after the listing would be left behind.
    wait_for_all([worker.sentinel for worker in workers], WORKER_GRACE_S)
    remove_cgroups(pids)
    remove_temp_folders(pids)


def wait_for_all(sentinels: list, timeout_s: float) -> list:
    """Wait until every one of ``sentinels`` (process sentinels, connections) is ready or ``timeout_s``
    seconds have passed; return those still not ready. (``multiprocessing.connection.wait`` returns as soon
    as any one is ready.)"""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + timeout_s
    waiting = list(sentinels)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready = wait(waiting, timeout=left)
        waiting = [s for s in waiting if s not in ready]
    return waiting


def stop_own_sandboxes() -> None:
    """--jobs 1: the grading has unwound; its session threads are still running. Kill everything below
    this process, let the threads run their own clean-up, then remove what is left of ours."""
    threading.excepthook = lambda args: None  # a session thread may fail as its sandbox vanishes: we are leaving
    me = os.getpid()
    deadline = time.monotonic() + WORKER_GRACE_S
    while True:
        kill_below({me}, with_roots=False)  # again: a thread may have started a sandbox since
        busy = [t for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
        if not busy or time.monotonic() > deadline:
            break
        busy[0].join(timeout=0.05)
    remove_cgroups({me})
    remove_temp_folders({me})
