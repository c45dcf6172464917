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
* seen (logged, for the parent to judge): the tools of tampering when the
  submission's own code uses them directly (``ctypes``, frame and object
  walking with ``sys._getframe``/``inspect``/``gc``, tracing hooks, building
  code objects, ``exec``/``eval`` of strings).

Every decision is appended as one JSON line to the log named in CONFIG
(``{"a": "blocked"|"seen", "e": event, "d": detail, "w": "file:line"}``); the
parent reads it after the child has ended.
"""
from __future__ import annotations

import json
import os
import sys

LOG_LIMIT = 200  # lines
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
        self.write_ok = {"/dev/null"}
        self.fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.lines = 0
        self.logged = set()
        self.busy = False
        self.pid = os.getpid()

    # ---------------------------------------------------------------- helpers

    def log(self, action: str, event: str, detail: str, where: str = "") -> None:
        key = (action, event, detail[:60] if action == "blocked" else "", where)
        if key in self.logged or self.lines >= LOG_LIMIT:
            return
        self.logged.add(key)
        self.lines += 1
        line = json.dumps({"a": action, "e": event, "d": detail[:200], "w": where}) + "\n"
        try:
            os.write(self.fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

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
        if self.busy:
            return
        self.busy = True
        try:
            self.check(event, args)
        finally:
            self.busy = False

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
            if writes and not self.inside(full):
                self.refuse(event, "writing outside the working directory", full)
            verdict = None if writes else self.readable(full)
            if not writes and not verdict:
                self.refuse_read(event, "reading outside the sandbox's allowlist", full, verdict)
        elif event in NETWORK:
            self.refuse(event, "network access", event)
        elif event in SPAWN:
            self.refuse(event, "starting processes", event)
        elif event == "os.kill":
            if args and args[0] not in (0, os.getpid()):
                self.refuse(event, "signalling another process", f"pid {args[0]}")
        elif event in MODIFY:
            for i in DIR_FD.get(event, ()):
                if len(args) > i and args[i] not in (None, -1):
                    self.refuse(event, f"{event} with dir_fd", str(args[0]))
            for i in MODIFY[event]:
                full = self.path(args[i]) if len(args) > i else None
                if full is not None and (not self.inside(full) or full in self.protected):
                    self.refuse(event, "changing files outside the working directory", full)
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


def install(cfg: dict) -> Guard:
    guard = Guard(cfg)
    sys.addaudithook(guard)
    return guard


def main() -> None:
    if len(sys.argv) < 3:
        sys.stderr.write("usage: guard.py CONFIG.json SCRIPT ARGS...\n")
        raise SystemExit(2)
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    script = sys.argv[2]
    import runpy  # imported before the hook, like everything the guard itself needs

    install(cfg)
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
