"""Lay a submission out in a fresh sandbox directory: only its own files, in the contract's layout.

A submission is a directory (or a ``.zip`` of one), a single ``.py`` file (taken
as ``kv_cache.py``) or a ``.ipynb`` notebook. A notebook whose code cells carry
the classroom notebook's role marker (cell metadata ``kvkit.role``, see
docs/notebook.md) is split by role into the contract's files: ``implementation``
cells become ``kv_cache.py``, ``cost`` cells ``cost.py``, ``port`` cells
``kv_cache_torch.py`` and ``own_tests`` cells the candidate's test file; any
other notebook (a candidate's own) is read as its writer meant it: its
definitions are ``kv_cache.py`` and its top-level statements are exploration,
left out (``own_definitions``). Cell magics that run Python keep their body,
``%%writefile NAME`` lays out that file, shell and other magic lines are
dropped (``cell_parts``). The notebook is read as JSON by nbformat and its
cells as syntax by ``ast``: nothing in it runs in the grader's process.

A hand-back lays out at most ``MAX_LAID_OUT`` files and folders, counted
before anything is copied (``check_count``).
"""
from __future__ import annotations

import json
import lzma
import os
import shutil
import stat
import subprocess
import tempfile
import zipfile
import zlib

from grader import HOME, KIT_ROOT

MAX_FILE_BYTES = 1 * 2**20
# A zip with more entries is refused before any is read. A working folder zipped with its virtual
# environment holds tens of thousands (this kit's own .venv, torch included: about 42,000 files); parsing
# that many takes zipfile well under a second.
MAX_ZIP_ENTRIES = 60_000
MAX_ZIP_DIRECTORY_BYTES = 16 * 2**20  # ... or with a larger central directory (a venv's paths: ~150 bytes each)
MAX_DEPTH = 16  # folders deep past which nothing of a hand-back is read (a zip's entries, a folder's files)
MAX_NOTEBOOK_BYTES = 16 * 2**20  # parsed in the grader's process: bounded
MAX_NOTEBOOK_CONTAINERS = 100_000  # JSON objects and lists in it, bounded too (the class notebook: about 2,000)
MAX_TOTAL_BYTES = 8 * 2**20
# Files and folders a hand-back may lay out (a candidate's work is a few dozen), counted before any is copied:
# well below what the sandbox's working folder holds (``launch.WORKDIR_INODES``, 20,000), which the
# submission's own process needs room in too. Files read past it: empty ones weigh nothing, so only a count
# bounds them.
MAX_LAID_OUT = 2_000
SKIP_DIRS = {".git", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".kvkit", "node_modules"}
VENV_MARKER = "pyvenv.cfg"  # the file at the root of every virtual environment (PEP 405): its folder is set aside
ZIP_SUFFIXES = (".py", ".txt", ".md", ".toml", ".json", ".npy", ".ipynb")  # what a zip's layout can read


class SubmissionError(ValueError):
    """The path is not a submission the grader can read (missing, wrong kind, too large)."""


# The contract's own module names: never a shadow, whatever is installed.
CONTRACT_MODULES = {"kv_cache", "kv_cache_torch", "cost", "conftest", "tests"}
# The kit's own packages: the grading environment has them, and hides them from the sandbox on purpose, so a
# submission that imports one fails as any crash does (a grade), never as a module to install.
KIT_PACKAGES = {"kvkit", "grader", "solutions", "catalogue", "exercises", "benchmarks"}


def shadowing(files: list[str], installed: set[str]) -> list[str]:
    """Messages for the submission's files whose top-level module name is a standard or installed module.

    ``files`` are paths relative to the submission's root; ``installed`` the
    top-level names to protect (``grader.stages.run.installed_modules``). A file
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
    so in a note) and the rest is graded. The bundle's ``tests/`` files are set
    aside by their path even when edited (listed with " (edited)"): the step
    tests need the support files beside them, and are not the candidate's tests.
    """
    import hashlib

    from grader.shipped.bundle import BuildError, bundle_fingerprints

    try:
        known = _fingerprints(bundle_fingerprints)
    except (BuildError, OSError):  # a kit installed without its exercises: the Gradescope bundle ships them
        try:
            with open(os.path.join(HOME, "bundle_fingerprints.json")) as f:
                known = _fingerprints(lambda: json.load(f))
        except (OSError, ValueError):
            return list(files), []
    # The step tests and their support live under tests/ in the bundle: the candidate is never asked to
    # edit them, so one handed back edited (a comment added) is still the kit's, kept by its path.
    kit_tests = {rel for rel in known.values() if rel.startswith("tests/")}
    kept, aside = [], []
    for rel in files:
        path = os.path.join(workdir, rel)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest in known:
            os.remove(path)
            aside.append(rel)
        elif rel.replace(os.sep, "/") in kit_tests:
            os.remove(path)
            aside.append(f"{rel} (edited)")
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


def without_iri_format_checker() -> None:
    """Make jsonschema (which nbformat imports) skip its optional ``iri`` format checker, ``rfc3987_syntax``.

    That package compiles about 35 Lark grammars when it is imported: 1.5 to 2.5 CPU-s on the kit's
    2-core machine, for every process that imports nbformat (python-jsonschema/jsonschema#1428). No
    schema the kit validates (nbformat's, docs/report.schema.json) uses the ``iri`` formats, and
    jsonschema leaves that checker out when the import fails, which a ``None`` in ``sys.modules`` makes
    it do. Call it before the first import of nbformat or jsonschema; later it changes nothing.
    """
    import sys

    sys.modules.setdefault("rfc3987_syntax", None)


def _read_notebook(path: str):
    """The notebook at ``path``, parsed by nbformat (JSON only), within the size bound."""
    without_iri_format_checker()
    import nbformat

    if os.path.islink(path):
        raise SubmissionError(f"{path}: a symbolic link, not a submitted notebook")
    if not os.path.isfile(path):
        raise SubmissionError(f"{path}: not a regular file")
    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise SubmissionError(f"{path}: a notebook larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    # Parsing and validating costs the grader's own process per JSON object and list, not per byte (5.6 million
    # empty objects in 16 MiB of metadata took a minute and 5 GB): counted first, as braces and brackets
    # (an upper bound: those inside strings count too).
    with open(path, "rb") as f:
        raw = f.read(MAX_NOTEBOOK_BYTES + 1)
    containers = raw.count(b"{") + raw.count(b"[")
    del raw
    if containers > MAX_NOTEBOOK_CONTAINERS:
        raise SubmissionError(f"{path}: a notebook of about {containers:,} JSON objects and lists (cells, outputs, "
                              f"metadata), more than the {MAX_NOTEBOOK_CONTAINERS:,} the grader reads; clear its "
                              f"outputs and hand it back with only its own cells")
    try:
        import warnings

        with warnings.catch_warnings():  # nbformat's warnings about a hand-back (a cell without an id) are noise
            warnings.simplefilter("ignore")
            nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several kinds; their messages quote the file, so not shown
        raise SubmissionError(f"{path}: not a readable notebook ({type(exc).__name__})") from exc
    # nbformat only warns about a notebook its schema rejects: every cell is read below by its type and
    # text, so a cell without them makes the notebook unreadable, not the grader fail.
    for number, cell in enumerate(nb.get("cells") if isinstance(nb.get("cells"), list) else [None], 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str) \
                or not isinstance(cell.get("source"), str) or not isinstance(cell.get("metadata", {}), dict):
            raise SubmissionError(f"{path}: not a readable notebook (cell {number} has no cell_type, text "
                                  f"source or metadata of its own); save it again from Jupyter")
    # Every file laid out from the notebook is bounded (``_bounded``), and so is the code read to lay them out:
    # its cells are parsed here, in the grader's process (a course notebook holds well under 100 KB of code).
    code = sum(len(cell["source"]) for cell in nb.cells if cell["cell_type"] == "code")
    if code > MAX_FILE_BYTES:
        raise SubmissionError(f"{path}: its code cells hold more than {MAX_FILE_BYTES // 2**20} MiB of code "
                              f"({code:,} characters); hand back the notebook without generated or pasted data")
    return nb


# Cell magics whose body IPython runs as Python in the notebook's own namespace: the body is kept. A
# ``%%writefile NAME`` cell lays out that file (``_written_files``); any other cell magic (``%%bash``,
# ``%%html``, ``%%javascript``, ...) is dropped, and a note names it.
RUN_BODY_MAGICS = ("time", "timeit", "capture", "prun")
WRITEFILE_MAGIC = "writefile"
MAX_WRITTEN_FILES = 20  # files a notebook's %%writefile cells may lay out
# A plain file name in the hand-back's folder: no folder part, no path, nothing hidden.
WRITABLE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
WRITABLE_SUFFIXES = (".py", ".txt", ".md", ".toml", ".json")  # what the layout reads (text)


def _code_lines(source: str) -> str:
    """``source`` without its shell (``!``) and line-magic (``%``) lines."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def cell_parts(cell) -> tuple[str, object] | None:
    """What a notebook cell is, read as IPython would run it; None for a cell that is not code.

    ``("code", source)``: Python (a ``%%time``, ``%%timeit``, ``%%capture`` or
    ``%%prun`` cell's body included, nested ones too), shell and line-magic
    lines dropped; ``("writefile", (arguments, body))``: a ``%%writefile``
    cell; ``("dropped", magic)``: any other cell magic, by its name.
    """
    if cell.cell_type != "code":
        return None
    source, start = cell.source, 0
    while True:  # one pass: each magic line is stepped over by its offset, the cell never copied until the end
        while start < len(source) and source[start].isspace():
            start += 1
        if not source.startswith("%%", start):
            return "code", _code_lines(source[start:])
        end = source.find("\n", start)
        end = len(source) if end < 0 else end
        words = source[start + 2:end].split(None, 1)
        magic = words[0] if words else ""
        start = end + 1
        if magic in RUN_BODY_MAGICS:
            continue
        if magic == WRITEFILE_MAGIC:
            return "writefile", (words[1].strip() if len(words) > 1 else "", source[start:])
        return "dropped", magic[:40]


def _cell_code(cell) -> str | None:
    """A code cell's Python (``cell_parts``); None for markdown, ``%%writefile`` or another cell magic."""
    parts = cell_parts(cell)
    return parts[1] if parts and parts[0] == "code" else None


def _bounded(path: str, name: str, source: str) -> str:
    if len(source) > MAX_FILE_BYTES:
        raise SubmissionError(f"{path}: the notebook's code for {name} is larger than {MAX_FILE_BYTES} bytes")
    return source


def _written_files(path: str, nb, notes: list) -> dict[str, str]:
    """``{file name: text}`` the notebook's ``%%writefile NAME`` (and ``%%writefile -a NAME``) cells write.

    Only a plain file name (``WRITABLE_NAME``: no folder, no absolute path, no
    ``..``) of a kind the layout reads is written; any other is left out, and a
    note in ``notes`` says which cell. Each file is bounded as the notebook's
    code is (``_bounded``).

    Raises:
        SubmissionError: more than ``MAX_WRITTEN_FILES`` files, with the count.
    """
    import re
    import shlex

    files: dict[str, str] = {}
    refused = []
    for number, cell in enumerate(nb.cells, 1):
        parts = cell_parts(cell)
        if not parts or parts[0] != "writefile":
            continue
        arguments, body = parts[1]
        try:
            words = shlex.split(arguments)
        except ValueError:
            words = []
        append = bool(words) and words[0] in ("-a", "--append")
        names = words[1:] if append else words
        if len(names) != 1 or not re.fullmatch(WRITABLE_NAME, names[0]) or not names[0].endswith(WRITABLE_SUFFIXES):
            refused.append(f"cell {number} (%%writefile {arguments[:60]})")
            continue
        text = body if body.endswith("\n") or not body else body + "\n"
        files[names[0]] = files.get(names[0], "") + text if append else text
        _bounded(path, names[0], files[names[0]])
    if len(files) > MAX_WRITTEN_FILES:
        raise SubmissionError(f"{path}: the notebook's %%writefile cells write {len(files):,} files (at most "
                              f"{MAX_WRITTEN_FILES} are laid out); write only the submission's files "
                              f"(kv_cache.py, your tests, cost.py, the port)")
    if refused:
        notes.append(f"not written: {', '.join(refused[:5])}{' and more' if len(refused) > 5 else ''}: a "
                     f"%%writefile cell lays out one plain file name ({', '.join(WRITABLE_SUFFIXES)}) inside "
                     f"the hand-back's folder, never a path")
    return files


def _dropped_magics(nb, notes: list) -> None:
    """A note naming the cells whose cell magic does not run Python (``%%bash``, ``%%html``): left out."""
    dropped = [f"cell {number} (%%{parts[1]})" for number, cell in enumerate(nb.cells, 1)
               for parts in [cell_parts(cell)] if parts and parts[0] == "dropped"]
    if dropped:
        notes.append(f"left out {', '.join(dropped[:8])}{f' and {len(dropped) - 8} more' if len(dropped) > 8 else ''}"
                     f": a cell magic that does not run Python")


def notebook_source(path: str, notes: list | None = None) -> str:
    """A notebook without role markers (a candidate's own) as one module, read as its writer meant it.

    Its definitions (imports that what is kept uses, functions, classes,
    constant assignments, guarded imports; see ``own_definitions``) are the
    module, in cell order; its top-level statements (plots, prints, checks,
    timing loops, ``if __name__ == "__main__":`` blocks) are exploration and
    are left out, and ``notes``, when given, gets a line listing them.
    """
    nb = _read_notebook(path)
    notes = [] if notes is None else notes
    cells = [(number, code) for number, cell in enumerate(nb.cells, 1)
             for code in [_cell_code(cell)] if code is not None]
    kept, left = own_definitions(cells)
    if left:
        notes.append(_left_out_note(os.path.basename(path), left))
    return _bounded(path, "kv_cache.py", "\n\n".join(p for p in _future_first(kept) if p) + "\n")


def _future_first(parts: list[str]) -> list[str]:
    """``parts`` (cells' code, in order) with their top-level ``from __future__ import`` statements moved into
    a first part: Jupyter compiles each cell on its own, so any cell may open with one, but a file only at
    its top. Each statement moved leaves ``pass`` behind (it may share a line); a part that does not parse
    is left as it is."""
    import ast

    future, out = [], []
    for part in parts:
        try:
            tree = ast.parse(part)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            out.append(part)
            continue
        nodes = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        if not nodes:
            out.append(part)
            continue
        lines = part.encode("utf-8", "surrogatepass").split(b"\n")
        for node in reversed(nodes):  # last first: earlier offsets stay valid
            future.insert(0, _segment(lines, node))
            first, last = node.lineno - 1, node.end_lineno - 1
            lines[first:last + 1] = [lines[first][:node.col_offset] + b"pass" + lines[last][node.end_col_offset:]]
        out.append(b"\n".join(lines).decode("utf-8", "surrogatepass"))
    return (["\n".join(dict.fromkeys(future))] if future else []) + out


def _segment(lines: list[bytes], node) -> str:
    """The source text of ``node`` from ``lines``, its source's UTF-8 lines (ast's columns count bytes). One
    slice per statement: ``ast.get_source_segment`` splits the whole source again at every call."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode("utf-8", "surrogatepass")
    body = [lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]]
    return b"\n".join(body).decode("utf-8", "surrogatepass")


# The classroom notebook's hand-back roles (cell metadata ``{"kvkit": {"role": ...}}``) and the file
# each becomes. ``setup`` cells (the notebook's imports) head every file. The port and the own tests
# run after the implementation in the notebook and may use its names, so their files import them.
ROLE_FILES = {"implementation": "kv_cache.py", "cost": "cost.py", "port": "kv_cache_torch.py",
              "own_tests": "test_notebook_check.py"}
SETUP_ROLE = "setup"
AFTER_IMPLEMENTATION = {"port", "own_tests"}
# What a port cell may bind to the contract's names (``kvkit.exports``: contract name -> its own name).
EXPORTABLE = {"KVCache", "gqa_attention"}
# Modules of the kit a notebook may import that the starter bundle ships too: ``{module: path in the bundle}``.
SHIPPED_HELPERS = {"catalogue.mutants": "catalogue/mutants.py", "catalogue.structure": "catalogue/structure.py",
                   "kv_helpers.mutants": "catalogue/mutants.py"}
# What a helper needs beside it: the planted mistakes and the recognised masks are the mask rule's.
HELPER_NEEDS = {"catalogue.mutants": ["catalogue.rules"], "catalogue.structure": ["catalogue.rules"],
                "kv_helpers.mutants": ["kv_helpers.rules"]}
SHIPPED_HELPERS.update({"catalogue.rules": "catalogue/rules.py", "kv_helpers.rules": "catalogue/rules.py"})
# Where a helper is written in the sandbox when it is not at the same path as in the kit (the class
# notebook's released helpers: ``kv_helpers`` beside the notebook).
HELPER_TARGETS = {"kv_helpers.mutants": "kv_helpers/mutants.py", "kv_helpers.rules": "kv_helpers/rules.py"}


def _marker(cell, key: str, field: str):
    """``cell.metadata[key][field]``, or None where the notebook's metadata is not shaped so."""
    meta = cell.metadata.get(key)
    return meta.get(field) if isinstance(meta, dict) else None


def _role(cell) -> str | None:
    role = _marker(cell, "kvkit", "role")
    return role if isinstance(role, str) else None


def _only_stubs(sources: list[str]) -> bool:
    """Every function in ``sources`` still has nbgrader's stub body (``raise NotImplementedError()``), read as syntax."""
    import ast

    found = False
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False  # written, if wrongly: the grader says so
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
                if not (len(body) == 1 and _raises_not_implemented(body[0])):
                    return False
                found = True
    return found


def _raises_not_implemented(node) -> bool:
    """``node`` is ``raise NotImplementedError`` or ``raise NotImplementedError(...)``, read from its syntax
    tree alone (turning a deeply nested statement back into text can exhaust the recursion limit)."""
    import ast

    exc = node.exc if isinstance(node, ast.Raise) else None
    exc = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _exports(cells) -> list[str]:
    """``KVCache = KVCacheTorch`` lines from the port cells' ``kvkit.exports``, names checked as identifiers."""
    import keyword

    lines = []
    for cell in cells:
        exports = _marker(cell, "kvkit", "exports")
        for name, own in (exports.items() if isinstance(exports, dict) else []):
            if name in EXPORTABLE and isinstance(own, str) and own.isidentifier() and not keyword.iskeyword(own):
                lines.append(f"{name} = {own}")
    return lines


def notebook_files(path: str, notes: list | None = None) -> dict[str, str]:
    """``{file name: source}``: the notebook at ``path`` laid out as the contract's files.

    A notebook with role markers is split by role (``ROLE_FILES``); a role whose
    answer cells (nbgrader's ``solution`` cells) hold only stubs is left out, as
    not attempted, except the implementation. A notebook without markers (a
    candidate's own) is one ``kv_cache.py`` of its definitions
    (``notebook_source``), unless a ``%%writefile kv_cache.py`` cell writes that
    file. Files its ``%%writefile`` cells write are laid out beside them
    (``_written_files``); a role's file wins over one written under its name.
    ``notes``, when given, gets a line for each thing read otherwise than as
    it lies (statements left out, cell magics dropped, a file not written).

    Raises:
        SubmissionError: an unreadable notebook, or more code or files than bounded.
    """
    notes = [] if notes is None else notes
    nb = _read_notebook(path)
    written = _written_files(path, nb, notes)
    _dropped_magics(nb, notes)
    by_role: dict[str, list] = {}
    for cell in nb.cells:
        role = _role(cell)
        if role is not None and _cell_code(cell) is not None:
            by_role.setdefault(role, []).append(cell)
    if not set(by_role) & set(ROLE_FILES):
        if "kv_cache.py" in written:  # the file the writer meant to be the submission: the other cells used it
            notes.append("kv_cache.py is what the notebook's %%writefile kv_cache.py cell writes; its other cells "
                         "are not part of it")
            return written
        return {**written, "kv_cache.py": notebook_source(path, notes)}
    setup = [_cell_code(c) for c in by_role.get(SETUP_ROLE, [])]
    # Cells the student added have no role: their definitions (imports, functions, classes, constants)
    # go with the implementation, which may use them; anything they run (plots, prints) is left out.
    added_cells = [(number, _cell_code(c)) for number, c in enumerate(nb.cells, 1)  # nbgrader marks the kit's own
                   if _role(c) is None and "nbgrader" not in c.get("metadata", {}) and _cell_code(c) is not None]
    added, left = own_definitions(added_cells, known=set().union(*map(_top_level_names, setup)) if setup else set(),
                                  prune_imports=False)
    if left:
        notes.append(_left_out_note("the cells you added", left))
    files = {}
    for role, name in ROLE_FILES.items():
        cells = by_role.get(role, [])
        answers = [_cell_code(c) for c in cells if _marker(c, "nbgrader", "solution") is True]
        if role != "implementation" and (not cells or (answers and _only_stubs(answers))):
            continue
        parts = list(setup)
        if role in AFTER_IMPLEMENTATION:
            parts.append("from kv_cache import *  # noqa: F403 - the names the notebook's earlier cells defined")
        if role == "implementation":
            parts += [a for a in added if a]
        parts += [_cell_code(c) for c in cells]
        if role == "port":
            parts.append("\n".join(_exports(cells)))
        head = f"# {name}: the cells of {os.path.basename(path)!r} marked {role!r} (kvkit grade wrote this file)."
        files[name] = _bounded(path, name, "\n\n".join([head, *(p for p in _future_first(parts) if p)]) + "\n")
    clash = sorted(set(written) & set(files))
    if clash:
        notes.append(f"not written: %%writefile {', '.join(clash)}: the notebook's cells marked for "
                     f"{'that file' if len(clash) == 1 else 'those files'} make {'it' if len(clash) == 1 else 'them'}")
    return {**{n: t for n, t in written.items() if n not in files}, **files}


def _definitions(source: str) -> str:
    """The top-level definitions of ``source`` (``own_definitions`` of one cell), as one text (syntax only)."""
    kept, _ = own_definitions([(1, source)], prune_imports=False)
    return "\n\n".join(k for k in kept if k)


# Builtins a constant's value may call (``NEG_INF = float("-inf")``): they compute, they do not act.
PURE_BUILTINS = frozenset({"abs", "bool", "complex", "dict", "divmod", "float", "frozenset", "int", "len", "list",
                           "max", "min", "pow", "range", "round", "set", "str", "sum", "tuple"})


def own_definitions(cells: list[tuple[int, str]], known: set[str] | None = None,
                    prune_imports: bool = True) -> tuple[list[str], list[tuple[int, str]]]:
    """``(kept, left_out)``: what of a notebook's own code cells is the submission, read as syntax.

    ``cells`` are ``(cell number, Python source)`` in notebook order; ``known``
    the names defined before them (a classroom notebook's setup cells). Kept,
    cell by cell (``kept`` holds each cell's kept text, "" for none):

    - imports (with ``prune_imports``, only those that something kept uses, and
      ``from __future__`` ones: an import only a plot needed is left out);
    - function and class definitions, with their decorators;
    - assignments to plain names whose value is settled at definition time: made
      of constants, names already kept (or builtins), attribute reads,
      operators, subscripts, containers and lambdas, calling nothing; a name in
      capitals, a constant by Python's convention (``SCALE = 1 / math.sqrt(64)``,
      ``DEVICE = torch.device("cpu")``, ``T = TypeVar("T")``), may also call an
      imported module's function or a pure builtin, never a random draw
      (``np.random``, ``torch.randn``) nor the notebook's own code;
    - ``try`` and ``if`` blocks made only of such definitions (a guarded
      ``try: import torch`` / ``except ImportError: torch = None``), but never
      ``if __name__ == "__main__":``.

    Everything else at the top level (calls, prints, plots, loops, asserts,
    ``cache = KVCache(...)``, ``np.random.seed(0)``) is exploration: in
    ``left_out`` as ``(cell number, its first line)``. A cell that does not
    parse as Python is left out whole.
    """
    import ast
    import builtins

    defined = set(dir(builtins)) | {"__name__", "__file__", "__doc__"} | set(known or ())
    state = {"defined": defined, "imported": set(), "star": False, "journal": []}
    chosen, left = [], []  # chosen: (cell index, lines, node)
    for index, (number, source) in enumerate(cells):
        # A lone surrogate (JSON can carry one) fails to parse: it is "?" here, as in the file written.
        source = source.encode("utf-8", "replace").decode("utf-8")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
            left.append((number, f"the whole cell: it does not parse as Python{where}"))
            continue
        lines = source.encode("utf-8", "surrogatepass").split(b"\n")  # the cell's code: "\n" ends every line
        for node in tree.body:
            if _keep_definition(node, state):
                chosen.append((index, lines, node))
            elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # a docstring: nothing
                left.append((number, _first_line(lines, node)))
    if prune_imports:
        used = {n.id for _, _, node in chosen if not isinstance(node, (ast.Import, ast.ImportFrom))
                for n in ast.walk(node) if isinstance(n, ast.Name)}
        unused = [(index, lines, node) for index, lines, node in chosen
                  if isinstance(node, (ast.Import, ast.ImportFrom)) and not _import_used(node, used)]
        for index, lines, node in unused:
            left.append((cells[index][0], f"{_first_line(lines, node)} (nothing kept uses it)"))
        dropped = {id(node) for _, _, node in unused}
        chosen = [c for c in chosen if id(c[2]) not in dropped]
    kept = [[] for _ in cells]
    for index, lines, node in chosen:
        kept[index].append(_definition_text(lines, node))
    return ["\n\n".join(k for k in parts if k) for parts in kept], sorted(left, key=lambda item: item[0])


def _top_level_names(source: str) -> set[str]:
    """Names ``source``'s top-level statements bind (syntax only; none when it does not parse)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    return set().union(*(_binds(node) for node in tree.body)) if tree.body else set()


def _binds(node) -> set[str]:
    """The names a top-level statement binds: what it imports, defines or assigns (blocks included)."""
    import ast

    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name.split(".")[0]) for a in node.names if a.name != "*"}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)) else []
    found = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    blocks = []
    if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
        blocks = [node.body, getattr(node, "orelse", [])]
    elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        blocks = [node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)]
    for block in blocks:
        for child in block:
            found |= _binds(child)
    return found


def _keep_definition(node, state: dict) -> bool:
    """Whether top-level statement ``node`` is a definition (``own_definitions``); if so, its names join
    ``state["defined"]``."""
    import ast

    if isinstance(node, (ast.Import, ast.ImportFrom)):
        state["star"] = state["star"] or any(a.name == "*" for a in node.names)
        _bind(state, "imported", _binds(node))
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        pass
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [n for t in targets for n in ast.walk(t) if isinstance(n, ast.expr)
                 and not isinstance(n, (ast.Tuple, ast.List, ast.Starred))]
        if not names or not all(isinstance(n, ast.Name) for n in names):
            return False  # an attribute or an item set (``cfg.x = 1``): a statement about something else
        capitals = all(n.id.isupper() for n in names)
        if node.value is not None and not _settled(node.value, state, calls=capitals):
            return False
    elif isinstance(node, ast.If):
        if _is_main_guard(node.test) or not _settled(node.test, state, calls=False):
            return False
        return _keep_block([*node.body, *node.orelse], state)
    elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        if not all(h.type is None or _settled(h.type, state, calls=False) for h in node.handlers):
            return False
        return _keep_block([*node.body, *(s for h in node.handlers for s in h.body), *node.orelse,
                            *node.finalbody], state)
    else:
        return False
    _bind(state, "defined", _binds(node))
    return True


def _bind(state: dict, key: str, names: set[str]) -> None:
    """Add ``names`` to ``state[key]``, each one new recorded in ``state["journal"]`` (so a block that turns
    out not to be a definition is taken back in the time it took, never by copying every name so far)."""
    for name in names - state[key]:
        state[key].add(name)
        state["journal"].append((key, name))


def _keep_block(statements: list, state: dict) -> bool:
    """Whether every statement of a ``try`` or ``if`` block is a definition or ``pass``; only then do the
    names they bind join ``state``."""
    import ast

    mark, star = len(state["journal"]), state["star"]
    if all(isinstance(s, ast.Pass) or _keep_definition(s, state) for s in statements):
        return True
    for key, name in state["journal"][mark:]:
        state[key].discard(name)
    del state["journal"][mark:]
    state["star"] = star
    return False


def _is_main_guard(test) -> bool:
    """``__name__ == "__main__"`` (either way round): the notebook's demo, never the submission."""
    import ast

    if not (isinstance(test, ast.Compare) and len(test.comparators) == 1):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in sides) and any(
        isinstance(n, ast.Constant) and n.value == "__main__" for n in sides)


def _settled(expr, state: dict, calls: bool) -> bool:
    """Whether ``expr`` is settled at definition time (``own_definitions``): every name it reads is defined,
    and it calls nothing (with ``calls``: only an imported module's function or a pure builtin, never a
    random draw). A lambda's body runs later: only its defaults count."""
    import ast

    local = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
            return False
        if isinstance(node, ast.Lambda):
            stack += [d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None]
            continue
        if isinstance(node, ast.Call) and not (calls and _computes(node.func, state)):
            return False
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in state["defined"] \
                and node.id not in local and not state["star"]:
            return False
        stack.extend(ast.iter_child_nodes(node))
    return True


def _computes(func, state: dict) -> bool:
    """``func`` is a pure builtin, or a function reached from an imported module's name (``math.sqrt``,
    ``np.finfo``), not a random draw or seed (``np.random.*``, ``torch.randn``, ``torch.manual_seed``)."""
    import ast

    chain = []
    while isinstance(func, ast.Attribute):
        chain.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return False
    chain.append(func.id)
    if len(chain) == 1 and func.id in PURE_BUILTINS and func.id not in state["imported"]:
        return True
    return func.id in state["imported"] and "random" not in chain and not chain[0].startswith(("rand", "seed")) \
        and chain[0] != "manual_seed"


def _import_used(node, used: set[str]) -> bool:
    """Whether an import is kept: ``from __future__``, a star import, or one whose names something kept reads."""
    if getattr(node, "module", None) == "__future__" or any(a.name == "*" for a in node.names):
        return True
    return bool(_binds(node) & used)


def _first_line(lines: list[bytes], node) -> str:
    """The first line of a statement's text, at most 60 characters (for a note)."""
    text = lines[node.lineno - 1][node.col_offset:].decode("utf-8", "replace").strip()
    return text if len(text) <= 60 else text[:57].rstrip() + "..."


def _definition_text(lines: list[bytes], node) -> str:
    """A kept statement's source text, its decorators included (a decorated definition's ``lineno`` is the
    line of its ``def`` or ``class``; its decorators start a line each, above it)."""
    decorators = getattr(node, "decorator_list", None)
    if not decorators:
        return _segment(lines, node)
    first = min(d.lineno for d in decorators) - 1
    body = [*lines[first:node.end_lineno - 1], lines[node.end_lineno - 1][:node.end_col_offset]]
    return b"\n".join(body).decode("utf-8", "surrogatepass")


def _left_out_note(what: str, left: list[tuple[int, str]]) -> str:
    """The note listing what of a notebook's own cells was left out as exploration (a few shown, the rest
    counted)."""
    shown = "; ".join(f"cell {number}: {text}" for number, text in left[:6])
    more = f"; and {len(left) - 6} more" if len(left) > 6 else ""
    return (f"{what}: kept the definitions (imports, functions, classes, constants); left out as exploration, "
            f"not run: {shown}{more}")


def _top_level_imports(source: str) -> set[str]:
    """Dotted module names that ``source`` imports in statements of its own top level (not inside an ``if``,
    a ``try`` or a function): the imports that run, unguarded, whenever the module is loaded."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def _imported_modules(source: str) -> set[str]:
    """Dotted module names ``source`` imports (``import a.b``, ``from a.b import c``, ``from a import b``), as syntax."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def missing_module(import_error, workdir: str, files: list[str], installed) -> str | None:
    """The ``not_graded`` reason when loading the submission failed for a module the grading environment lacks.

    ``import_error`` is what the sandbox answered about loading ``kv_cache.py``
    (the trials task's ``answer["import"]``: ``{"type", "message"}``, data from
    the child); ``files`` the laid-out files (relative to ``workdir``);
    ``installed`` the top-level module names the grading environment has
    (``grader.stages.run.installed_modules``). Decided from what happened: the load
    raised ``ModuleNotFoundError`` for a module that is neither installed here
    nor one of the submission's own files, and that one of its files imports
    at its top level, unguarded (read as syntax): a raise of the error by hand,
    or an import under ``if`` or ``try``, is the submission's crash, graded. A
    guarded import with a fallback loads, so it never reaches here. None when the failure is anything else.
    """
    import re

    if not isinstance(import_error, dict) or import_error.get("type") != "ModuleNotFoundError":
        return None
    found = re.fullmatch(r"No module named '([A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_.]*)?'",
                         str(import_error.get("message", "")))
    if not found:
        return None
    top = found[1]
    own = {rel.replace(os.sep, "/").split("/")[0].removesuffix(".py") for rel in files}
    if top in installed or top in own or top in CONTRACT_MODULES or top in KIT_PACKAGES:
        return None
    importers = []
    for rel in sorted(files):
        if rel.endswith(".py"):
            try:
                with open(os.path.join(workdir, rel), encoding="utf-8", errors="replace") as f:
                    names = _top_level_imports(f.read())
            except OSError:
                continue
            if top in {n.split(".")[0] for n in names}:
                importers.append(rel)
    if not importers:
        return None  # the message names a module no file of the submission imports: a crash like any other
    shown = ", ".join(importers[:3]) + (f" and {len(importers) - 3} more" if len(importers) > 3 else "")
    return (f"{shown} import{'s' if len(importers) == 1 else ''} the module '{top}', which the grading environment "
            f"does not have (loading kv_cache.py raised ModuleNotFoundError), so nothing could be run: a submission "
            f"may import the standard library and NumPy (docs/contract.md). Install {top} beside the kit (in the "
            f"grader's Python environment) and grade again, or hand back a version without it (if '{top}' is a "
            f"file of yours, hand it back beside kv_cache.py)")


def provide_helpers(workdir: str, sources: list[str]) -> list[str]:
    """Copy into ``workdir`` the kit's helper files (``SHIPPED_HELPERS``) that ``sources`` import; return them.

    The classroom notebook's own-test cells may plant mistakes with
    ``catalogue.mutants``, which the starter bundle ships and the sandbox cannot
    see. The copy is the kit's own file, written where the import finds it (the
    submission's folder is on the sandbox's path) unless the submission has a
    file there already; it is not among the files ``materialize`` returns, so it
    is never graded, set aside or reported as the candidate's work.
    """
    wanted = set().union(*map(_imported_modules, sources)) if sources else set()
    written = []
    wanted |= {need for module in list(wanted) for need in HELPER_NEEDS.get(module, [])}
    for module, rel in SHIPPED_HELPERS.items():
        if module not in wanted:
            continue
        target = os.path.join(workdir, *HELPER_TARGETS.get(module, rel).split("/"))
        if os.path.lexists(target):
            continue
        source = os.path.join(KIT_ROOT, *rel.split("/"))
        if not os.path.isfile(source):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)  # a link in the kit's tree is copied as the file it names
        package = os.path.join(os.path.dirname(target), "__init__.py")
        if module.startswith("kv_helpers.") and not os.path.lexists(package):
            open(package, "w").close()
        written.append(HELPER_TARGETS.get(module, rel))
    return written


def _write_notebook(path: str, workdir: str, skip: set[str] = frozenset(), notes: list | None = None) -> list[str]:
    """Write the notebook's files (``notebook_files``) into ``workdir``, those named in ``skip`` excepted;
    ``notes`` gets ``notebook_files``' notes."""
    # JSON can carry a lone surrogate (\\ud800), which no UTF-8 file can: it becomes "?", as the bytes
    # of a .py file that are not UTF-8 become U+FFFD when it is read.
    files = {name: text.encode("utf-8", "replace").decode("utf-8")
             for name, text in notebook_files(path, notes).items() if name not in skip}
    for name, text in files.items():
        with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
            f.write(text)
    provide_helpers(workdir, list(files.values()))
    return sorted(files)


def _is_venv(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, VENV_MARKER))


def _venv_note(folders: list[str]) -> str:
    """The report's note for the virtual environments set aside (a few named, the rest counted)."""
    shown = ", ".join(f[:80] for f in sorted(folders)[:5]) + (f" and {len(folders) - 5} more" if len(folders) > 5
                                                               else "")
    return f"set aside {shown}: a virtual environment (pyvenv.cfg), not read"


def _inner_folder(path: str) -> str:
    """``path``, or the folder inside it that holds the work when ``path`` only wraps it: no
    kv_cache.py, no other Python file or notebook of its own, and one folder (not a venv) inside,
    as a hand-back copied or unzipped into a folder of its own gives (``frank/kvkit-takehome/``),
    when that folder holds a kv_cache.py or a notebook."""
    inner = path
    for _ in range(MAX_DEPTH):
        try:
            entries = [e for e in os.listdir(inner) if not e.startswith((".", "__MACOSX")) and e not in SKIP_DIRS]
        except OSError:
            return path
        code = [e for e in entries if e.endswith((".py", ".ipynb")) and os.path.isfile(os.path.join(inner, e))]
        folders = [e for e in entries if os.path.isdir(os.path.join(inner, e))
                   and not os.path.islink(os.path.join(inner, e)) and not _is_venv(os.path.join(inner, e))]
        if code or len(folders) != 1:
            break
        inner = os.path.join(inner, folders[0])
    try:
        holds_work = any((e == "kv_cache.py" or e.endswith(".ipynb")) and os.path.isfile(os.path.join(inner, e))
                         for e in os.listdir(inner))
    except OSError:
        return path
    return inner if holds_work else path


def check_count(path: str, files: list[str]) -> None:
    """Refuse a hand-back that would lay out more than ``MAX_LAID_OUT`` files and folders.

    ``files`` are the paths (relative, ``/`` or ``os.sep`` between parts) of
    the files the layout would write, counted before any is copied; each
    folder they need counts too (a folder is a file to the sandbox's working
    folder, whose tmpfs holds a bounded number of them).

    Raises:
        SubmissionError: past the bound, with the count, the folder that holds
            most of them, and what to hand back instead.
    """
    under: dict[str, int] = {}  # files under each folder, at any depth
    for rel in files:
        parts = rel.replace(os.sep, "/").split("/")
        for k in range(1, len(parts)):
            folder = "/".join(parts[:k])
            under[folder] = under.get(folder, 0) + 1
    if len(files) + len(under) <= MAX_LAID_OUT:
        return
    # The deepest folder that holds most of them: where the bulk is (a data or package folder).
    most = [f for f, n in under.items() if n * 2 > len(files)]
    top = max(most, key=lambda f: f.count("/"), default="")
    where = f", {under[top]:,} of the files under {top[:80]}/" if top else ""
    folders = f"{len(under):,} folder{'s' if len(under) != 1 else ''}"
    raise SubmissionError(
        f"{path}: the hand-back holds {len(files):,} files in {folders} to lay out{where} (at most "
        f"{MAX_LAID_OUT:,} files and folders together are read); hand back only your work (kv_cache.py, your "
        f"tests, cost.py, the port) without generated files, data or environments")


def _shown(rel: str, limit: int = 120) -> str:
    """A hand-back's relative path for a reason: its end, cut, so a path of thousands of bytes stays short."""
    return rel if len(rel) <= limit else "..." + rel[-limit:]


def materialize(path: str, workdir: str, notes: list | None = None) -> list[str]:
    """Copy the submission at ``path`` into the empty ``workdir``; return the files written.

    ``notes``, when given, gets one line for each thing of the hand-back read
    otherwise than as it lies: a virtual environment set aside, the folder
    inside a wrapper folder taken as the submission.

    Raises:
        SubmissionError: ``path`` is missing, not .py/.ipynb/a directory, or too large.
    """
    notes = [] if notes is None else notes
    if os.path.islink(path):
        raise SubmissionError(f"{path}: a symbolic link; hand in the file or folder itself")
    if not os.path.exists(path):
        raise SubmissionError(f"{path}: no such file or directory")
    if not (os.path.isfile(path) or os.path.isdir(path)):  # a FIFO or a device: reading it could block forever
        raise SubmissionError(f"{path}: not a regular file or folder")
    if os.path.isfile(path) and path.endswith(".zip"):
        return _materialize_zip(path, workdir, notes)
    if os.path.isfile(path):
        if path.endswith(".ipynb"):
            return _write_notebook(path, workdir, notes=notes)
        if path.endswith(".py"):
            if os.path.getsize(path) > MAX_FILE_BYTES:
                raise SubmissionError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
            with open(path, encoding="utf-8", errors="replace") as f:
                source = f.read()
        else:
            raise SubmissionError(f"{path}: a submission is a directory (or a .zip of one), a .py file or a .ipynb notebook")
        with open(os.path.join(workdir, "kv_cache.py"), "w", encoding="utf-8") as f:
            f.write(source)
        return ["kv_cache.py"]
    inner = _inner_folder(path)
    if inner != path:
        notes.append(f"graded the folder {os.path.relpath(inner, path)}/ inside the hand-back: the folders "
                     f"around it hold nothing else")
        path = inner
    picked, venvs_aside = [], []
    for root, dirs, files in os.walk(path, followlinks=False):
        venvs = [d for d in dirs if _is_venv(os.path.join(root, d))]
        venvs_aside += [os.path.relpath(os.path.join(root, d), path) + "/" for d in venvs]
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not os.path.islink(os.path.join(root, d))
                   and d not in venvs]
        if os.path.relpath(root, path).count(os.sep) + 2 > MAX_DEPTH:
            dirs[:] = []  # deeper is not read (and os.walk recurses: a deep enough tree would end it)
        for name in files:
            src = os.path.join(root, name)
            if os.path.islink(src) or not os.path.isfile(src) or not name.endswith((".py", ".txt", ".md", ".toml", ".json", ".npy")):
                continue
            picked.append((src, os.path.relpath(src, path)))
    check_count(path, [rel for _, rel in picked])  # before anything is copied
    written, total = [], 0
    for src, rel in picked:
        size = os.path.getsize(src)
        if size > MAX_FILE_BYTES or total + size > MAX_TOTAL_BYTES:
            continue
        total += size
        try:
            os.makedirs(os.path.dirname(os.path.join(workdir, rel)) or workdir, exist_ok=True)
            shutil.copyfile(src, os.path.join(workdir, rel))
        except OSError as exc:  # a path the grader's folder cannot hold (too long, ...): the hand-back's doing
            raise SubmissionError(f"{path}: its file {_shown(rel)} could not be laid out for grading "
                                  f"({exc.strerror or type(exc).__name__}); hand back your files in a "
                                  f"shallower folder with shorter names") from exc
        written.append(rel)
    if venvs_aside:
        notes.append(_venv_note(venvs_aside))
    if "kv_cache.py" not in written:
        regular = lambda p: os.path.isfile(p) and not os.path.islink(p)  # noqa: E731 - never a FIFO (it blocks)
        ipynbs = sorted(n for n in os.listdir(path) if n.endswith(".ipynb") and regular(os.path.join(path, n)))
        if not ipynbs:
            # nbgrader's layout, submitted/<student>/<assignment>/<notebook>.ipynb: one notebook one level down.
            nested = sorted(os.path.join(d, n) for d in os.listdir(path)
                            if os.path.isdir(os.path.join(path, d)) and not os.path.islink(os.path.join(path, d))
                            and d not in SKIP_DIRS
                            for n in os.listdir(os.path.join(path, d))
                            if n.endswith(".ipynb") and regular(os.path.join(path, d, n)))
            ipynbs = nested if len(nested) == 1 else []
        if ipynbs:  # the folder's own files win over the notebook's
            written += _write_notebook(os.path.join(path, ipynbs[0]), workdir, skip=set(written), notes=notes)
    return sorted(written)


# What the sandbox's launcher says when the hand-back's files do not fit its working folder (a tmpfs bounded
# in bytes and in files: both read as "no space"), or a name it cannot hold.
NO_ROOM = ("[Errno 28]", "No space left on device", "[Errno 122]", "Disk quota exceeded", "[Errno 36]",
           "File name too long")


def sandbox_refusal(workdir: str, output_tail: str, max_files: int, max_bytes: int) -> str | None:
    """Why a sandbox that never reached a task could not start because of the hand-back, or None.

    ``workdir`` holds the hand-back as laid out; ``max_files`` and
    ``max_bytes`` are what the sandbox's working folder holds (files and
    folders; bytes); ``output_tail`` is what the sandbox printed before any
    task (the kit's launcher and harness only: no file of the submission has
    run by then). The hand-back's doing when it holds more than that folder
    does, or when the launcher failed for want of room or on a name; None
    otherwise (then the kit failed, not the hand-back).
    """
    count, size = 0, 0
    for root, dirs, files in os.walk(workdir, followlinks=False):
        count += len(dirs) + len(files)
        for name in files:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    said = next((line.strip() for line in reversed((output_tail or "").splitlines())
                 if any(mark in line for mark in NO_ROOM)), "")
    if count < max_files and size < max_bytes and not said:
        return None
    why = f" (the sandbox said: {said[:200]})" if said else ""
    return (f"the sandbox could not lay out the hand-back: {count:,} files and folders, {size:,} bytes, where its "
            f"working folder holds {max_files:,} files and {max_bytes // 2**20} MiB{why}; hand back only your work "
            f"(kv_cache.py, your tests, cost.py, the port) without generated files, data or environments")


def laid_out_sha256(workdir: str, files: list[str]) -> str:
    """SHA-256 of the hand-back as laid out: each file's path and bytes, in path order. What was graded,
    whatever the form it came in (a folder, a zip, a notebook's cells), so that a batch's ``--resume``
    tells a hand-back changed since its report from one that was not."""
    import hashlib

    digest = hashlib.sha256()
    for rel in sorted(files):
        with open(os.path.join(workdir, rel), "rb") as f:
            data = f.read()
        digest.update(f"{rel}\0{len(data)}\0".encode("utf-8", "surrogateescape"))
        digest.update(data)
    return digest.hexdigest()


def hand_back_sha256(path: str) -> str | None:
    """``laid_out_sha256`` of the hand-back at ``path`` now (laid out in a scratch folder, then removed);
    None when it cannot be laid out (gone, unreadable: a report's reason says which)."""
    scratch = tempfile.mkdtemp(prefix=f"kvkit-resume-{os.getpid()}-")
    try:
        return laid_out_sha256(scratch, materialize(path, scratch))
    except Exception:  # noqa: BLE001 - whatever the hand-back does to the layout, it is graded again, and its
        return None  # report says what went wrong; one hand-back never ends the batch here
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _zip_directory(path: str) -> tuple[int, int]:
    """``(entries, central directory bytes)`` as the zip's end records announce them, read before the
    directory is parsed (zip64 records included); ``(0, 0)`` when there is no end record (zipfile says so).

    zipfile parses the directory by its announced size, whatever the announced count: both are bounded.
    """
    import struct

    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - 65536 - 22)
        f.seek(start)
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + 22 > len(tail):
            return 0, 0
        entries, cd_bytes = struct.unpack_from("<HI", tail, at + 10)
        locator = at - 20
        if (entries == 0xFFFF or cd_bytes == 0xFFFFFFFF) and locator >= 0 and tail[locator:locator + 4] == b"PK\x06\x07":
            f.seek(struct.unpack_from("<Q", tail, locator + 8)[0])
            record = f.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                entries, cd_bytes = struct.unpack_from("<QQ", record, 32)
    return entries, cd_bytes


def _zip_name(name: str) -> str:
    """An entry's name with ``/`` between its parts and no ``.`` part (some tools write ``./kv_cache.py``)."""
    return "/".join(p for p in name.replace("\\", "/").split("/") if p != ".")


def _materialize_zip(path: str, workdir: str, notes: list) -> list[str]:
    """A zipped directory: its regular files extracted (no links, no absolute or ``..`` paths,
    bounded sizes) into a scratch folder, then laid out like a directory; a single top
    folder inside the zip is taken as the submission."""
    entries, cd_bytes = _zip_directory(path)
    if entries > MAX_ZIP_ENTRIES or cd_bytes > MAX_ZIP_DIRECTORY_BYTES:
        shown = f"{entries:,} entries" if entries > MAX_ZIP_ENTRIES else f"a directory of {cd_bytes:,} bytes"
        raise SubmissionError(f"{path}: a zip with {shown} (at most {MAX_ZIP_ENTRIES:,} entries are read); "
                              "zip only the submission's folder")
    scratch = tempfile.mkdtemp(prefix=f"kvkit-zip-{os.getpid()}-")
    try:
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:  # a name not in its announced UTF-8
            raise SubmissionError(f"{path}: not a readable zip ({type(exc).__name__})") from exc
        with archive:
            total = 0
            infos = archive.infolist()
            if len(infos) > MAX_ZIP_ENTRIES:
                raise SubmissionError(f"{path}: a zip of {len(infos):,} entries (at most {MAX_ZIP_ENTRIES:,} "
                                      "are read); zip only the submission's folder")
            # A virtual environment the candidate zipped with their work (its pyvenv.cfg names its folder)
            # is set aside, as in a folder: neither its files nor their bytes count.
            names = [_zip_name(i.filename) for i in infos]
            # The folder the work was zipped in may be a venv itself (`python -m venv .`): as the folder
            # walk never sets aside the folder it is given, only a venv inside that folder counts.
            tops = {n.split("/", 1)[0] for n in names if not n.startswith(("__MACOSX", "."))}
            top = next(iter(tops)) + "/" if len(tops) == 1 else ""
            venvs = {n[:-len(VENV_MARKER)] for n in names
                     if n.endswith("/" + VENV_MARKER) and n[:-len(VENV_MARKER)] != top}
            if venvs:
                notes.append(_venv_note([v[len(top):] if v.startswith(top) else v for v in venvs]))
            picked = []
            for info in infos:
                name = info.filename
                kind = stat.S_IFMT(info.external_attr >> 16)
                if info.is_dir() or (kind and kind != stat.S_IFREG):
                    continue  # directories are made as needed; links and devices are never extracted
                parts = _zip_name(name).split("/")
                if name.startswith("/") or ".." in parts or any(p in SKIP_DIRS for p in parts):
                    continue
                if not name.endswith(ZIP_SUFFIXES) or len(parts) > MAX_DEPTH:
                    continue  # nothing the layout reads (a submission is a few folders deep, too)
                # In a venv when one of its folders is: a set lookup per folder, so that many markers cost
                # no more than many files (a prefix test against every venv was quadratic).
                if venvs and any("/".join(parts[:k]) + "/" in venvs for k in range(1, len(parts))):
                    continue
                picked.append((info, parts))
            # The files the layout would read, counted before any is extracted, as from inside the zip's one
            # top folder (the folder a hand-back zipped holds), as a folder hand-back is counted.
            check_count(path, ["/".join(parts[1:] if top and parts[0] + "/" == top and len(parts) > 1 else parts)
                               for _, parts in picked])
            for info, parts in picked:
                name = info.filename
                if info.file_size > MAX_FILE_BYTES or total + info.file_size > MAX_TOTAL_BYTES:
                    continue  # only what is extracted counts, as in a folder: a big file first drops nothing after it
                total += info.file_size
                target = os.path.join(scratch, *parts)
                try:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with archive.open(info) as src, open(target, "wb") as dst:
                        dst.write(src.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES])
                except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, zlib.error,
                        lzma.LZMAError) as exc:
                    # A damaged entry, a file where a folder should be, a name too long, encryption: the
                    # hand-back cannot be read, which its owner can fix.
                    raise SubmissionError(f"{path}: the zip could not be unpacked at {name[:80]!r} "
                                          f"({type(exc).__name__}); zip the folder again") from exc
        # The zip's top folder, and any folder that only wraps the work, are laid out by the folder walk
        # (no note for the usual single top folder).
        entries = [e for e in os.listdir(scratch) if not e.startswith((".", "__MACOSX"))]
        root = os.path.join(scratch, entries[0]) if len(entries) == 1 and os.path.isdir(
            os.path.join(scratch, entries[0])) else scratch
        return materialize(root, workdir, notes)
    finally:
        subprocess.run(["rm", "-rf", "--", scratch], check=False)
