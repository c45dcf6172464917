"""The candidate's take-home bundle: what goes in, built and checked (``kvkit starter`` is its face).

The bundle is the learner's path, standing alone: the stub files, the visible
step tests, a README for the candidate (the task, the contract, how to run
the tests, what to hand back), ``steps.toml`` (without its hints, which come
close to the answers; ``--hints`` keeps them for a learner's copy), ``progress.py`` (a copy of kvkit/progress.py, which needs
only the standard library and, optionally, rich) and the catalogue's planted
mutants for step 7 (``catalogue/mutants.py`` and a public ``mistakes.toml``: they
hold no answer). Nothing of ``solutions/``, ``grader/`` or the hidden trials
goes in, and the build checks it: it refuses when a stub has been filled in
or when any bundled file shares a non-trivial line with those directories.
"""
from __future__ import annotations

import ast
import importlib.metadata
import shutil
import tomllib
import zipfile
from pathlib import Path

KIT = Path(__file__).resolve().parents[2]
EXERCISES = KIT / "exercises"

# What goes in, relative to the exercises directory (tests/*.py are added to it).
TOP_FILES = ["README.md", "kv_cache.py", "kv_cache_torch.py", "cost.py", "test_mine.py", "steps.toml", "pytest.ini"]
STUBS = ["kv_cache.py", "kv_cache_torch.py", "cost.py", "test_mine.py"]
CATALOGUE_FILES = ["mutants.py", "structure.py", "rules.py", "mistakes.toml"]
# Never bundled, and checked against: no bundled file may share a non-trivial line with them.
PRIVATE_DIRS = ["solutions", "grader"]
BUNDLED_PACKAGES = ["numpy", "pytest", "rich", "torch"]
# The build refuses a bundle holding this many consecutive non-trivial lines of solutions/ or grader/
# (copied code); the kit's tests hold it to no shared non-trivial line at all.
COPIED_RUN = 3


class BuildError(Exception):
    """The bundle cannot be built (exit code 2)."""


def manifest(exercises: Path = EXERCISES, kit: Path = KIT) -> dict[str, Path]:
    """``{path in the bundle: source file}`` for everything the bundle holds except the generated files.

    Raises:
        BuildError: a file the bundle needs is missing.
    """
    files = {name: exercises / name for name in TOP_FILES}
    for test in sorted((exercises / "tests").glob("*.py")):
        files[f"tests/{test.name}"] = test
    for name in CATALOGUE_FILES:
        files[f"catalogue/{name}"] = kit / "catalogue" / name
    files["progress.py"] = kit / "kvkit" / "progress.py"
    missing = [str(src) for src in files.values() if not src.is_file()]
    if missing:
        raise BuildError(f"missing from the kit: {', '.join(missing)}")
    return files


def unfinished_functions(path: Path) -> tuple[list[str], list[str]]:
    """``(stubbed, filled)``: names of the functions in ``path`` whose body raises NotImplementedError, and the rest."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    stubbed, filled = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raises = any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n.exc or n)
                         for n in ast.walk(node))
            (stubbed if raises else filled).append(node.name)
    return stubbed, filled


def check_stubs(exercises: Path = EXERCISES) -> None:
    """Refuse to bundle stub files someone has filled in (say, by working through the exercises in the kit).

    Raises:
        BuildError: a function of a stub file no longer raises NotImplementedError.
    """
    for name in STUBS:
        stubbed, filled = unfinished_functions(exercises / name)
        if filled or not stubbed:
            raise BuildError(f"{exercises / name} has been filled in ({', '.join(filled) or 'no stub left'} "
                             f"no longer raise NotImplementedError); the bundle ships the stubs. Restore them "
                             f"with `git checkout -- exercises/` first.")


def _normal(line: str) -> str:
    return " ".join(line.split())


CONTROL = ("for ", "while ", "with ", "try:", "else:", "finally:", "except", "elif ", "pass", "break", "continue")


def is_trivial(line: str) -> bool:
    """Lines any two Python files may share: short ones, comments, imports, headers of defs, classes and control flow."""
    text = _normal(line)
    return (len(text) < 30 or text.startswith(("#", "import ", "from ", "def ", "class ", "@", "async def ", *CONTROL))
            or text in ('"""', "'''"))


def code_lines(path: Path) -> list[str]:
    """The normalised non-trivial lines of a text file, in order ([] for a binary file).

    In Python files, the lines of a function's signature are trivial too: the
    contract fixes them, so a stub shares them with any implementation.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    skip: set[int] = set()
    if path.suffix == ".py":
        try:
            tree = ast.parse(text)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree is not None else []:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
                skip.update(range(node.lineno, node.body[0].lineno))
    return [_normal(line) for i, line in enumerate(text.splitlines(), start=1)
            if i not in skip and not is_trivial(line)]


def _private_files(kit: Path):
    for folder in PRIVATE_DIRS:
        root = kit / folder
        if root.is_dir():
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    yield path


def shared_lines(bundle: Path, kit: Path = KIT, run: int = 1) -> list[tuple[str, str, str]]:
    """Code a bundled file shares with solutions/ or grader/: ``(bundle file, first line, private file)``.

    With ``run=1`` every shared non-trivial line counts; with ``run=n``, only
    ``n`` consecutive non-trivial lines found in the same order in one private
    file (copied code, not a coincidence of idiom).
    """
    grams: dict[tuple, str] = {}
    for path in _private_files(kit):
        lines = code_lines(path)
        for i in range(len(lines) - run + 1):
            grams.setdefault(tuple(lines[i:i + run]), str(path.relative_to(kit)))
    found = []
    for path in sorted(bundle.rglob("*")):
        if not path.is_file():
            continue
        lines = code_lines(path)
        for i in range(len(lines) - run + 1):
            key = tuple(lines[i:i + run])
            if key in grams:
                found.append((str(path.relative_to(bundle)), lines[i], grams[key]))
    return found


def requirements() -> str:
    """requirements.txt for the bundle: the kit's own pins of numpy, pytest, rich and torch."""
    pins = {}
    try:
        for req in importlib.metadata.requires("kvkit") or []:
            spec = req.split(";")[0].strip()
            name = spec.split("=")[0].split("<")[0].split(">")[0].strip().lower()
            if name in BUNDLED_PACKAGES and ";" not in req:
                pins[name] = spec
    except importlib.metadata.PackageNotFoundError:
        pass
    lines = ["# What the exercises need: pip install -r requirements.txt",
             pins.get("numpy", "numpy"), pins.get("pytest", "pytest"),
             "# progress.py prints in colour with rich (optional)", pins.get("rich", "rich"),
             "# step 6, the PyTorch port (optional in the take-home): uncomment, or pip install torch",
             "# " + pins.get("torch", "torch")]
    return "\n".join(lines) + "\n"


# The keys of a step in steps.toml that come close to the answers: left out of a candidate's bundle.
HINT_KEYS = ("hints", "missed")


def steps_without_hints(text: str) -> str:
    """steps.toml with every step's hints emptied and step 7's ways to catch each mistake left out (the rest as it was)."""
    data = tomllib.loads(text)
    out = ["# The learner's path: step order, goals, the steps each builds on and test files",
           "# (hints left out of this bundle).", ""]
    for step in data.get("step", []):
        out.append("[[step]]")
        for key, value in step.items():
            if key == "hints":
                value = []
            elif key in HINT_KEYS:
                continue
            out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


# What a candidate may read of the mistakes catalogue: no question, answer or rubric effect.
PUBLIC_MISTAKE_FIELDS = ("title", "what", "mutant")


def public_mistakes(text: str) -> str:
    """mistakes.toml as the bundle ships it: each mistake's title, what it is and whether a mutant is planted.

    The interviewer's follow-up questions and expected answers, and the rubric's
    effect of each mistake, stay with the kit.
    """
    data = tomllib.loads(text)
    out = ["# The planted mistakes of step 7: what each one does (catalogue/mutants.py plants them).", ""]
    for mid, entry in data.items():
        out.append(f"[{mid}]")
        out += [f"{key} = {_toml_value(entry[key])}" for key in PUBLIC_MISTAKE_FIELDS if key in entry]
        out.append("")
    return "\n".join(out)


def bundle_contents(hints: bool = False, exercises: Path = EXERCISES, kit: Path = KIT) -> dict[str, bytes]:
    """``{path in the bundle: bytes}``: every file ``build`` writes, as it writes it.

    Raises:
        BuildError: a file the bundle needs is missing.
    """
    contents = {}
    for rel, src in manifest(exercises, kit).items():
        if rel == "steps.toml" and not hints:
            contents[rel] = steps_without_hints(src.read_text(encoding="utf-8")).encode()
        elif rel == "catalogue/mistakes.toml":
            contents[rel] = public_mistakes(src.read_text(encoding="utf-8")).encode()
        else:
            contents[rel] = src.read_bytes()
    contents["requirements.txt"] = requirements().encode()
    return contents


def bundle_fingerprints() -> dict[str, str]:
    """``{sha256 of a file: its path in the bundle}`` over both bundles (with and without hints).

    The grader sets a handed-back file aside when its bytes are the bundle's
    own (a candidate who zips the whole working folder back), and grades the rest.
    """
    import hashlib

    found = {}
    for hints in (False, True):
        for rel, data in bundle_contents(hints).items():
            found.setdefault(hashlib.sha256(data).hexdigest(), rel)
    return found


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def build(outdir: Path, hints: bool = False, force: bool = False, exercises: Path = EXERCISES,
          kit: Path = KIT) -> list[Path]:
    """Write the bundle into ``outdir`` and return the files written.

    Raises:
        BuildError: ``outdir`` is not empty (and ``force`` is off, or it does not
            look like an earlier bundle), a stub has been filled in, a file is
            missing, or a bundled file shares a non-trivial line with solutions/ or grader/.
    """
    outdir = outdir.expanduser().resolve()
    if outdir.exists() and any(outdir.iterdir()):
        if not force:
            raise BuildError(f"{outdir} exists and is not empty (pass --force to replace an earlier bundle)")
        if not (outdir / "steps.toml").is_file() or not (outdir / "progress.py").is_file():
            raise BuildError(f"{outdir} does not look like an earlier starter bundle; not replacing it")
        shutil.rmtree(outdir)
    if outdir == kit or kit in outdir.parents and outdir.parts[len(kit.parts)] in ("exercises", *PRIVATE_DIRS):
        raise BuildError(f"{outdir} is inside the kit's own directories; choose another place")
    check_stubs(exercises)
    contents = bundle_contents(hints, exercises, kit)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, data in contents.items():
        dest = outdir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        written.append(dest)
    leaks = shared_lines(outdir, kit, run=COPIED_RUN)
    if leaks:
        shutil.rmtree(outdir)
        sample = "; ".join(f"{f}: {line!r} (also in {src})" for f, line, src in leaks[:3])
        raise BuildError(f"refusing to ship: {len(leaks)} run(s) of {COPIED_RUN} lines of the bundle also appear "
                         f"in solutions/ or grader/: {sample}")
    return written


def write_zip(outdir: Path) -> Path:
    """``outdir.zip`` next to ``outdir``, holding the bundle under a top folder of the same name."""
    outdir = outdir.expanduser().resolve()
    target = outdir.with_name(outdir.name + ".zip")
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(outdir.rglob("*")):
            if path.is_file():
                zf.write(path, Path(outdir.name) / path.relative_to(outdir))
    return target
