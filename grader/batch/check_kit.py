"""``kvkit check-kit``: the kit's own data checked against its code, as ``rustlings dev check`` does.

    kvkit check-kit                     every check; exit 0 when all agree, 1 with one line per problem
    kvkit check-kit --only catalogue    one check (repeat ``--only`` for more)

The kit keeps much of what it knows in data files that code reads by id: the mistakes catalogue
(``catalogue/mistakes.toml``), the learner's steps (``exercises/steps.toml``), the rubric
(``grader/rubric.toml``), the bundled examples' verdicts (``catalogue/examples/expected.toml``), the
notebook's two copies and the starter bundle's manifest. An id renamed on one side and not the other
fails only when that path runs; this command reads every file and says, one plain sentence per
problem naming the file and the id, where data and code are out of step. It grades nothing and runs
no learner or candidate code, so it takes about a second.

Each check is a function of no argument that returns a list of problems (``[]`` when all agree). They
read the files through this module's path constants (``MISTAKES``, ``STEPS`` ...), so a test can point
one at a broken copy. The kit's tests call the same functions (``tests/test_check_kit.py``).
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import tomllib
from pathlib import Path

from grader import KIT_ROOT

KIT = Path(KIT_ROOT)
MISTAKES = KIT / "catalogue" / "mistakes.toml"
INTERVIEW = KIT / "catalogue" / "interview.toml"
EXAMPLES = KIT / "catalogue" / "examples"
EXPECTED = EXAMPLES / "expected.toml"
EXERCISES = KIT / "exercises"
STEPS = EXERCISES / "steps.toml"
RUBRIC = KIT / "grader" / "rubric.toml"
SCHEMA = KIT / "docs" / "report.schema.json"
NOTEBOOK_TEXT = KIT / "notebooks" / "kv_cache.pct.py"
NOTEBOOK = KIT / "notebooks" / "source" / "kv_cache" / "kv_cache.ipynb"

# What each mistake of the catalogue must give (mistakes.toml's header says what each field means).
MISTAKE_TEXT_FIELDS = ("title", "what", "shown_by", "criterion", "example", "question", "answer")
# The ways a mistake is shown, as the catalogue's header lists them; grade.py reads "structure" and
# "reproduction" to say a mistake was recovered from the outputs.
SHOWN_BY = ("structure", "reproduction", "memory", "time", "overflow", "padding")
# The keys an example's entry in expected.toml may have (its header says what each means).
EXAMPLE_KEYS = ("tier", "mistakes", "port_mistakes", "refuses", "fails")
# The packages a starter bundle may never import: the reference, the grader, the kit's command, the bench.
PRIVATE_PACKAGES = ("solutions", "grader", "kvkit", "benchmarks")


def _rel(path: Path) -> str:
    """``path`` as a maintainer reads it: relative to the kit when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(KIT.resolve()))
    except ValueError:
        return str(path)


def _toml(path: Path) -> tuple[dict | None, list[str]]:
    """``(data, [])`` for a readable TOML file, ``(None, [the problem])`` otherwise."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f), []
    except FileNotFoundError:
        return None, [f"{_rel(path)}: missing"]
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return None, [f"{_rel(path)}: cannot be read: {exc}"]


def _catalogue_ids() -> set | None:
    """The mistake ids of the catalogue, or None when it cannot be read (``check_catalogue`` says why)."""
    data, _ = _toml(MISTAKES)
    return set(data) if data is not None else None


def _registry() -> tuple[dict, str]:
    """``(REGISTRY, how a message names it)``: the criteria registry, ``{criterion id: its spec}``."""
    from grader.stages import registry

    return registry.REGISTRY, f"the criteria registry ({_rel(Path(registry.__file__))} REGISTRY)"


# --------------------------------------------------------------------------- the catalogue

def check_catalogue() -> list[str]:
    """The mistakes catalogue against the code that reads its ids.

    Checks that every entry of ``catalogue/mistakes.toml`` has its fields (a known ``shown_by``, a
    ``criterion`` of the criteria registry ``grader/stages/registry.py`` ``REGISTRY``, ``mutant`` true or
    false); that ``mutant = true`` matches ``catalogue/mutants.py`` ``PLANTED``, and that every planted
    mutant, variant and window rule there, every pattern of ``catalogue/structure.py`` and the report
    schema's list of mistakes (``docs/report.schema.json``) name catalogued mistakes; and that every
    follow-up question of ``catalogue/interview.toml`` names a known criterion.

    Returns the problems, one sentence each naming the file and the id ([] when all agree). Raises nothing
    for bad data (an unreadable file is a problem).
    """
    from catalogue import mutants, structure

    registered, registry = _registry()

    data, problems = _toml(MISTAKES)
    if data is None:
        return problems
    where = _rel(MISTAKES)
    for mid, fields in data.items():
        if not isinstance(fields, dict):
            problems.append(f"{where}: {mid} is not a table ([{mid}] with its fields)")
            continue
        for key in MISTAKE_TEXT_FIELDS:
            if not isinstance(fields.get(key), str) or not fields[key].strip():
                problems.append(f"{where}: {mid} has no {key} (a non-empty string)")
        if not isinstance(fields.get("mutant"), bool):
            problems.append(f"{where}: {mid} has no mutant = true or false")
        for key in sorted(set(fields) - {*MISTAKE_TEXT_FIELDS, "mutant"}):
            problems.append(f"{where}: {mid} has a field {key} that no code reads "
                            f"(the fields: {', '.join(MISTAKE_TEXT_FIELDS)}, mutant)")
        shown = fields.get("shown_by")
        if isinstance(shown, str) and shown.strip() and shown not in SHOWN_BY:
            problems.append(f"{where}: {mid} has shown_by = {shown!r}, not one of {', '.join(SHOWN_BY)}")
        criterion = fields.get("criterion")
        if isinstance(criterion, str) and criterion.strip() and criterion not in registered:
            problems.append(f"{where}: {mid} belongs to criterion {criterion!r}, which is not in {registry}")

    # The planted mutants: catalogue/mutants.py plants exactly the entries marked mutant = true.
    marked = {mid for mid, entry in data.items() if isinstance(entry, dict) and entry.get("mutant") is True}
    for mid in mutants.PLANTED:
        if mid not in data:
            problems.append(f"catalogue/mutants.py: PLANTED plants {mid}, which is not in {where}")
        elif mid not in marked:
            problems.append(f"catalogue/mutants.py: PLANTED plants {mid}, which {where} marks mutant = false")
    for mid in sorted(marked - set(mutants.PLANTED)):
        problems.append(f"{where}: {mid} says mutant = true, but catalogue/mutants.py PLANTED does not plant it")
    if mutants.MUST_CATCH not in mutants.PLANTED:
        problems.append(f"catalogue/mutants.py: MUST_CATCH is {mutants.MUST_CATCH}, which PLANTED does not plant")
    # Variants and window rules are named "<mistake id>" or "<mistake id>/<variant>".
    named = {"VARIANTS": set(mutants.VARIANTS) | {v for vs in mutants.VARIANTS.values() for v in vs},
             "WINDOWS": set(mutants.WINDOWS)}
    for table, names in named.items():
        for name in sorted(names):
            if structure.mistake_of(name) not in data:
                problems.append(f"catalogue/mutants.py: {table} names {name}, and {structure.mistake_of(name)} is "
                                f"not in {where}")
    for table, names in (("MASKS", structure.MASKS), ("HEAD_MAPS", structure.HEAD_MAPS),
                         ("LAYOUTS", structure.LAYOUTS)):
        for name in sorted(names):
            if name != "right" and structure.mistake_of(name) not in data:
                problems.append(f"catalogue/structure.py: {table} names {name}, and {structure.mistake_of(name)} "
                                f"is not in {where}")

    # The report schema lists the ids a report may name, in the catalogue's order.
    try:
        enum = json.loads(SCHEMA.read_text(encoding="utf-8"))["properties"]["mistakes"]["items"]["enum"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problems.append(f"{_rel(SCHEMA)}: no list of mistakes at properties.mistakes.items.enum ({exc})")
    else:
        for mid in [m for m in data if m not in enum]:
            problems.append(f"{_rel(SCHEMA)}: the mistakes enum lacks {mid}, which is in {where}")
        for mid in [m for m in enum if m not in data]:
            problems.append(f"{_rel(SCHEMA)}: the mistakes enum lists {mid}, which is not in {where}")
        if set(enum) == set(data) and list(enum) != list(data):
            problems.append(f"{_rel(SCHEMA)}: the mistakes enum is not in {where}'s order ({', '.join(data)})")

    # The interviewer's general questions each probe a criterion (asked when it did not pass).
    interview, trouble = _toml(INTERVIEW)
    problems += trouble
    for i, question in enumerate((interview or {}).get("general", []), start=1):
        criterion = question.get("criterion") if isinstance(question, dict) else None
        if criterion is not None and criterion not in registered:
            problems.append(f"{_rel(INTERVIEW)}: general question {i} names criterion {criterion!r}, which is not "
                            f"in {registry}")
    return problems


# --------------------------------------------------------------------------- the learner's steps

def check_steps() -> list[str]:
    """The learner's steps (``exercises/steps.toml``) against the files and mistakes they name.

    Checks that the steps are numbered 1, 2, ... in file order and each has a title, a goal and test
    files; that every test file it names exists, is named after its step (``tests/test_stepN_*.py``) and
    every ``exercises/tests/test_step*.py`` belongs to a step; that the file each ``fills`` names exists;
    that ``needs`` names steps that come before; and that the mistake ids of a ``missed`` table are
    catalogued and planted, with advice for every planted mutant (``kvkit progress`` shows it for each one
    the learner's tests miss).

    Returns the problems, one sentence each naming the file and the step ([] when all agree). Raises
    nothing for bad data.
    """
    from catalogue import mutants

    data, problems = _toml(STEPS)
    if data is None:
        return problems
    where = _rel(STEPS)
    steps = data.get("step")
    if not isinstance(steps, list) or not steps:
        return problems + [f"{where}: lists no [[step]]"]
    known = _catalogue_ids()
    seen: list[int] = []
    named_tests: set[str] = set()
    advised: set[str] = set()
    for i, step in enumerate(steps, start=1):
        number = step.get("number")
        label = f"step {number}" if isinstance(number, int) else f"the step in place {i}"
        if not isinstance(number, int) or isinstance(number, bool):
            problems.append(f"{where}: {label} has no whole number (number = {i})")
        elif number != i:
            problems.append(f"{where}: step {number} comes in place {i}; steps are numbered 1, 2, ... in file order")
        for key in ("title", "goal"):
            if not isinstance(step.get(key), str) or not step[key].strip():
                problems.append(f"{where}: {label} has no {key}")
        tests = step.get("tests")
        if not isinstance(tests, list) or not tests:
            problems.append(f"{where}: {label} names no test files (tests = [...])")
            tests = []
        for test in tests:
            named_tests.add(str(test))
            if not (EXERCISES / str(test)).is_file():
                problems.append(f"{where}: {label} names {test}, which is not in {_rel(EXERCISES)}/")
        if tests and isinstance(number, int) and not str(tests[0]).startswith(f"tests/test_step{number}_"):
            problems.append(f"{where}: {label}'s first test file {tests[0]} is not named tests/test_step{number}_*.py")
        fills = step.get("fills", "")
        target = fills.split(":")[0].strip() if isinstance(fills, str) else ""
        if target.endswith(".py") and not (EXERCISES / target).is_file():
            problems.append(f"{where}: {label} fills {target}, which is not in {_rel(EXERCISES)}/")
        needs = step.get("needs", [])
        for need in needs if isinstance(needs, list) else [needs]:
            if need not in seen:
                problems.append(f"{where}: {label} needs step {need}, which does not come before it")
        missed = step.get("missed", {})
        for mid in missed if isinstance(missed, dict) else []:
            advised.add(mid)
            if known is not None and mid not in known:
                problems.append(f"{where}: {label}'s missed table advises on {mid}, which is not in {_rel(MISTAKES)}")
            elif mid not in mutants.PLANTED:
                problems.append(f"{where}: {label}'s missed table advises on {mid}, which catalogue/mutants.py "
                                f"PLANTED does not plant (the advice is never shown)")
        if isinstance(number, int):
            seen.append(number)
    for mid in mutants.PLANTED:
        if mid not in advised:
            problems.append(f"{where}: no step's missed table says how a test catches the planted mistake {mid}")
    on_disk = {f"tests/{p.name}" for p in (EXERCISES / "tests").glob("test_step*.py")}
    for test in sorted(on_disk - named_tests):
        problems.append(f"{where}: no step names {test}, a step test in {_rel(EXERCISES)}/tests/")
    return problems


# --------------------------------------------------------------------------- the rubric

def check_rubric() -> list[str]:
    """The rubric (``grader/rubric.toml``) against the criteria registry, the tiers and the catalogue.

    Checks that every criterion of the registry (``grader/stages/registry.py`` ``REGISTRY``) has an entry
    and the rubric names no other; that each has numeric points, a tier it can be needed for (Hire, Strong
    Hire or none) and no title (titles are the registry's); that the points add up to ``max_score``; that
    ``weak_mistakes`` are catalogued, ``weak_when_wrong`` names rubric criteria, ``port_mistake_cap`` is a
    tier and each audience names every tier; and that ``grader.stages.rubric.load`` accepts the file.

    Returns the problems, one sentence each naming the file and the id ([] when all agree); unlike
    ``load``, which stops at the first, it lists them all. Raises nothing for bad data.
    """
    from grader.stages import rubric

    registered, registry = _registry()

    data, problems = _toml(RUBRIC)
    if data is None:
        return problems
    where = _rel(RUBRIC)
    # A criterion is needed for a tier above the lowest (which needs nothing), or for none (points only).
    criterion_tiers = (*rubric.TIERS[1:], "none")
    criteria = data.get("criteria")
    if not isinstance(criteria, dict) or not criteria:
        return problems + [f"{where}: no [criteria.*] tables"]
    for cid in criteria:
        if cid not in registered:
            problems.append(f"{where}: [criteria.{cid}] is not in {registry}")
    for cid in registered:
        if cid not in criteria:
            problems.append(f"{where}: criterion {cid} of the registry has no [criteria.{cid}] (points and tier)")
    total = 0.0
    for cid, spec in criteria.items():
        spec = spec if isinstance(spec, dict) else {}
        points = spec.get("points")
        if isinstance(points, bool) or not isinstance(points, (int, float)):
            problems.append(f"{where}: criterion {cid} has no numeric points")
        else:
            total += points
        if spec.get("tier") not in criterion_tiers:
            problems.append(f"{where}: criterion {cid} has tier {spec.get('tier')!r}, not one of "
                            f"{', '.join(criterion_tiers)}")
        if "title" in spec:
            problems.append(f"{where}: criterion {cid} has a title; titles come from {registry}")
    max_score = data.get("max_score", total)
    if not isinstance(max_score, (int, float)) or abs(float(max_score) - total) > 1e-9:
        problems.append(f"{where}: the criteria's points add up to {total:g}, not max_score = {max_score}")
    tiers = data.get("tiers", {})
    known = _catalogue_ids()
    for mid in tiers.get("weak_mistakes", []):
        if known is not None and mid not in known:
            problems.append(f"{where}: weak_mistakes names {mid}, which is not in {_rel(MISTAKES)}")
    for cid in tiers.get("weak_when_wrong", []):
        if cid not in criteria:
            problems.append(f"{where}: weak_when_wrong names {cid}, which is not a criterion of the rubric")
    cap = tiers.get("port_mistake_cap", rubric.TIERS[1])
    if cap not in rubric.TIERS:
        problems.append(f"{where}: port_mistake_cap is {cap!r}, not one of {', '.join(rubric.TIERS)}")
    for name, labels in (data.get("audiences") or {}).items():
        if not (isinstance(labels, list) and len(labels) == len(rubric.TIERS)
                and all(isinstance(x, str) for x in labels)):
            problems.append(f"{where}: audience {name} must list {len(rubric.TIERS)} names "
                            f"(for {', '.join(rubric.TIERS)})")
    if not problems:  # what load refuses that the lines above do not see
        try:
            rubric.load(str(RUBRIC))
        except rubric.RubricError as exc:
            problems.append(str(exc))
    return problems


# --------------------------------------------------------------------------- the bundled examples

def check_examples() -> list[str]:
    """The bundled examples (``catalogue/examples/``) against their expected verdicts and the catalogue.

    A data check: nothing is graded. Checks that every example folder has an entry in ``expected.toml``
    and every entry a folder holding ``kv_cache.py``; that each entry has a known tier and only known keys,
    its mistake ids are catalogued and its ``refuses`` and ``fails`` name registry criteria; that every
    catalogued mistake is expected by at least one example; and that each mistake's own ``example`` is a
    folder whose entry expects it.

    Returns the problems, one sentence each naming the file and the id ([] when all agree). Raises
    nothing for bad data.
    """
    from grader.stages.rubric import TIERS

    registered, registry = _registry()

    expected, problems = _toml(EXPECTED)
    if expected is None:
        return problems
    where = _rel(EXPECTED)
    mistakes, _ = _toml(MISTAKES)  # check_catalogue says when it cannot be read
    folders = {p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    for name in sorted(folders - set(expected)):
        problems.append(f"{_rel(EXAMPLES)}/{name}/ has no entry [{name}] in {where}")
    for name, want in expected.items():
        if name not in folders:
            problems.append(f"{where}: [{name}] has no folder {_rel(EXAMPLES)}/{name}/")
        elif not (EXAMPLES / name / "kv_cache.py").is_file():
            problems.append(f"{_rel(EXAMPLES)}/{name}/ holds no kv_cache.py, so it is no submission")
        if not isinstance(want, dict):
            problems.append(f"{where}: [{name}] is not a table")
            continue
        for key in sorted(set(want) - set(EXAMPLE_KEYS)):
            problems.append(f"{where}: [{name}] has an unknown key {key} (known: {', '.join(EXAMPLE_KEYS)})")
        if want.get("tier") not in TIERS:
            problems.append(f"{where}: [{name}] has tier {want.get('tier')!r}, not one of {', '.join(TIERS)}")
        if not isinstance(want.get("mistakes"), list):
            problems.append(f"{where}: [{name}] has no mistakes = [...] (empty when it makes none)")
        for key in ("mistakes", "port_mistakes"):
            for mid in want.get(key, []) if isinstance(want.get(key), list) else []:
                if mistakes is not None and mid not in mistakes:
                    problems.append(f"{where}: [{name}] expects {mid} in {key}, which is not in {_rel(MISTAKES)}")
        for key in ("refuses", "fails"):
            for cid in want.get(key, []):
                if cid not in registered:
                    problems.append(f"{where}: [{name}] {key} {cid!r}, which is not in {registry}")
    if mistakes is None:
        return problems

    def expects(name: str) -> set:
        entry = expected.get(name)
        return {m for key in ("mistakes", "port_mistakes") for m in (entry or {}).get(key, [])} \
            if isinstance(entry, dict) else set()

    shown = set().union(*(expects(name) for name in expected))
    for mid, entry in mistakes.items():
        if mid not in shown:
            problems.append(f"{_rel(MISTAKES)}: {mid} is expected by no example in {where}")
        example = entry.get("example") if isinstance(entry, dict) else None
        if not isinstance(example, str) or not example:
            continue  # check_catalogue says it has none
        if example not in folders:
            problems.append(f"{_rel(MISTAKES)}: {mid}'s example {example} has no folder {_rel(EXAMPLES)}/{example}/")
        elif mid not in expects(example):
            problems.append(f"{_rel(MISTAKES)}: {mid}'s example {example} does not expect it in {where}")
    return problems


# --------------------------------------------------------------------------- the notebook

def rebuild_command() -> str:
    """The command that makes the notebook's ``.ipynb`` from its text source (run from the kit's root)."""
    return f".venv/bin/jupytext --update --to ipynb -o {_rel(NOTEBOOK)} {_rel(NOTEBOOK_TEXT)}"


def check_notebook() -> list[str]:
    """The class notebook's ``.ipynb`` against its text source (``notebooks/kv_cache.pct.py``).

    Checks that ``notebooks/source/kv_cache/kv_cache.ipynb`` has the cells (type, source, metadata) and
    the kernel that jupytext makes of the text file, which is the one that is edited.

    Returns the problems, one sentence each naming the file and the cells that differ, with the command
    that rebuilds the ``.ipynb`` ([] when the two agree). Needs jupytext (the kit's ``dev`` extras): without
    it, that is the problem returned. Raises nothing for bad data.
    """
    from grader.stages.layout import without_iri_format_checker

    for path in (NOTEBOOK_TEXT, NOTEBOOK):
        if not path.is_file():
            return [f"{_rel(path)}: missing"]
    without_iri_format_checker()  # before nbformat: its optional checker costs seconds to import
    try:
        import jupytext
        import nbformat
    except ImportError as exc:
        return [f"{_rel(NOTEBOOK)}: cannot be compared with {_rel(NOTEBOOK_TEXT)}: {exc.name} is not installed "
                f"(pip install -e '.[dev]')"]
    try:
        made = jupytext.read(NOTEBOOK_TEXT)
    except Exception as exc:  # jupytext raises many kinds; any of them means the text cannot be read
        return [f"{_rel(NOTEBOOK_TEXT)}: jupytext cannot read it: {type(exc).__name__}: {exc}"]
    try:
        committed = nbformat.read(NOTEBOOK, as_version=4)
    except Exception as exc:  # nbformat's reader raises JSON, validation and version errors alike
        return [f"{_rel(NOTEBOOK)}: nbformat cannot read it: {type(exc).__name__}: {exc}"]
    stale = f"{_rel(NOTEBOOK)} is stale: "
    fix = f"; edit {_rel(NOTEBOOK_TEXT)}, then run {rebuild_command()}"
    problems = []
    cells = lambda nb: [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells]  # noqa: E731
    ours, theirs = cells(made), cells(committed)
    if len(ours) != len(theirs):
        problems.append(f"{stale}it has {len(theirs)} cells where jupytext makes {len(ours)} of "
                        f"{_rel(NOTEBOOK_TEXT)}{fix}")
    else:
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs), start=1) if a != b]
        if differ:
            first = theirs[differ[0] - 1][1].strip().splitlines()
            problems.append(f"{stale}{len(differ)} cell(s) differ from what jupytext makes of {_rel(NOTEBOOK_TEXT)}, "
                            f"cells {', '.join(map(str, differ[:5]))}{' ...' if len(differ) > 5 else ''} (cell "
                            f"{differ[0]} begins {first[0][:60] if first else ''!r}){fix}")
    if made.metadata.get("kernelspec") != committed.metadata.get("kernelspec"):
        problems.append(f"{stale}its kernelspec is not the one in {_rel(NOTEBOOK_TEXT)}'s header{fix}")
    return problems


# --------------------------------------------------------------------------- the starter bundle

def check_bundle() -> list[str]:
    """The starter bundle's contents (``grader/shipped/bundle.py``): it builds, and holds nothing private.

    Checks that the stubs of ``exercises/`` are unfilled and both bundles (with and without hints) build;
    that no bundled file comes from ``solutions/``, ``grader/``, the example hand-backs or the interviewer's
    questions, imports the kit's private packages, or shares a non-trivial line with ``solutions/`` or
    ``grader/`` (``bundle.shared_lines``); and that no interviewer question or answer of the catalogue
    and no field but the public ones of ``mistakes.toml`` goes in.

    Returns the problems, one sentence each naming the bundled file ([] when all agree). Raises nothing
    for bad data (``bundle.BuildError`` is a problem).
    """
    from grader.shipped import bundle

    problems = []
    try:
        bundle.check_stubs(EXERCISES)
    except bundle.BuildError as exc:
        problems.append(f"grader/shipped/bundle.py: {exc}")
    built = {}
    for hints in (False, True):
        try:
            built[hints] = bundle.bundle_contents(hints, EXERCISES, KIT)
        except bundle.BuildError as exc:
            return problems + [f"grader/shipped/bundle.py: the bundle does not build: {exc}"]
    # Private: the reference and the grader (bundle.PRIVATE_DIRS), the example hand-backs (some are right
    # answers) and the interviewer's questions.
    private = [KIT / d for d in bundle.PRIVATE_DIRS] + [EXAMPLES, INTERVIEW]
    sources = bundle.manifest(EXERCISES, KIT)
    for rel, src in sources.items():
        src = Path(src).resolve()
        if any(src == p.resolve() or p.resolve() in src.parents for p in private):
            problems.append(f"grader/shipped/bundle.py: the bundle's {rel} is {_rel(src)}, a private file")

    def bundled(rel: str) -> str:
        """A bundled file as a message names it: its path in the bundle, and the file it is made from."""
        return f"the bundle's {rel}" + (f" (from {_rel(sources[rel])})" if rel in sources else "")

    contents = {**built[True], **{rel: data for rel, data in built[False].items() if rel not in built[True]}}
    for rel, data in sorted(contents.items()):
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse(data.decode("utf-8"))
        except (SyntaxError, UnicodeDecodeError) as exc:
            problems.append(f"grader/shipped/bundle.py: {bundled(rel)} is not Python that parses: {exc}")
            continue
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
                   {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        for module in sorted(m for m in imported if m.split(".")[0] in PRIVATE_PACKAGES):
            problems.append(f"grader/shipped/bundle.py: {bundled(rel)} imports {module}, which the bundle "
                            f"does not hold")
    # Shared lines: both bundles written out once, side by side, so the private lines are read once.
    with tempfile.TemporaryDirectory(prefix="kvkit-check-kit-") as tmp:
        for hints, files in built.items():
            for rel, data in files.items():
                dest = Path(tmp, "hints" if hints else "plain", rel)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
        shared: dict[str, dict[str, str]] = {}  # bundled file -> {shared line: private file}, both bundles as one
        for path, line, src in bundle.shared_lines(Path(tmp), KIT, run=1):
            shared.setdefault(path.split("/", 1)[1], {}).setdefault(line, src)
    for rel, lines in sorted(shared.items()):
        line, src = next(iter(lines.items()))
        problems.append(f"grader/shipped/bundle.py: {bundled(rel)} shares {len(lines)} non-trivial line(s) with "
                        f"solutions/ or grader/, the first {line[:60]!r} (also in {src})")
    # Interviewer text: each mistake's follow-up question and answer, and the general questions.
    mistakes, _ = _toml(MISTAKES)
    interview, _ = _toml(INTERVIEW)
    secrets = [(mid, entry[key]) for mid, entry in (mistakes or {}).items() if isinstance(entry, dict)
               for key in ("question", "answer") if isinstance(entry.get(key), str) and entry[key].strip()]
    secrets += [(f"general question {i}", q[key]) for i, q in enumerate((interview or {}).get("general", []), 1)
                if isinstance(q, dict) for key in ("question", "answer") if isinstance(q.get(key), str)]
    for rel, data in sorted(contents.items()):
        text = data.decode("utf-8", errors="replace")
        for whose in sorted({whose for whose, secret in secrets if secret in text}):
            problems.append(f"grader/shipped/bundle.py: {bundled(rel)} holds the interviewer text of {whose}")
    public = tomllib.loads(contents.get("catalogue/mistakes.toml", b"").decode("utf-8"))
    for mid, entry in public.items():
        extra = sorted(set(entry) - set(bundle.PUBLIC_MISTAKE_FIELDS))
        if extra:
            problems.append(f"grader/shipped/bundle.py: the bundle's catalogue/mistakes.toml gives {mid}'s "
                            f"{', '.join(extra)}, beyond the public fields {', '.join(bundle.PUBLIC_MISTAKE_FIELDS)}")
    return problems


# --------------------------------------------------------------------------- the command

CHECKS = {
    "catalogue": check_catalogue,
    "steps": check_steps,
    "rubric": check_rubric,
    "examples": check_examples,
    "notebook": check_notebook,
    "bundle": check_bundle,
}


def run_checks(names: list[str] | None = None) -> list[str]:
    """Every check of ``CHECKS`` (or those in ``names``), in order: their problems, one sentence each.

    A check that raises is itself a problem (the kit's data must not crash its own checker), named with
    the check and the exception.

    Raises:
        KeyError: a name that is not a check.
    """
    problems = []
    for name in names or list(CHECKS):
        check = CHECKS[name]
        try:
            problems += check()
        except Exception as exc:  # a check that crashes on bad data says so and lets the others run
            problems.append(f"check-kit: the {name} check stopped: {type(exc).__name__}: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``kvkit check-kit [--only NAME]...``: print one line per problem; exit 0 when none, 1 otherwise, 2 on a
    usage error."""
    parser = argparse.ArgumentParser(
        prog="kvkit check-kit",
        description="Check the kit's data (catalogue, steps, rubric, examples, notebook, starter bundle) "
                    "against its code: one line per problem, exit 1 when there is one.")
    parser.add_argument("--only", action="append", choices=list(CHECKS), metavar="CHECK",
                        help=f"run only this check (repeatable): {', '.join(CHECKS)}")
    try:
        chosen = parser.parse_args(argv).only
    except SystemExit as exc:
        return int(exc.code or 0)
    names = chosen or list(CHECKS)
    problems = run_checks(names)
    for problem in problems:
        print(problem)
    if problems:
        print(f"kvkit check-kit: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"kvkit check-kit: the kit's data agrees with its code ({', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
