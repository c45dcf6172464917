"""Runs first in every sandboxed child: an audit hook, then the real script.

``python -I -S guard.py CONFIG.json SCRIPT ARGS...`` installs a ``sys.audit``
hook (PEP 578) and runs SCRIPT as ``__main__``. Self-contained (standard
library only) because the kit's own directories may not be visible in the
child. The hook is a layer, not the wall: code that reaches C (``ctypes``) can
step around it, which is why the kernel layers (namespaces, a dropped uid,
rlimits) sit underneath. What it adds is evidence and a first refusal:

* blocked (raises PermissionError): network sockets and name lookups; starting
  processes (fork, exec, spawn, ``subprocess``, ``os.system``); signals to other
  processes; writing, creating, renaming or deleting anything outside the
  working directory; reading outside an allowlist (the interpreter, the
  site-packages it was given, system libraries, the working directory), so the
  kit's ``solutions/``, ``grader/`` and trials are refused even where no
  namespace hides them;
* blocked too: any change (write, create, remove, rename, link, FIFO) under
  the job folder (``.kvkit``) while the submission's code is on the stack: only
  the harness writes the answers the parent reads;
* seen (logged, for the parent to judge): the tools of tampering when the
  submission's own code uses them directly (``ctypes``, frame and object
  walking with ``sys._getframe``/``inspect``/``gc``, tracing hooks, building
  code objects, ``exec``/``eval`` of strings, a fresh ``_posixsubprocess``).

Every decision is appended as one JSON line to the log named in CONFIG
(``{"n": seq, "a": "blocked"|"seen"|"end", "e": event, "d": detail, "w":
"file:line"}``); the parent reads it after the child has ended. "seen" lines
have a budget of their own that "blocked" ones cannot use up; every write
checks that the log's descriptor is still the log (else the child ends with
status 97); the last line, ``"a": "end"``, is written only when the script
ends normally: it returns, or calls ``os._exit(0)`` with none of the
submission's code on the stack (or ``sys.audit("kvkit.guard.close")``).
After the script, the guard ends the process itself with ``os._exit``: no
atexit handler, finalizer or ``__del__`` of the submission runs.
"""
from __future__ import annotations

import _thread
import json
import os
import stat
import sys
import traceback

BLOCKED_LIMIT = 100  # lines of "blocked" events
SEEN_LIMIT = 300  # lines of "seen" events (the last one says the budget ran out)
LOG_BROKEN = 97  # exit status when the log's descriptor was closed or replaced
CLOSE_EVENT = "kvkit.guard.close"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
NETWORK = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
           "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
           "socket.sethostname", "urllib.Request", "http.client.connect", "ftplib.connect",
           "smtplib.connect", "telnetlib.Telnet.open", "poplib.connect", "imaplib.open"}
SPAWN = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
         "pty.spawn", "os.startfile", "os.killpg", "os.register_at_fork"}
# event -> indexes of the arguments that are paths it creates, changes or removes
MODIFY = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (1,),
          "os.symlink": (1,), "os.chmod": (0,), "os.lchmod": (0,), "os.chown": (0,), "os.lchown": (0,),
          "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.mkfifo": (0,),
          "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
          "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,), "shutil.copytree": (1,),
          "shutil.move": (0, 1), "shutil.chown": (0,), "shutil.unpack_archive": (1,),
          "shutil.make_archive": (0,), "tempfile.mkstemp": (0,), "tempfile.mkdtemp": (0,)}
# paths (sources too) that must not reach into the job folder from the submission's code
JOB_PATHS = {"os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (0, 1), "shutil.copyfile": (0, 1),
             "shutil.copytree": (0, 1), "shutil.move": (0, 1)}
# the dir_fd arguments of those events: a path relative to an unknown directory cannot be checked
DIR_FD = {"os.remove": (1,), "os.rmdir": (1,), "os.mkdir": (2,), "os.rename": (2, 3), "os.link": (2, 3),
          "os.symlink": (2,), "os.chmod": (2,), "os.chown": (3,), "os.mkfifo": (2,), "os.mknod": (3,)}
LISTING = {"os.listdir": 0, "os.scandir": 0, "glob.glob": 0, "glob.glob/2": 2, "os.listxattr": 0}
# The tools of tampering, judged by the frame that uses them (see ``_culprit``).
SEEN_ANY_DEPTH = {"sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                  "sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile",
                  "code.__new__", "function.__new__", "sys.addaudithook", "cpython.PyInterpreterState_Clear"}
SEEN_DIRECT = {"exec", "compile", "marshal.loads", "marshal.load"}


class Guard:
    """The hook's state: the allowlist, the log, and who counts as the submission."""

    def __init__(self, cfg: dict):
        self.workdir = os.path.realpath(cfg["workdir"])
        self.rules = sorted([(os.path.realpath(p), True) for p in cfg.get("allow_read", [])]
                            + [(os.path.realpath(p), False) for p in cfg.get("deny_read", [])],
                            key=lambda r: len(r[0]), reverse=True)
        self.stdlib = tuple(os.path.realpath(p) + os.sep for p in cfg.get("stdlib", []))
        self.library = tuple(os.path.realpath(p) + os.sep for p in cfg.get("library", []))
        self.protected = {os.path.realpath(p) for p in cfg.get("protected", [])}
        self.job = os.path.realpath(cfg.get("job") or os.path.dirname(cfg["log"]))
        self.write_ok = {"/dev/null"}
        self.fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        st = os.fstat(self.fd)
        self.log_id = (st.st_dev, st.st_ino)
        self.seq = 0
        self.counts = {"blocked": 0, "seen": 0}
        self.logged = set()
        self.busy = set()  # threads inside the hook (per thread: one busy thread must not blind the others)
        self.closed = False
        self.pid = os.getpid()

    # ---------------------------------------------------------------- helpers

    def log(self, action: str, event: str, detail: str, where: str = "") -> None:
        key = (action, event, detail[:60] if action == "blocked" else "", where)
        if key in self.logged:
            return
        limit = BLOCKED_LIMIT if action == "blocked" else SEEN_LIMIT
        used = self.counts.get(action, 0)
        if used >= limit:
            return
        self.logged.add(key)
        self.counts[action] = used + 1
        if action == "seen" and used + 1 == limit:
            event, detail, where = "guard log: the budget of seen events ran out", "", ""
        self.write({"a": action, "e": event, "d": detail[:200], "w": where})

    def write(self, entry: dict) -> None:
        """Append one line, or end the child if the log's descriptor is no longer the log."""
        self.seq += 1
        line = json.dumps({"n": self.seq, **entry}) + "\n"
        try:
            st = os.fstat(self.fd)
            flags = _fcntl_flags(self.fd)
            if (st.st_dev, st.st_ino) != self.log_id or not stat.S_ISREG(st.st_mode) \
                    or flags & os.O_ACCMODE != os.O_WRONLY or not flags & os.O_APPEND:
                raise OSError("the guard's log was replaced")
            os.write(self.fd, line.encode("utf-8", "replace"))
        except OSError:
            try:
                os.write(2, b"kvkit sandbox: the guard's log was closed or replaced\n")
            finally:
                _REAL_EXIT(LOG_BROKEN)

    def close(self) -> None:
        """The closing line: the script reached its normal end."""
        if not self.closed:
            self.closed = True
            self.write({"a": "end", "e": "", "d": "", "w": ""})

    def from_submission(self, frame) -> bool:
        """Is any of the submission's code on this stack (however deep)?"""
        while frame is not None:
            if self.kind(frame.f_code.co_filename) == "submission":
                return True
            frame = frame.f_back
        return False

    def in_job(self, full) -> bool:
        return full is not None and (full == self.job or full.startswith(self.job + os.sep))

    def guard_job(self, event: str, full) -> None:
        """Refuse a change under the job folder when the submission's code is on the stack."""
        if self.in_job(full) and self.from_submission(_caller()):
            self.refuse(event, "changing the sandbox's job folder", full)

    def refuse(self, event: str, what: str, detail: str):
        where = self.blame(_caller())
        self.log("blocked", event, f"{what}: {detail}", where)
        raise PermissionError(f"kvkit sandbox: {what} is not allowed ({detail})")

    @staticmethod
    def where(frame) -> str:
        while frame is not None and (frame.f_code.co_filename.startswith("<frozen")):
            frame = frame.f_back
        if frame is None:
            return ""
        return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"

    def blame(self, frame) -> str:
        """``file:line`` of the submission's frame on the stack, else of the innermost frame."""
        first = frame
        while frame is not None:
            if self.kind(frame.f_code.co_filename) == "submission":
                return self.where(frame)
            frame = frame.f_back
        return self.where(first)

    def kind(self, filename: str) -> str:
        """stdlib, library (site-packages, the kit's own harness) or submission."""
        if filename.startswith("<frozen") or filename.startswith(self.stdlib):
            return "stdlib"
        if filename.startswith(self.library):
            return "library"
        return "submission"

    def culprit(self, frame, skip_stdlib: bool):
        """The first frame that is not the standard library (or the first frame): the submission's?"""
        while frame is not None:
            k = self.kind(frame.f_code.co_filename)
            if k != "stdlib" or not skip_stdlib:
                return frame if k == "submission" else None
            frame = frame.f_back
        return None

    def path(self, value):
        if isinstance(value, int) or value is None:
            return None
        try:
            value = os.fsdecode(os.fspath(value))
        except TypeError:
            return None
        try:
            return os.path.realpath(os.path.join(os.getcwd(), value))
        except OSError:  # no working directory left: place the path nowhere the child may go
            return "/nonexistent/" + value.lstrip("/")

    def fd_path(self, fd: int):
        """Where descriptor ``fd`` points (None for the guard's log or what cannot be told)."""
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self.log_id:
                return None
            return os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))
        except (OSError, ValueError):
            return None

    def inside(self, path: str) -> bool:
        return path == self.workdir or path.startswith(self.workdir + os.sep) or path in self.write_ok

    def readable(self, path: str):
        """True (allowlisted), None (not on the list) or False (explicitly denied: the kit's own files)."""
        if path.startswith("/proc/"):
            part = path.split("/")[2]
            return not part.isdigit() or int(part) == os.getpid() or None
        for root, allowed in self.rules:
            if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
                return allowed
        return None

    def refuse_read(self, event: str, what: str, path: str, verdict) -> None:
        if verdict is False:
            # Reaching for the kit's own files (the reference, the grader) is itself evidence.
            frame = self.culprit(_caller(), skip_stdlib=True)
            if frame is not None:
                self.log("seen", "kit access", path, self.where(frame))
        self.refuse(event, what, path)

    # ---------------------------------------------------------------- the hook

    def __call__(self, event: str, args: tuple) -> None:
        me = _thread.get_ident()
        if me in self.busy:
            return
        self.busy.add(me)
        try:
            self.check(event, args)
        finally:
            self.busy.discard(me)

    def check(self, event, args):
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            full = self.path(path)
            if full is None:
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & WRITE_FLAGS)
            if mode is None and not os.path.isabs(os.fsdecode(os.fspath(path))):
                # os.open(..., dir_fd=...) reports the path alone: refuse what cannot be placed
                self.refuse(event, "os.open with a relative path", str(path))
            if writes and full in self.protected:
                self.refuse(event, "changing the sandbox's own files", full)
            if writes:
                self.guard_job(event, full)
            if writes and not self.inside(full):
                self.refuse(event, "writing outside the working directory", full)
            verdict = None if writes else self.readable(full)
            if not writes and not verdict:
                self.refuse_read(event, "reading outside the sandbox's allowlist", full, verdict)
        elif event in NETWORK:
            self.refuse(event, "network access", event)
        elif event in SPAWN:
            self.refuse(event, "starting processes", event)
        elif event == CLOSE_EVENT:
            if not self.from_submission(_caller()):  # the submission's own exit gets no closing line
                self.close()
        elif event == "kvkit.guard.fork_exec":
            self.refuse("_posixsubprocess.fork_exec", "starting processes", "_posixsubprocess.fork_exec")
        elif event == "import" and args and args[0] == "_posixsubprocess":
            frame = self.culprit(_caller(), skip_stdlib=True)
            if frame is not None:
                self.log("seen", "import _posixsubprocess", "a fresh process-starting module", self.where(frame))
        elif event == "os.kill":
            if args and args[0] not in (0, os.getpid()):
                self.refuse(event, "signalling another process", f"pid {args[0]}")
        elif event in MODIFY:
            for i in DIR_FD.get(event, ()):
                if len(args) > i and args[i] not in (None, -1):
                    self.refuse(event, f"{event} with dir_fd", str(args[0]))
            if event == "os.truncate" and args and isinstance(args[0], int):
                full = self.fd_path(args[0])
                if full is None or full in self.protected or self.in_job(full):
                    self.guard_job(event, self.job)  # a descriptor of the log or the job folder
                    if full is None or full in self.protected:
                        self.refuse(event, "truncating the sandbox's own files", str(full))
            for i in sorted(set(MODIFY[event]) | set(JOB_PATHS.get(event, ()))):
                full = self.path(args[i]) if len(args) > i else None
                if full is not None and i in MODIFY[event] and (not self.inside(full) or full in self.protected):
                    self.refuse(event, "changing files outside the working directory", full)
                self.guard_job(event, full)
        elif event in LISTING:
            i = LISTING[event]
            full = self.path(args[i]) if len(args) > i else None
            verdict = self.readable(full) if full is not None else True
            if not verdict:
                self.refuse_read(event, "listing outside the sandbox's allowlist", full, verdict)
        elif event.startswith("ctypes.") or event in SEEN_ANY_DEPTH:
            frame = self.culprit(_caller(), skip_stdlib=True)
            if frame is not None:
                self.log("seen", event, _short(args), self.where(frame))
        elif event == "sys._getframe":
            # inspect.currentframe()/stack() lead here; logging and warnings also do, and are fine
            frame = _caller()
            while frame is not None and os.path.basename(frame.f_code.co_filename) == "inspect.py":
                frame = frame.f_back
            if frame is not None and self.kind(frame.f_code.co_filename) == "submission":
                self.log("seen", event, "frame access", self.where(frame))
        elif event == "object.__getattr__" and len(args) > 1 and args[1] in ("tb_frame", "gi_frame", "cr_frame",
                                                                              "ag_frame", "f_back"):
            frame = self.culprit(_caller(), skip_stdlib=False)
            if frame is not None:
                self.log("seen", event, f"frame access ({args[1]})", self.where(frame))
        elif event in SEEN_DIRECT:
            frame = self.culprit(_caller(), skip_stdlib=False)
            if frame is not None:
                self.log("seen", event, _short(args), self.where(frame))


def _caller():
    """The innermost frame that is not the guard's own: the code that raised the audit event."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame


def _short(args) -> str:
    try:
        text = ", ".join(repr(a)[:60] for a in args[:3])
    except Exception:  # noqa: BLE001 - a hostile repr
        text = "?"
    return text


def _fcntl_flags(fd: int) -> int:
    return _FCNTL.fcntl(fd, _FCNTL.F_GETFL)


import fcntl as _FCNTL  # noqa: E402 - before the hook, like everything the guard needs

_REAL_EXIT = os._exit


# The two functions below are handed to the child's code (as ``os._exit`` and
# ``_posixsubprocess.fork_exec``). They are rebuilt in ``install`` with globals that
# hold only ``sys.audit``, the real ``_exit`` and ``PermissionError``: nothing in
# them leads back to the guard (a function's ``__globals__`` has no audit event).
def _exit(status):
    """``os._exit`` for the child: the closing line first (see the hook's CLOSE_EVENT)."""
    if status == 0:
        _audit("kvkit.guard.close")  # noqa: F821 - see install
    _real_exit(status)  # noqa: F821


def _no_fork_exec(*args, **kwargs):
    """``_posixsubprocess.fork_exec`` has no audit event of its own: raise one the hook refuses."""
    _audit("kvkit.guard.fork_exec")  # noqa: F821
    raise _refused("kvkit sandbox: starting processes is not allowed")  # noqa: F821


def install(cfg: dict) -> Guard:
    import posix
    import types

    import _posixsubprocess

    guard = Guard(cfg)
    scope = {"__builtins__": {}, "_audit": sys.audit, "_real_exit": _REAL_EXIT, "_refused": PermissionError}
    os._exit = posix._exit = types.FunctionType(_exit.__code__, scope, "_exit")
    _posixsubprocess.fork_exec = types.FunctionType(_no_fork_exec.__code__, scope, "fork_exec")
    sys.addaudithook(guard)
    return guard


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream
            pass


def main() -> None:
    if len(sys.argv) < 3:
        sys.stderr.write("usage: guard.py CONFIG.json SCRIPT ARGS...\n")
        raise SystemExit(2)
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    script = sys.argv[2]
    import runpy  # imported before the hook, like everything the guard itself needs

    guard = install(cfg)
    sys.argv = sys.argv[2:]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - reported as Python would, then status 1
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    if code == 0:
        guard.close()
    _flush()
    _REAL_EXIT(code & 0xFF)


if __name__ == "__main__":
    main()
