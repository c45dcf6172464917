"""Isolation levels for the sandboxed child, best first, with a clean fallback.

``namespaces`` (full): the child starts in new PID, network, mount, IPC and UTS
namespaces, in a private root that holds only the system directories, the
interpreter, the site-packages it is given and its own working directory (so
``solutions/``, ``grader/``, ``catalogue/`` and every other file of the kit
or of other submissions are not there at all), with no network but a
loopback that is down, as a uid of its own with ``no_new_privs``. A tiny init
(PID 1 of the namespace) runs it; when the child ends or is killed, the
kernel kills every process it started.

``process``: the child process alone (``-I -S``, a private working directory,
a minimal environment, rlimits, ``no_new_privs``, a wall-clock kill of its
process group), plus a uid of its own where the grader is root and the machine
lets the interpreter run as one (then ``RLIMIT_NPROC`` bounds a fork bomb and a
sweep by uid takes back anything that escaped the group). Nothing here hides a
file: the child reads whatever its uid may read, so only files that uid cannot
read are out of its reach (the Gradescope bundle makes its kit the grader's alone).

:func:`choose` probes the best level once per process by running a trivial
child through it, and falls back with a warning. Run as a script, this file is
the namespace launcher (standard library only: the kit is not visible to it
once the namespaces are up).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

KIT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIT_PACKAGES = ("solutions", "grader", "catalogue", "exercises", "kvkit", "benchmarks", "notebooks", "tests")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys/devices/system/cpu")
DEVICES = ("null", "zero", "full", "random", "urandom")
UID_BASE = 1_000_000  # each child runs as UID_BASE + (grading process id % UID_SPAN)
UID_SPAN = 1 << 22  # pid_max is at most 2**22: concurrent graders never share a uid
NOBODY = 65534

PROCESS = "process (rlimits, -I -S, private directory)"
FULL = "namespaces"


@dataclass
class Sandbox:
    """How ``sandbox.run_child`` isolates a child (picklable, so ``--jobs`` workers get it).

    Called as a wrapper, ``sandbox(command, workdir, uid)`` returns the command
    that starts ``command`` inside the namespaces (unchanged without them).
    """

    namespaces: bool = False
    drop_uid: bool = False
    uid_base: int | None = UID_BASE
    hide: list = field(default_factory=list)
    userns: bool = False  # unprivileged: a user namespace too, and the child's capabilities dropped

    def child_uid(self) -> int | None:
        """The uid the next child runs as (unique among this machine's concurrent graders), or None."""
        if not self.drop_uid or self.userns:
            return None
        if self.uid_base is None:
            return NOBODY
        return self.uid_base + os.getpid() % UID_SPAN

    def __call__(self, command: list[str], workdir: str, uid: int | None = None, job: str | None = None,
                 tmpfs: dict | None = None, shared: list | None = None) -> list[str]:
        """The command that runs ``command`` inside the namespaces.

        ``job`` and the ``shared`` folders are bound read-only; with ``tmpfs`` (``{"bytes": N, "inodes": M}``)
        the working directory is a size-capped tmpfs holding a copy of
        ``workdir``'s files (cleanup is the unmount when the namespace ends),
        else ``workdir`` itself is bound writable.
        """
        if not self.namespaces:
            return command
        uid = uid if uid is not None else NOBODY
        from grader.sandbox import launch

        ro = [p for p in SYSTEM_DIRS if os.path.lexists(p)]
        ro += [os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))]
        ro += [os.path.realpath(p) for p in launch.site_dirs()]
        ro += [os.path.realpath(p) for p in [job] if p]
        cfg = {"uid": uid, "gid": uid, "workdir": os.path.realpath(workdir), "ro": list(dict.fromkeys(ro)),
               "hide": self.hide, "tmpfs": tmpfs, "shared": [os.path.realpath(p) for p in shared or []]}
        if self.userns:
            cfg.update(userns=True, outer_uid=os.getuid(), outer_gid=os.getgid())
        inner = [os.path.realpath(command[0]), *command[1:]]
        return [sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(cfg), "--", *inner]


@dataclass
class Isolation:
    """The level reached, a command wrapper (None for the plain child) and a warning when weaker than full."""

    level: str
    wrap: Sandbox | None = None
    warning: str = ""


def kit_dirs() -> list[str]:
    """What the child must not see: the kit's checkout, and its packages wherever they are installed."""
    from grader.sandbox import launch

    dirs = [KIT_ROOT]
    for site in launch.site_dirs():
        dirs += [os.path.join(site, name) for name in KIT_PACKAGES if os.path.isdir(os.path.join(site, name))]
    return [os.path.realpath(d) for d in dirs]


def _uid_base() -> int | None:
    """UID_BASE when this user namespace maps the whole range, else None (nobody)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except OSError:
        return None
    for inside, _, count in ranges:
        if inside <= UID_BASE and UID_BASE + UID_SPAN <= inside + count:
            return UID_BASE
    return None


PROBE = r"""
import json, os, sys
facts = {"uid": os.getuid(), "pid": os.getpid(), "kit_visible": os.path.exists(sys.argv[1]),
         "proc": os.path.exists("/proc/self/status"), "caps": "?"}
try:
    with open("/proc/self/status") as f:
        facts["caps"] = next((line.split()[1] for line in f if line.startswith("CapEff:")), "?")
except OSError:
    pass
try:
    with open("/proc/self/net/dev") as f:
        facts["net"] = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
except OSError as exc:
    facts["net"] = ["?"]
try:
    open("/kvkit-probe-write", "w")
    facts["root_writable"] = True
except OSError:
    facts["root_writable"] = False
os.write(int(sys.argv[2]), json.dumps(facts).encode())
"""


def probe(box: Sandbox) -> tuple[dict | None, str]:
    """Run a trivial child through ``box``: ``(facts, "")`` when it ran, ``(None, why)`` when not."""
    from grader.sandbox import launch

    facts, child = launch.run_script(PROBE, [os.path.join(KIT_ROOT, "grader")], box)
    if facts is None:
        tail = " ".join(child.output_tail.strip().splitlines()[-2:])[-300:]
        return None, child.reason or tail or "the probe wrote nothing"
    return facts, ""


def _describe(box: Sandbox, facts: dict) -> tuple[str, list[str]]:
    """The level's name from what the probe saw, and what falls short of full."""
    short = []
    if box.namespaces:
        parts = ["pid", "net", "mount", "ipc", "uts"]
        if facts.get("net") not in ([], ["lo"]):
            short.append(f"the network namespace shows {facts.get('net')}")
        if facts.get("kit_visible"):
            short.append("the kit's directories are visible")
        if not facts.get("proc"):
            short.append("no /proc")
        if box.userns:
            parts.insert(0, "user")
        who = "no capabilities" if box.userns else "own uid"
        if facts.get("caps") != "0000000000000000":
            short.append(f"the child keeps capabilities ({facts.get('caps')})")
        what = f"namespaces ({', '.join(parts)}; private root, kit hidden, tmpfs workdir; {who}, no_new_privs, rlimits)"
    else:
        uid = "own uid, " if facts.get("uid") else ""
        what = f"process ({uid}no_new_privs, rlimits, -I -S, private directory)"
        short.append("NO ISOLATION: no Linux namespaces, so the submission ran with this user's view of the "
                     "machine: it could read the kit's files, reach the network and write wherever this user can")
        if not facts.get("uid"):
            short.append("THE CHILD RUNS AS ROOT (uid 0, no uid of its own): it can do anything root can, "
                         "and RLIMIT_NPROC cannot bound a fork bomb")
    if box.drop_uid and not facts.get("uid"):
        short.append("the uid was not dropped")
    return what, short


_CHOSEN: dict = {}


def choose(requested: str = "auto") -> Isolation:
    """The isolation for ``requested`` (auto, process or namespaces), probed once per process.

    ``auto`` and ``namespaces`` try namespaces first and fall back to the
    process level with a warning that says why; ``process`` skips them (so
    does ``auto`` when the environment sets ``KVKIT_NO_NAMESPACES``).
    """
    if requested in _CHOSEN:
        return _CHOSEN[requested]
    base = _uid_base()
    tried = []
    candidates = []
    root = hasattr(os, "getuid") and os.getuid() == 0
    # KVKIT_NO_NAMESPACES=1 tries the fallback on a machine that has namespaces (as CI without them would).
    if requested != "process" and sys.platform.startswith("linux") and not os.environ.get("KVKIT_NO_NAMESPACES"):
        candidates.append(Sandbox(namespaces=True, drop_uid=root, uid_base=base, hide=kit_dirs(), userns=not root))
    if root:
        candidates.append(Sandbox(namespaces=False, drop_uid=True, uid_base=base, hide=kit_dirs()))
    candidates.append(Sandbox(namespaces=False, drop_uid=False, hide=kit_dirs()))
    chosen = None
    for box in candidates:
        facts, why = probe(box)
        if facts is None or (box.drop_uid and not facts.get("uid")) or (box.namespaces and facts.get("kit_visible")) \
                or (box.userns and facts.get("caps") != "0000000000000000"):
            name = "namespaces" if box.namespaces else "a uid of its own"
            tried.append(f"{name}: {why or 'the probe saw ' + json.dumps(facts)}")
            continue
        level, short = _describe(box, facts)
        warning = ""
        if short or tried:
            warning = f"isolation is weaker than full: {level}; " + "; ".join(tried + short)
        chosen = Isolation(level, box, warning)
        break
    if chosen is None:
        as_root = "; THE CHILD RUNS AS ROOT" if root else ""
        chosen = Isolation(PROCESS, None, "isolation is weaker than full: no sandbox layer could be started ("
                           + "; ".join(tried) + ")" + as_root)
    _CHOSEN[requested] = chosen
    return chosen


# ---------------------------------------------------------------------- the launcher (run as a script)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 1 << 21, 4096, 16384, 1 << 18
KEEP_FLAGS = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 1, 38, 24, 28, 47
SECBIT_NOROOT_ALL = 0x2f  # noroot, no_setuid_fixup and keep_caps, each locked: exec as uid 0 grants nothing
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SETUP_FAILED = 125


class _Kernel:
    def __init__(self):
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ctypes = ctypes

    def _check(self, result, what):
        if result != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        self._check(self.libc.mount(enc(source), enc(target), enc(fstype), self.ctypes.c_ulong(flags), enc(data)),
                    f"mount {target}")

    def umount(self, target, flags=0):
        self._check(self.libc.umount2(os.fsencode(target), flags), f"umount {target}")

    def unshare(self, flags):
        self._check(self.libc.unshare(flags), "unshare")

    def prctl(self, option, arg):
        self._check(self.libc.prctl(option, self.ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")

    def pivot_root(self, new, old):
        number = SYS_PIVOT_ROOT.get(os.uname().machine)
        if number is None:
            raise OSError(38, "pivot_root: unknown syscall number")
        self._check(self.libc.syscall(number, os.fsencode(new), os.fsencode(old)), "pivot_root")


def _bind(k: _Kernel, fd: int, target: str, readonly: bool, extra: int = 0) -> None:
    k.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    flags = (os.fstatvfs(fd).f_flag & KEEP_FLAGS) | MS_NOSUID | MS_NODEV | extra
    try:
        k.mount(None, target, None, MS_REMOUNT | MS_BIND | flags | (MS_RDONLY if readonly else 0))
    except OSError:
        if readonly:
            raise


def _build_root(k: _Kernel, cfg: dict, root: str) -> None:
    """A private root under ``root``: system dirs and site-packages read-only, the workdir writable."""
    workdir = cfg["workdir"]
    sources = {}
    for path in [*cfg["ro"], workdir, *cfg.get("shared", [])] + [f"/dev/{n}" for n in DEVICES]:
        if os.path.exists(path) and path not in sources and not os.path.islink(path):
            sources[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    links = {p: os.readlink(p) for p in cfg["ro"] if os.path.islink(p)}
    k.mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    ops = sorted([(p, "ro") for p in cfg["ro"]] + [(p, "hide") for p in cfg["hide"]]
                 + [(workdir, "tmpfs" if cfg.get("tmpfs") else "rw")],
                 key=lambda op: (op[0].rstrip("/").count("/"), op[1] != "hide"))
    hidden = []
    for path, kind in ops:
        target = root + path
        if kind == "hide":
            if os.path.isdir(target):
                k.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=16k")
                hidden.append(target)
            continue
        if kind == "tmpfs":
            # The child's only writable place: a size- and inode-capped tmpfs whose pages the
            # memory cgroup charges; it goes away with the namespace (no cleanup to run).
            os.makedirs(target, exist_ok=True)
            k.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV,
                    f"mode=0700,size={int(cfg['tmpfs']['bytes'])},nr_inodes={int(cfg['tmpfs']['inodes'])}")
            _copy_tree(f"/proc/self/fd/{sources[path]}", target, int(cfg["uid"]))
            continue
        if path in links:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(links[path], target)
            continue
        if path not in sources:
            continue
        if os.path.isdir(f"/proc/self/fd/{sources[path]}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _bind(k, sources[path], target, readonly=(kind == "ro"))
    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    k.mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        if f"/dev/{name}" in sources:
            open(f"{dev}/{name}", "a").close()
            k.mount(f"/proc/self/fd/{sources[f'/dev/{name}']}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(f"{dev}/shm")
    k.mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")
    for path in cfg.get("shared", []):
        # The parent's read-only data (probe inputs, often under /dev/shm): bound after /dev is made.
        if path in sources:
            os.makedirs(root + path, exist_ok=True)
            _bind(k, sources[path], root + path, readonly=True)
    os.makedirs(root + "/proc", exist_ok=True)
    try:
        k.mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        os.write(2, f"kvkit sandbox: no /proc ({exc})\n".encode())
    os.makedirs(root + "/tmp", exist_ok=True)
    for fd in sources.values():
        os.close(fd)
    for target in hidden:
        k.mount(None, target, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    k.mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _copy_tree(source: str, target: str, uid: int) -> None:
    """Copy the parent's laid-out submission (a shallow tree of regular files) into the tmpfs, owned by ``uid``."""
    import shutil

    for root, dirs, files in os.walk(source, followlinks=False):
        rel = os.path.relpath(root, source)
        dest = target if rel == "." else os.path.join(target, rel)
        os.makedirs(dest, exist_ok=True)
        _chown(dest, uid)
        for name in files:
            src = os.path.join(root, name)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            shutil.copyfile(src, os.path.join(dest, name))
            _chown(os.path.join(dest, name), uid)
    _chown(target, uid)


def _chown(path: str, uid: int) -> None:
    try:
        os.chown(path, uid, uid)
    except OSError:
        pass  # a user namespace maps one uid only: the child keeps it, nothing to hand over


def _init(k: _Kernel, cfg: dict, command: list[str]) -> int:
    """PID 1 of the new namespace: build the root, run the child as its own uid, return its wait status."""
    import signal

    k.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    k.mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = "/tmp"  # any directory will do: the sources are held open, and the old root goes away
    _build_root(k, cfg, root)
    os.chdir(root)
    os.mkdir(".oldroot")
    try:
        k.pivot_root(".", ".oldroot")
        os.chdir("/")
        k.umount("/.oldroot", MNT_DETACH)
        os.rmdir("/.oldroot")
    except OSError:
        os.rmdir(".oldroot")
        os.chroot(".")
        os.chdir("/")
    k.mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    uid, gid = int(cfg["uid"]), int(cfg["gid"])
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(cfg["workdir"])
            if cfg.get("userns"):
                # One uid is mapped (ours, as 0): no uid to drop to, so drop every capability instead.
                k.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_ALL)
                k.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
                for cap in range(64):
                    try:
                        k.prctl(PR_CAPBSET_DROP, cap)
                    except OSError:
                        break
            else:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            k.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of uid clears it
            k.prctl(PR_SET_NO_NEW_PRIVS, 1)
            os.execv(command[0], command)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"kvkit sandbox: could not start the child: {exc}\n".encode())
        os._exit(127)
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 127 << 8
        if done == pid:
            return status


def launch(cfg: dict, command: list[str]) -> int:
    """Unshare, fork the namespace's init, and end the way the child ended (same exit code or signal)."""
    import signal
    import struct

    k = _Kernel()
    try:
        k.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                  | (CLONE_NEWUSER if cfg.get("userns") else 0))
        if cfg.get("userns"):
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {cfg['outer_uid']} 1"),
                               ("gid_map", f"0 {cfg['outer_gid']} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
    except OSError as exc:
        os.write(2, f"kvkit sandbox: namespaces not available: {exc}\n".encode())
        return SETUP_FAILED
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = SETUP_FAILED
        try:
            status = _init(k, cfg, command)
            os.write(write, struct.pack("i", status))
            code = 0
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"kvkit sandbox: setup failed: {exc}\n".encode())
        os._exit(code)
    os.close(write)
    os.waitpid(pid, 0)
    data = os.read(read, 4)
    if len(data) != 4:
        return SETUP_FAILED
    (status,) = struct.unpack("i", data)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: isolation.py CONFIG_JSON -- COMMAND...\n")
        sys.exit(2)
    sys.exit(launch(json.loads(sys.argv[1]), sys.argv[3:]))
