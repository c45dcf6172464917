"""Bound and measure one sandboxed child process tree with a Linux control group.

A :class:`Cgroup` is a fresh, empty group (cgroup v2) or pair of groups (cgroup v1: one in the
``memory`` hierarchy, one in the ``pids`` hierarchy) with a memory limit in bytes and a limit
on the number of processes and threads.  A child joins it between fork and exec through
:meth:`Cgroup.join_fn` (pass it as ``preexec_fn`` to :class:`subprocess.Popen`); everything the
child later forks is born inside the same group(s), so the limits bound the whole tree.

What the memory numbers count is the kernel's own memory-cgroup accounting, not RSS: anonymous
memory, shared memory (shmem: memfd, SysV and POSIX shm), files in tmpfs, and page cache for
files the group read or wrote are all charged to the group whose task first touched the page,
and so count towards the limit, :meth:`Cgroup.usage` and :meth:`Cgroup.peak`.  Kernel memory
allocated on the group's behalf (page tables, much of the slab) is charged too on recent kernels.  A page touched first by another
group (say, page cache of the Python binary warmed by the parent) stays charged to that group.
Sources: the kernel documentation, Documentation/admin-guide/cgroup-v1/memory.rst,
Documentation/admin-guide/cgroup-v1/pids.rst and Documentation/admin-guide/cgroup-v2.rst.

Which version is used is detected, not assumed: cgroup v2 when a writable unified hierarchy
offers both the ``memory`` and ``pids`` controllers to a group we may create, else cgroup v1
with separate ``memory`` and ``pids`` hierarchies.  Groups are created under the cgroup this
process is in (from /proc/self/cgroup) when that works, else under the hierarchy's root, and are
named ``kvkit-<pid>-<counter>``.

Limits of the design: a child that runs as root can write itself out of the group (cgroup files
are not protected from root), so the sandbox should drop privileges as well.  A Cgroup object is
not thread-safe.  Only the standard library is used, and nothing from the rest of this project,
so the module can be loaded on its own.
"""
from __future__ import annotations

import errno
import itertools
import os
import signal
import threading
import time
from typing import Callable

__all__ = ["Cgroup", "available", "why_unavailable"]

_PROC_CGROUP = "/proc/self/cgroup"
_MOUNTINFO = "/proc/self/mountinfo"
# Used only when /proc/self/mountinfo cannot be read or names no such mount.
_FALLBACK_V2 = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
_FALLBACK_V1 = {"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"}

_counter = itertools.count(1)
_KILL_BUDGET_S = 2.0
_RMDIR_BUDGET_S = 1.0


# --------------------------------------------------------------------------- file helpers

def _read(path: str) -> str:
    with open(path, "r", encoding="ascii", errors="replace") as f:
        return f.read()


def _read_int(path: str) -> int:
    text = _read(path).strip()
    # pids.max and memory.max read "max" when unlimited.
    return -1 if text == "max" else int(text)


def _read_keyed(path: str) -> dict[str, int]:
    """Parse a flat-keyed file such as memory.events or memory.oom_control."""
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _write(path: str, value: str) -> None:
    """Write one value to a cgroup control file, naming the file in any error.

    One os.write per value, because the kernel parses each write(2) as one whole value."""
    data = value.encode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, f"cannot open cgroup file for writing: {e.strerror}", path) from None
    try:
        os.write(fd, data)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {value!r} to cgroup file: {e.strerror}",
                      path) from None
    finally:
        os.close(fd)


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) for every cgroup/cgroup2 mount."""
    found = []
    try:
        lines = _read(_MOUNTINFO).splitlines()
    except OSError:
        return found
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((rf[0], _unescape_mount(lf[3]), _unescape_mount(lf[4]),
                      set(rf[2].split(","))))
    return found


def _self_cgroups() -> tuple[str | None, dict[str, str]]:
    """(v2 path, {v1 controller: path}) of this process, from /proc/self/cgroup."""
    v2, v1 = None, {}
    try:
        lines = _read(_PROC_CGROUP).splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        else:
            for c in controllers.split(","):
                v1[c] = path
    return v2, v1


def _join_under(mount_point: str, mount_root: str, cg_path: str | None) -> str | None:
    """The directory of cgroup `cg_path` seen through a mount of its hierarchy, or None.

    Paths in /proc/self/cgroup are relative to the cgroup namespace root; a mount may expose
    only a subtree (mount root), and a process outside our namespace root shows as '/..'."""
    if not cg_path or not cg_path.startswith("/"):
        return None
    parts = [p for p in cg_path.split("/") if p]
    if ".." in parts:
        return None
    root_parts = [p for p in mount_root.split("/") if p]
    if parts[:len(root_parts)] != root_parts:
        return None
    path = os.path.join(mount_point, *parts[len(root_parts):])
    return path if os.path.isdir(path) else None


def _candidates(pairs: list[tuple[str, str]], cg_path: str | None) -> list[str]:
    """Parent directories to try, in order: our own cgroup first, then hierarchy roots."""
    out: list[str] = []
    for mount_point, mount_root in pairs:
        own = _join_under(mount_point, mount_root, cg_path)
        if own and own not in out:
            out.append(own)
    for mount_point, _ in pairs:
        if os.path.isdir(mount_point) and mount_point not in out:
            out.append(mount_point)
    return out


def _rmdir_tree(path: str) -> None:
    """Remove a cgroup directory and any groups the child made inside it, deepest first.

    cgroupfs directories hold only kernel-made control files, which rmdir(2) takes with them."""
    for dirpath, dirnames, _files in os.walk(path, topdown=False):
        for d in dirnames:
            try:
                os.rmdir(os.path.join(dirpath, d))
            except FileNotFoundError:
                pass
    os.rmdir(path)


def _describe(e: OSError) -> str:
    """An OSError as 'what went wrong: path', without nesting '[Errno n]' prefixes."""
    what = e.strerror or str(e)
    return f"{what}: {e.filename}" if e.filename else what


def _new_name() -> str:
    return f"kvkit-{os.getpid()}-{next(_counter)}"


# --------------------------------------------------------------------------- the group

class Cgroup:
    """One control group (v2) or pair of groups (v1) that bounds and measures a process tree.

    ``Cgroup(memory_bytes, max_pids)`` creates the group(s) and sets the limits:

    * memory: ``memory_bytes`` bytes, enforced by the kernel's memory controller on everything
      it charges to the group (anonymous memory, shmem/memfd, tmpfs files, page cache, kernel
      memory).  v1 writes memory.limit_in_bytes, and memory.memsw.limit_in_bytes to the same
      value when that file exists and accepts it (so swap cannot extend the limit); v2 writes
      memory.max, and memory.swap.max = 0 when present.  Going over the limit makes the kernel
      reclaim (drop page cache) and, failing that, OOM-kill a process in the group.
    * processes: ``max_pids`` tasks (processes and threads) via pids.max; fork() and
      clone() in the group fail with EAGAIN beyond it.

    Raises ``OSError`` naming the path when no group can be made here (anything made on the way
    is removed first), ``ValueError`` for non-positive limits.  Use it as a context manager, or
    call :meth:`close`, to kill what is left in the group and remove it.  Prefer one fresh
    Cgroup per sandboxed run: the peak and OOM counters then describe that run alone.

    Attributes: ``version`` (1 or 2) and ``paths``, the group directories (v1: memory group
    first, pids group second; v2: one directory).
    """

    version: int
    paths: tuple[str, ...]

    def __init__(self, memory_bytes: int, max_pids: int):
        if int(memory_bytes) <= 0 or int(max_pids) <= 0:
            raise ValueError(f"memory_bytes and max_pids must be positive, "
                             f"got {memory_bytes!r} and {max_pids!r}")
        self.memory_bytes = int(memory_bytes)
        self.max_pids = int(max_pids)
        self.paths = ()
        self._cpu_path: str | None = None
        self._closed = False
        self._owner_pid = os.getpid()
        self._peak_fd: int | None = None
        self._peak_mode = ""          # v2 only: "fd", "global" or "sample"
        self._peak_base = 0           # v2 "global": memory.peak when reset_peak() ran
        self._reset_usage = 0         # v2 "global"/"sample": usage when reset_peak() ran
        self._was_reset = False

        errors: list[str] = []
        last: OSError | None = None
        for version, make in ((2, self._make_v2), (1, self._make_v1)):
            try:
                self.paths = make()
                self.version = version
                break
            except OSError as e:
                errors.append(f"v{version}: {_describe(e)}")
                last = e
        else:
            raise OSError(last.errno if last and last.errno else errno.ENOENT,
                          "cannot create a memory+pids cgroup: " + "; ".join(errors))

        # CPU time of everything in the group, read by the parent: v2 keeps it in every group's cpu.stat;
        # v1 needs a cpuacct group of the same name, made where the hierarchy allows (else None: no figure).
        self._cpu_path = self.paths[0] if self.version == 2 else self._make_v1_cpuacct()
        self._procs_files = tuple(os.path.join(p, "cgroup.procs") for p in self.paths + self._extra_paths())
        if self.version == 2:
            self._setup_peak_v2()

    def _extra_paths(self) -> tuple[str, ...]:
        return (self._cpu_path,) if self.version == 1 and self._cpu_path else ()

    def _make_v1_cpuacct(self) -> str | None:
        _, own = _self_cgroups()
        pairs = [(mp, root) for fs, root, mp, opts in _mounts() if fs == "cgroup" and "cpuacct" in opts]
        name = os.path.basename(self.paths[0])
        for parent in _candidates(pairs, own.get("cpuacct")):
            path = os.path.join(parent, name)
            try:
                os.mkdir(path)
            except OSError:
                continue
            if os.path.exists(os.path.join(path, "cpuacct.usage")):
                return path
            _remove_quietly([path])
        return None

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by every process that has been in the group, reaped or not, or None when
        this group has no CPU figure (a v1 machine without a cpuacct hierarchy we may write)."""
        if not self._cpu_path:
            return None
        try:
            if self.version == 2:
                return _read_keyed(os.path.join(self._cpu_path, "cpu.stat"))["usage_usec"] / 1e6
            return _read_int(os.path.join(self._cpu_path, "cpuacct.usage")) / 1e9
        except (OSError, ValueError, KeyError):
            return None

    # ----------------------------------------------------------------- creation

    def _make_v2(self) -> tuple[str, ...]:
        pairs = [(mp, root) for fs, root, mp, _ in _mounts() if fs == "cgroup2"]
        if not pairs:
            pairs = [(p, "/") for p in _FALLBACK_V2
                     if os.path.exists(os.path.join(p, "cgroup.controllers"))]
        if not pairs:
            raise OSError(errno.ENOENT, "no cgroup2 (unified) hierarchy is mounted")
        own, _ = _self_cgroups()
        reasons = []
        for parent in _candidates(pairs, own):
            try:
                return (self._make_v2_under(parent),)
            except OSError as e:
                reasons.append(_describe(e))
        raise OSError(errno.EACCES, "; ".join(reasons) or "no cgroup2 parent directory found")

    def _make_v2_under(self, parent: str) -> str:
        try:
            have = set(_read(os.path.join(parent, "cgroup.controllers")).split())
        except OSError as e:
            raise OSError(e.errno, f"cannot read controllers: {e.strerror}", parent) from None
        missing = {"memory", "pids"} - have
        if missing:
            raise OSError(errno.ENOTSUP, f"controllers {', '.join(sorted(missing))} "
                          f"not available", parent)
        enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
        for c in ("memory", "pids"):
            if c not in enabled:
                # Fails with EBUSY in a non-root group that holds processes (the "no internal
                # processes" rule of cgroup-v2.rst), which is why we also try the root.
                _write(os.path.join(parent, "cgroup.subtree_control"), "+" + c)
        path = self._mkdir_fresh([parent])[0]
        try:
            for f in ("memory.max", "pids.max"):
                if not os.path.exists(os.path.join(path, f)):
                    raise OSError(errno.ENOTSUP, f"new group lacks {f}", path)
            _write(os.path.join(path, "memory.max"), str(self.memory_bytes))
            swap = os.path.join(path, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
            _write(os.path.join(path, "pids.max"), str(self.max_pids))
        except BaseException:
            _remove_quietly([path])
            raise
        return path

    def _make_v1(self) -> tuple[str, ...]:
        mounts = _mounts()
        _, own = _self_cgroups()
        parents = []
        for controller in ("memory", "pids"):
            pairs = [(mp, root) for fs, root, mp, opts in mounts
                     if fs == "cgroup" and controller in opts]
            if not pairs and os.path.isdir(_FALLBACK_V1[controller]):
                pairs = [(_FALLBACK_V1[controller], "/")]
            if not pairs:
                raise OSError(errno.ENOENT, f"no cgroup v1 {controller} hierarchy is mounted")
            cands = _candidates(pairs, own.get(controller))
            if not cands:
                raise OSError(errno.ENOENT, f"no directory for the v1 {controller} hierarchy",
                              pairs[0][0])
            parents.append(cands)
        reasons = []
        # Own cgroup first in both hierarchies, so the container's own limits still apply.
        for mem_parent in parents[0]:
            for pids_parent in parents[1]:
                try:
                    return self._make_v1_under(mem_parent, pids_parent)
                except OSError as e:
                    reasons.append(_describe(e))
        raise OSError(errno.EACCES, "; ".join(reasons))

    def _make_v1_under(self, mem_parent: str, pids_parent: str) -> tuple[str, str]:
        mem, pids = self._mkdir_fresh([mem_parent, pids_parent])
        try:
            if not os.path.exists(os.path.join(mem, "memory.limit_in_bytes")):
                raise OSError(errno.ENOTSUP, "new group lacks memory.limit_in_bytes", mem)
            if not os.path.exists(os.path.join(pids, "pids.max")):
                raise OSError(errno.ENOTSUP, "new group lacks pids.max", pids)
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(self.memory_bytes))
            # memsw must be >= the memory limit, hence set after it; absent when the kernel
            # does not account swap, refused when swap accounting is off: both harmless here.
            try:
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(self.memory_bytes))
            except OSError:
                pass
            # v1 copies oom_kill_disable from the parent; with it set, a child over the limit
            # would hang in the OOM handler instead of being killed.
            try:
                _write(os.path.join(mem, "memory.oom_control"), "0")
            except OSError:
                pass
            _write(os.path.join(pids, "pids.max"), str(self.max_pids))
        except BaseException:
            _remove_quietly([mem, pids])
            raise
        return mem, pids

    @staticmethod
    def _mkdir_fresh(parents: list[str]) -> list[str]:
        """mkdir one same-named group under each parent; a name left by a reused pid is skipped."""
        for _ in range(100):
            name = _new_name()
            made: list[str] = []
            try:
                for parent in parents:
                    path = os.path.join(parent, name)
                    try:
                        os.mkdir(path)
                    except OSError as e:
                        raise OSError(e.errno, f"cannot create cgroup: {e.strerror}",
                                      path) from None
                    made.append(path)
                return made
            except OSError as e:
                _remove_quietly(made)
                if e.errno != errno.EEXIST:
                    raise
        raise OSError(errno.EEXIST, "cannot find a free cgroup name", parents[0])

    def _setup_peak_v2(self) -> None:
        path = os.path.join(self.paths[0], "memory.peak")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            fd = None
        if fd is not None:
            try:
                # Since 6.12 a write registers this open file for a private peak, reset now.
                os.write(fd, b"0")
                self._peak_fd = fd
                self._peak_mode = "fd"
                return
            except OSError:
                os.close(fd)
        self._peak_mode = "global" if os.path.exists(path) else "sample"

    # ----------------------------------------------------------------- joining

    def join_fn(self) -> Callable[[], None]:
        """A no-argument function that moves the calling process into the group(s).

        Meant for ``subprocess.Popen(..., preexec_fn=cg.join_fn())``: it runs in the child after
        fork and before exec, writes ``os.getpid()`` to each group's cgroup.procs with
        os.open/os.write/os.close only, and holds no reference to this object.  If a write
        fails it raises OSError, so Popen fails (SubprocessError) rather than starting a child
        that is not bounded.  Everything the child forks afterwards is born in the group(s)."""
        files = tuple(os.fsencode(p) for p in self._procs_files)
        flags = os.O_WRONLY | os.O_CLOEXEC
        getpid, open_, write, close = os.getpid, os.open, os.write, os.close

        def join() -> None:
            pid = b"%d" % getpid()
            for f in files:
                fd = open_(f, flags)
                try:
                    write(fd, pid)
                finally:
                    close(fd)

        return join

    # ----------------------------------------------------------------- measuring

    def usage(self) -> int:
        """Memory charged to the group now, in bytes (v1 memory.usage_in_bytes, v2
        memory.current): anonymous memory, shmem/tmpfs/memfd and page cache included.

        v1 documents usage_in_bytes as slightly fuzzy (per-CPU charge batching)."""
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return _read_int(os.path.join(self.paths[0], name))

    def reset_peak(self) -> None:
        """Start a new peak period: :meth:`peak` afterwards reports the highest memory use,
        in bytes, from this call on (starting from the current usage).

        v1 writes "0" to memory.max_usage_in_bytes (and memory.memsw.max_usage_in_bytes).
        v2 writes to memory.peak through a file descriptor this object keeps open, which gives
        that descriptor a private peak (kernel >= 6.12).  On older v2 kernels memory.peak
        cannot be reset: then the peak after a reset is exact only when it exceeds the peak
        seen before the reset; otherwise it is estimated as the largest of the usage at reset
        time and the usages sampled by later peak() calls, which misses a short spike from a
        child that has already exited.  A fresh Cgroup per run avoids this weakness."""
        mem = self.paths[0]
        if self.version == 1:
            _write(os.path.join(mem, "memory.max_usage_in_bytes"), "0")
            try:
                _write(os.path.join(mem, "memory.memsw.max_usage_in_bytes"), "0")
            except OSError:
                pass
            return
        if self._peak_mode == "fd":
            try:
                os.write(self._peak_fd, b"0")
                return
            except OSError:
                os.close(self._peak_fd)
                self._peak_fd = None
                self._peak_mode = "global"
        if self._peak_mode == "global":
            self._peak_base = _read_int(os.path.join(mem, "memory.peak"))
        self._reset_usage = self.usage()
        self._was_reset = True

    def peak(self) -> int:
        """Highest memory use of the group, in bytes, since the last :meth:`reset_peak` (or
        since creation): v1 memory.max_usage_in_bytes, v2 memory.peak.  Counts the same
        memory as :meth:`usage`.  See :meth:`reset_peak` for the v2 fallback on old kernels."""
        mem = self.paths[0]
        if self.version == 1:
            return _read_int(os.path.join(mem, "memory.max_usage_in_bytes"))
        if self._peak_mode == "fd":
            try:
                return int(os.pread(self._peak_fd, 64, 0).decode("ascii").strip())
            except OSError:
                os.lseek(self._peak_fd, 0, os.SEEK_SET)
                return int(os.read(self._peak_fd, 64).decode("ascii").strip())
        if self._peak_mode == "global":
            p = _read_int(os.path.join(mem, "memory.peak"))
            # A global peak that grew since the reset was reached after it, so it is exact.
            if not self._was_reset or p > self._peak_base:
                return p
        self._reset_usage = max(self._reset_usage, self.usage())
        return self._reset_usage

    def oom_killed(self) -> bool:
        """True when the group's memory limit was hit at least once since creation.

        v1: memory.failcnt (or memory.memsw.failcnt) > 0, or the "oom_kill" count in
        memory.oom_control > 0.  v2: the "max", "oom", "oom_kill" or "oom_group_kill" counts in
        memory.events > 0.  Hitting the limit usually means a process was OOM-killed, but
        failcnt and "max" also count hits that reclaim (dropping page cache) resolved, so a
        child that only streams large files through the page cache can make this True too."""
        mem = self.paths[0]
        try:
            if self.version == 2:
                ev = _read_keyed(os.path.join(mem, "memory.events"))
                return any(ev.get(k, 0) > 0 for k in ("max", "oom", "oom_kill", "oom_group_kill"))
            for f in ("memory.failcnt", "memory.memsw.failcnt"):
                try:
                    if _read_int(os.path.join(mem, f)) > 0:
                        return True
                except (OSError, ValueError):
                    pass
            return _read_keyed(os.path.join(mem, "memory.oom_control")).get("oom_kill", 0) > 0
        except (OSError, ValueError):
            return False

    def pids_peak_or_current(self) -> int:
        """Number of tasks (processes and threads) in the group: pids.peak, the most there
        ever were, where the kernel has it (6.1+, v1 and v2), else pids.current; 0 if neither
        can be read.  Best effort."""
        pids = self.paths[-1]
        for f in ("pids.peak", "pids.current"):
            try:
                return _read_int(os.path.join(pids, f))
            except (OSError, ValueError):
                continue
        return 0

    # ----------------------------------------------------------------- ending

    def _members(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths + self._extra_paths():
            # Include groups a (root) child may have made inside ours.
            for dirpath, _dirs, _files in os.walk(path):
                try:
                    found.update(int(x) for x in _read(os.path.join(dirpath, "cgroup.procs")).split())
                except (OSError, ValueError):
                    pass
        found.discard(os.getpid())   # never kill ourselves, even if joined by mistake
        return found

    def kill_all(self) -> None:
        """SIGKILL every process in the group(s), again and again until none is left or about
        2 s have passed (a process may fork between reading cgroup.procs and the kill).
        v2 first writes "1" to cgroup.kill where present (5.14+), which kills the whole
        subtree at once.  Exited but unreaped children (zombies) are not listed."""
        if not self.paths:
            return
        if self.version == 2:
            try:
                _write(os.path.join(self.paths[0], "cgroup.kill"), "1")
            except OSError:
                pass
        deadline = time.monotonic() + _KILL_BUDGET_S
        while True:
            members = self._members()
            if not members:
                return
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def close(self) -> None:
        """Kill what is left in the group(s), then remove the group directories (retrying
        briefly while the kernel still reports them busy).  Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            self.kill_all()
        except Exception:
            pass
        if self._peak_fd is not None:
            try:
                os.close(self._peak_fd)
            except OSError:
                pass
            self._peak_fd = None
        _remove_quietly(list(self.paths + self._extra_paths()), kill=self)

    def __enter__(self) -> "Cgroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Only in the creating process: a forked copy must not tear down the parent's group.
        try:
            if not self._closed and self._owner_pid == os.getpid():
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        v = getattr(self, "version", "?")
        return f"<Cgroup v{v} {', '.join(self.paths)}{' closed' if self._closed else ''}>"


def _remove_quietly(paths: list[str], kill: Cgroup | None = None) -> None:
    deadline = time.monotonic() + _RMDIR_BUDGET_S
    for path in paths:
        while True:
            try:
                _rmdir_tree(path)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                # EBUSY: tasks still exiting (their charges drop at exit); retry shortly.
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                    break
                if kill is not None:
                    try:
                        kill.kill_all()
                    except Exception:
                        pass
                time.sleep(0.02)
            except Exception:
                break


# --------------------------------------------------------------------------- probing

_probe_lock = threading.Lock()
_probe: tuple[str | None, str] | None = None


def _run_probe() -> tuple[str | None, str]:
    try:
        cg = Cgroup(memory_bytes=256 * 2**20, max_pids=64)
    except OSError as e:
        return None, _describe(e)
    except ValueError as e:
        return None, str(e)
    paths, version = cg.paths, cg.version
    cg.close()
    left = [p for p in paths if os.path.exists(p)]
    if left:
        return None, f"created a v{version} cgroup but could not remove {', '.join(left)}"
    return f"v{version}", ""


def available() -> str | None:
    """ "v2" or "v1" when a memory+pids cgroup can be created and removed here, else None.

    Probes once per process (creating and removing a real group) and caches the answer."""
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = _run_probe()
        return _probe[0]


def why_unavailable() -> str:
    """A short human-readable reason when :func:`available` is None, "" otherwise."""
    available()
    assert _probe is not None
    return _probe[1]


def remove_groups_of(pids: set, grace_s: float = 1.0) -> None:
    """Remove the cgroups (``kvkit-<pid>-<n>``) that the processes ``pids`` made, killing whatever is still in
    them: for a grader stopped part-way (Ctrl-C), whose workers were killed before they could clean up.
    They sit under this process's own cgroup or a hierarchy's root, as ``create`` puts them."""
    import re

    v2, v1 = _self_cgroups()
    parents = []
    for fstype, root, mount_point, options in _mounts():
        own = v2 if fstype == "cgroup2" else next((v1[c] for c in ("memory", "pids", "cpuacct")
                                                   if c in options and c in v1), None)
        parents += _candidates([(mount_point, root)], own)
    def ours() -> list[str]:
        found = []
        for parent in dict.fromkeys(parents):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                match = re.fullmatch(r"kvkit-(\d+)-\d+", name)
                if match and int(match[1]) in pids:
                    found.append(os.path.join(parent, name))
        return found

    def kill_members(path: str) -> None:
        for folder, _, _ in os.walk(path):
            try:
                with open(os.path.join(folder, "cgroup.procs")) as f:
                    members = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                members = []
            for pid in members:
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass

    # Every group's processes are killed at once, then the groups are removed as they empty; the listing is
    # repeated until one finds nothing, so that a group whose removal failed once is tried again.
    deadline = time.monotonic() + grace_s
    while True:
        groups = ours()
        if not groups:
            return
        for path in groups:
            kill_members(path)
        for path in groups:
            try:
                _rmdir_tree(path)
            except OSError:  # EBUSY: its last processes are still exiting; tried again on the next round
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
