"""Lay a submission out in a fresh sandbox directory: only its own files, in the contract's layout.

A submission is a directory (or a ``.zip`` of one), a single ``.py`` file (taken
as ``kv_cache.py``) or a ``.ipynb`` notebook (its code cells, shell and magic
lines dropped, taken as ``kv_cache.py``). The notebook is read as JSON by nbformat: nothing in it runs
in the grader's process.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import zipfile

MAX_FILE_BYTES = 1 * 2**20
MAX_ZIP_ENTRIES = 2000  # a zip with more entries is refused before any is read
MAX_NOTEBOOK_BYTES = 16 * 2**20  # parsed in the grader's process: bounded
MAX_TOTAL_BYTES = 8 * 2**20
SKIP_DIRS = {".git", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".kvkit", "node_modules"}


class SubmissionError(ValueError):
    """The path is not a submission the grader can read (missing, wrong kind, too large)."""


# The contract's own module names: never a shadow, whatever is installed.
CONTRACT_MODULES = {"kv_cache", "kv_cache_torch", "cost", "conftest", "tests"}


def shadowing(files: list[str], installed: set[str]) -> list[str]:
    """Messages for the submission's files whose top-level module name is a standard or installed module.

    ``files`` are paths relative to the submission's root; ``installed`` the
    top-level names to protect (``grader.run.installed_modules``). A file
    ``numpy.py`` or a folder ``numpy/`` would stand in for NumPy; the grader
    loads the submission's files by path, after every trusted import, so such
    a file changes nothing there, but a candidate's code that works only
    because of it would break anywhere else: the hand-back is refused.
    """
    found = {}
    for rel in files:
        parts = rel.replace(os.sep, "/").split("/")
        top = parts[0]
        if len(parts) == 1:
            if not top.endswith(".py"):
                continue
            top = top[:-3]
        elif not rel.endswith(".py"):
            continue
        top = top.split(".")[0]
        if top in installed and top not in CONTRACT_MODULES and not top.startswith("test_"):
            found.setdefault(top, parts[0] if len(parts) == 1 else parts[0] + "/")
    return [f"{shown} has the name of the installed module '{name}' and would shadow it: rename it "
            f"(for example to my_{name}{'.py' if shown.endswith('.py') else '/'}) and hand it back"
            for name, shown in sorted(found.items())]


def set_aside_bundle(workdir: str, files: list[str]) -> tuple[list[str], list[str]]:
    """``(kept, set_aside)``: remove from ``workdir`` the files whose bytes are the starter bundle's own.

    A candidate who zips the whole working folder back hands in the bundle's
    step tests, progress runner, planted mutants and any stub left unfilled;
    those are the kit's, not the candidate's, so they are set aside (and said
    so in a note) and the rest is graded.
    """
    import hashlib

    from kvkit.starter import BuildError, bundle_fingerprints

    try:
        known = _fingerprints(bundle_fingerprints)
    except (BuildError, OSError):  # a kit installed without its exercises (the Gradescope bundle)
        return list(files), []
    kept, aside = [], []
    for rel in files:
        path = os.path.join(workdir, rel)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest in known:
            os.remove(path)
            aside.append(rel)
        else:
            kept.append(rel)
    return kept, aside


_FINGERPRINTS: dict = {}


def _fingerprints(make) -> dict:
    if "all" not in _FINGERPRINTS:
        _FINGERPRINTS["all"] = make()
    return _FINGERPRINTS["all"]


def name_of(path: str) -> str:
    """A submission's display name: its file or directory name."""
    return os.path.basename(os.path.normpath(path))


def notebook_source(path: str) -> str:
    """The code cells of a notebook as one module, shell (``!``) and magic (``%``) lines dropped."""
    import nbformat

    if os.path.islink(path):
        raise SubmissionError(f"{path}: a symbolic link, not a submitted notebook")
    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise SubmissionError(f"{path}: a notebook larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several kinds; their messages quote the file, so not shown
        raise SubmissionError(f"{path}: not a readable notebook ({type(exc).__name__})") from exc
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        lines = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        cells.append("\n".join(lines))
    source = "\n\n".join(cells) + "\n"
    if len(source) > MAX_FILE_BYTES:
        raise SubmissionError(f"{path}: the notebook's code is larger than {MAX_FILE_BYTES} bytes")
    return source


def materialize(path: str, workdir: str) -> list[str]:
    """Copy the submission at ``path`` into the empty ``workdir``; return the files written.

    Raises:
        SubmissionError: ``path`` is missing, not .py/.ipynb/a directory, or too large.
    """
    if os.path.islink(path):
        raise SubmissionError(f"{path}: a symbolic link; hand in the file or folder itself")
    if not os.path.exists(path):
        raise SubmissionError(f"{path}: no such file or directory")
    if os.path.isfile(path) and path.endswith(".zip"):
        return _materialize_zip(path, workdir)
    if os.path.isfile(path):
        if path.endswith(".ipynb"):
            source = notebook_source(path)
        elif path.endswith(".py"):
            if os.path.getsize(path) > MAX_FILE_BYTES:
                raise SubmissionError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
            with open(path, encoding="utf-8", errors="replace") as f:
                source = f.read()
        else:
            raise SubmissionError(f"{path}: a submission is a directory (or a .zip of one), a .py file or a .ipynb notebook")
        with open(os.path.join(workdir, "kv_cache.py"), "w", encoding="utf-8") as f:
            f.write(source)
        return ["kv_cache.py"]
    written, total = [], 0
    for root, dirs, files in os.walk(path, followlinks=False):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not os.path.islink(os.path.join(root, d))]
        for name in files:
            src = os.path.join(root, name)
            rel = os.path.relpath(src, path)
            if os.path.islink(src) or not os.path.isfile(src) or not name.endswith((".py", ".txt", ".md", ".toml", ".json", ".npy")):
                continue
            size = os.path.getsize(src)
            if size > MAX_FILE_BYTES or total + size > MAX_TOTAL_BYTES:
                continue
            total += size
            os.makedirs(os.path.dirname(os.path.join(workdir, rel)) or workdir, exist_ok=True)
            shutil.copyfile(src, os.path.join(workdir, rel))
            written.append(rel)
    if "kv_cache.py" not in written:
        ipynbs = sorted(n for n in os.listdir(path) if n.endswith(".ipynb") and not os.path.islink(os.path.join(path, n)))
        if ipynbs:
            with open(os.path.join(workdir, "kv_cache.py"), "w", encoding="utf-8") as f:
                f.write(notebook_source(os.path.join(path, ipynbs[0])))
            written.append("kv_cache.py")
    return sorted(written)


def _zip_entries(path: str) -> int:
    """The entry count a zip's end-of-central-directory record announces (read before the directory is parsed)."""
    import struct

    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 65536 - 22))
        tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return 0  # not a zip (or a zip64 one): zipfile says so below
    return struct.unpack_from("<H", tail, at + 10)[0]


def _materialize_zip(path: str, workdir: str) -> list[str]:
    """A zipped directory: its regular files extracted (no links, no absolute or ``..`` paths,
    bounded sizes) into a scratch folder, then laid out like a directory; a single top
    folder inside the zip is taken as the submission."""
    if _zip_entries(path) > MAX_ZIP_ENTRIES:
        raise SubmissionError(f"{path}: a zip of {_zip_entries(path):,} entries (at most {MAX_ZIP_ENTRIES:,} "
                              "are read); zip only the submission's folder")
    scratch = tempfile.mkdtemp(prefix=f"kvkit-zip-{os.getpid()}-")
    try:
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise SubmissionError(f"{path}: not a readable zip ({type(exc).__name__})") from exc
        with archive:
            total = 0
            infos = archive.infolist()
            if len(infos) > MAX_ZIP_ENTRIES:
                raise SubmissionError(f"{path}: a zip of {len(infos):,} entries (at most {MAX_ZIP_ENTRIES:,} "
                                      "are read); zip only the submission's folder")
            for info in infos:
                name = info.filename
                kind = stat.S_IFMT(info.external_attr >> 16)
                if info.is_dir() or (kind and kind != stat.S_IFREG):
                    continue  # directories are made as needed; links and devices are never extracted
                parts = name.replace("\\", "/").split("/")
                if name.startswith("/") or ".." in parts or any(p in SKIP_DIRS for p in parts):
                    continue
                total += info.file_size
                if info.file_size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                    continue
                target = os.path.join(scratch, *parts)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as dst:
                    dst.write(src.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES])
        root = scratch
        entries = [e for e in os.listdir(scratch) if not e.startswith((".", "__MACOSX"))]
        if len(entries) == 1 and os.path.isdir(os.path.join(scratch, entries[0])):
            root = os.path.join(scratch, entries[0])
        return materialize(root, workdir)
    finally:
        subprocess.run(["rm", "-rf", "--", scratch], check=False)
