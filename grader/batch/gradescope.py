"""``kvkit gradescope OUT.zip``: a Gradescope autograder bundle, and the code that runs inside it.

Gradescope unpacks the bundle into ``/autograder/source``, runs ``setup.sh``
once to build the image, then, for every submission, runs ``run_autograder``,
which grades ``/autograder/submission`` and writes
``/autograder/results/results.json``. The bundle holds:

* ``setup.sh``: finds or installs Python >= 3.11, makes ``/autograder/venv``
  and installs the kit from ``source/`` (the CPU build of torch);
* ``run_autograder``: runs ``python -m grader.batch.gradescope --autograde``, and
  writes a zero-score ``results.json`` itself if even that fails, so a student
  never sees a bare crash;
* ``kvkit_autograder.json``: the grading options chosen when the bundle was
  built (timeout, trials, isolation, seed, rubric, allow_no_isolation);
* the kit's packages that grading needs (``kvkit``, ``grader``, ``catalogue``),
  ``pyproject.toml`` and ``docs/report.schema.json`` (each report is checked
  against it as it is written), and the figures computed where the kit is
  (``grader/bundle_costs.json``, ``grader/bundle_fingerprints.json``). No
  reference solution (``solutions/``: the parent plants mistakes around its own
  oracle, ``grader/stages/oracle.py``) and no interviewer text (no ``interview.toml``,
  no ``question`` or ``answer`` in ``mistakes.toml``).

Nothing of the kit is readable by the submission. Every file and folder of
``source/`` is the grader's user's alone (mode 0600 and 0700, set again by
``run_autograder`` and by ``autograde`` before any submission runs), and the
submission runs as another uid. With namespaces the kit's folders are not even
there. A bundle grades only with namespaces unless it was built with
``--allow-no-isolation``; then the submission runs as a uid of its own (the
grader must be root, as on Gradescope, to drop to it) and every results.json
carries a hidden, staff-only test named NO ISOLATION. Without namespaces and
without the opt-out, or with it but no uid to drop to, nothing is graded and
the staff-only test says why.

The autograder root is ``$KVKIT_AUTOGRADER_ROOT`` (default ``/autograder``) and
the Python that runs it ``$KVKIT_AUTOGRADER_PYTHON`` (default
``$ROOT/venv/bin/python``), so the bundle can be tried in a local directory laid
out like Gradescope's.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
import traceback
import zipfile

from grader import KIT_ROOT

PACKAGES = ("kvkit", "grader", "catalogue")  # never solutions/: see grader/stages/costs.py and grader/stages/oracle.py
# Interviewer text stays with the kit: the general questions whole, each mistake's follow-up and its answer.
LEFT_OUT = ("catalogue/interview.toml",)
MISTAKES = "catalogue/mistakes.toml"
INTERVIEW_FIELDS = ("question", "answer")
COSTS = "grader/bundle_costs.json"  # read by grader.stages.costs.figures
STAFF_ONLY = "NO ISOLATION"
FINGERPRINTS = "grader/bundle_fingerprints.json"  # read by grader.stages.layout.set_aside_bundle
TOP_FILES = ("pyproject.toml", "docs/report.schema.json")  # the schema: every report is checked as it is written
CONFIG = "kvkit_autograder.json"
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints", "examples"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".DS_Store")
FIND_DEPTH = 3

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
# It finds (or installs) Python >= 3.11, makes $ROOT/venv and installs the kit into it.
set -euo pipefail
ROOT="${KVKIT_AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"

find_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

PY="$(find_python || true)"
if [ -z "$PY" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends python3 python3-venv python3-pip ca-certificates || true
  PY="$(find_python || true)"
fi
if [ -z "$PY" ]; then
  apt-get install -y --no-install-recommends software-properties-common
  add-apt-repository -y ppa:deadsnakes/ppa
  apt-get update
  apt-get install -y --no-install-recommends python3.11 python3.11-venv
  PY="$(find_python)"
fi
# util-linux gives the sandbox its namespace tools where the container allows them.
command -v unshare >/dev/null 2>&1 || apt-get install -y --no-install-recommends util-linux || true

"$PY" -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --upgrade pip
# Only what grading needs (requirements-grading.txt: NumPy, torch, pytest, rich, nbformat), then the kit
# itself without its notebook and development stack.
"$ROOT/venv/bin/python" -m pip install --extra-index-url https://download.pytorch.org/whl/cpu \
  -r "$SOURCE/requirements-grading.txt"
"$ROOT/venv/bin/python" -m pip install --no-deps -e "$SOURCE"
"$ROOT/venv/bin/python" -c "import grader.batch.gradescope, numpy, torch; print('kvkit autograder ready')"
# The kit is the grader's alone: the submission runs as another uid (grader/batch/gradescope.py).
chmod -R go-rwx "$SOURCE"
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Gradescope runs this for every submission: grade $ROOT/submission, write $ROOT/results/results.json.
# KVKIT_AUTOGRADER_ROOT (default /autograder) lets it run in a local directory laid out the same way.
set -u
ROOT="${KVKIT_AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PY="${KVKIT_AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
mkdir -p "$ROOT/results"
rm -f "$ROOT/results/results.json"
cd "$SOURCE" || exit 0
chmod -R go-rwx "$SOURCE" 2>/dev/null
PYTHONPATH="$SOURCE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m grader.batch.gradescope --autograde --root "$ROOT"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
  printf '{"score": 0, "output": "The autograder could not run (exit status %s). Please tell the course staff.", "tests": []}\n' \
    "$status" > "$ROOT/results/results.json"
fi
exit 0
"""


def parser() -> argparse.ArgumentParser:
    """The command line of ``kvkit gradescope``."""
    p = argparse.ArgumentParser(prog="kvkit gradescope", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", metavar="OUT.zip", help="where to write the autograder bundle")
    p.add_argument("--timeout", type=float, default=120.0, help="wall-clock seconds per sandboxed run (default 120)")
    p.add_argument("--trials", type=int, default=200, help="random trials (at least 200 for a verdict; default 200)")
    p.add_argument("--seed", type=int, help="fixed seed of the hidden trials (default: random per submission)")
    p.add_argument("--rubric", metavar="FILE", help="a rubric TOML file to grade with (default: the kit's)")
    p.add_argument("--isolation", choices=["namespaces", "auto", "process"], default="namespaces",
                   help="sandbox level on Gradescope's workers (default namespaces: a worker without them grades "
                        "nothing); auto and process need --allow-no-isolation")
    p.add_argument("--allow-no-isolation", action="store_true",
                   help="grade where a worker offers no namespaces: the submission then runs as a uid of its own, "
                        "and every results.json carries a staff-only test named NO ISOLATION")
    p.add_argument("--autograde", action="store_true", help=argparse.SUPPRESS)  # run inside the bundle
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------- building the bundle

def _add(zf: zipfile.ZipFile, arcname: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(arcname, date_time=(2024, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o700 if executable else 0o600) | stat.S_IFREG) << 16  # the grader's user's alone
    zf.writestr(info, data)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"mistakes.toml holds a value TOML is not written for here: {value!r}")


def mistakes_without_interview(text: str) -> str:
    """``catalogue/mistakes.toml`` as the bundle ships it: every field the grader reads, no ``INTERVIEW_FIELDS``.

    Raises:
        ValueError: ``text`` is not a table of mistakes (each a table of plain values).
    """
    import tomllib

    data = tomllib.loads(text)
    if not all(isinstance(entry, dict) for entry in data.values()):
        raise ValueError("mistakes.toml must hold one table per mistake")
    kept = {mid: {k: v for k, v in entry.items() if k not in INTERVIEW_FIELDS} for mid, entry in data.items()}
    out = ["# The mistakes catalogue as the Gradescope bundle ships it: no interviewer question or answer.", ""]
    for mid, entry in kept.items():
        out += [f"[{mid}]", *(f"{key} = {_toml(value)}" for key, value in entry.items()), ""]
    written = "\n".join(out)
    if tomllib.loads(written) != kept:
        raise ValueError("mistakes.toml could not be written back without its interviewer text")
    return written


def bundle_files() -> list[tuple[str, str]]:
    """``(path on disk, name in the zip)`` for the kit's files that the autograder needs."""
    files = [(os.path.join(KIT_ROOT, name), name) for name in TOP_FILES if os.path.isfile(os.path.join(KIT_ROOT, name))]
    for package in PACKAGES:
        base = os.path.join(KIT_ROOT, package)
        for root, dirs, names in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(names):
                if name.endswith(SKIP_SUFFIXES) or name.startswith("."):
                    continue
                path = os.path.join(root, name)
                arcname = os.path.relpath(path, KIT_ROOT).replace(os.sep, "/")
                if arcname not in LEFT_OUT and arcname not in (COSTS, FINGERPRINTS):
                    files.append((path, arcname))
    return files


GRADING_PACKAGES = ("numpy", "torch", "pytest", "rich", "nbformat", "jsonschema")


def grading_requirements() -> str:
    """The kit's own pins of what grading needs, one per line (no notebook or development stack)."""
    import importlib.metadata

    wanted = []
    for req in importlib.metadata.requires("kvkit") or []:
        spec = req.split(";")[0].strip()
        name = spec.split("=")[0].split("<")[0].split(">")[0].strip().lower()
        if name in GRADING_PACKAGES and "extra ==" not in req:
            wanted.append(spec)
    return "\n".join(wanted) + "\n"


def build(out: str, config: dict, rubric: str | None = None) -> list[str]:
    """Write the bundle to ``out`` (atomically); return the names in it."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    names = []
    with zipfile.ZipFile(tmp, "w") as zf:
        for arcname, text, executable in (("setup.sh", SETUP_SH, True), ("run_autograder", RUN_AUTOGRADER, True)):
            _add(zf, arcname, text.encode(), executable)
            names.append(arcname)
        if rubric:
            with open(rubric, "rb") as f:
                _add(zf, "rubric.toml", f.read())
            names.append("rubric.toml")
            config = {**config, "rubric": "rubric.toml"}
        _add(zf, CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        names.append(CONFIG)
        _add(zf, "requirements-grading.txt", grading_requirements().encode())
        names.append("requirements-grading.txt")
        # The starter bundle's fingerprints, computed here where its sources are: the autograder ships
        # without the exercises, and still sets aside the bundle files a student hands back unchanged.
        from grader.shipped.bundle import bundle_fingerprints

        _add(zf, FINGERPRINTS, (json.dumps(bundle_fingerprints(), indent=0, sort_keys=True) + "\n").encode())
        names.append(FINGERPRINTS)
        # The cost figures, computed here from the cost model: the bundle ships no reference solution.
        from grader.stages import costs

        _add(zf, COSTS, (json.dumps(costs.computed(), indent=1) + "\n").encode())
        names.append(COSTS)
        for path, arcname in bundle_files():
            with open(path, "rb") as f:
                data = f.read()
            if arcname == MISTAKES:
                data = mistakes_without_interview(data.decode("utf-8")).encode()
            _add(zf, arcname, data)
            names.append(arcname)
    os.replace(tmp, out)
    return names


# ---------------------------------------------------------------------- inside the bundle

def find_submission(directory: str) -> str | None:
    """The submission under Gradescope's ``submission/``: a folder with kv_cache.py (or a notebook), or a .py."""
    def has_code(d):
        try:
            names = os.listdir(d)
        except OSError:
            return False
        return "kv_cache.py" in names or any(n.endswith(".ipynb") for n in names)

    if has_code(directory):
        return directory
    found = []
    for root, dirs, _ in os.walk(directory):
        depth = os.path.relpath(root, directory).count(os.sep) + 1
        dirs[:] = [d for d in dirs if not d.startswith((".", "__MACOSX"))] if depth < FIND_DEPTH else []
        if root != directory and has_code(root):
            found.append((depth, root))
    if found:
        return min(found)[1]
    try:
        py = sorted(n for n in os.listdir(directory) if n.endswith(".py") and not n.startswith("test_"))
    except OSError:
        return None
    return os.path.join(directory, py[0]) if len(py) == 1 else None


def _failure(output: str) -> dict:
    return {"score": 0.0, "output": output, "visibility": "visible", "stdout_visibility": "hidden", "tests": []}


def lock_down(root: str) -> list[str]:
    """Take every permission of group and others off ``root`` and everything under it (links left alone).

    Returns the paths that still grant one (their mode could not be changed).
    """
    left = []
    for folder, _, names in os.walk(root):
        for path in [folder, *(os.path.join(folder, n) for n in names)]:
            try:
                st = os.lstat(path)
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
            except OSError:
                left.append(path)
    return left


def staff_test(text: str) -> dict:
    """A results.json test only the course staff see (``visibility: hidden``), worth no points."""
    return {"name": STAFF_ONLY, "score": 0.0, "max_score": 0.0, "output": text, "visibility": "hidden"}


def sandbox_for(config: dict, readable: list[str]) -> tuple[object, str, bool]:
    """``(isolation, staff_note, refused)``: the sandbox this worker gives the submission, what the staff must
    read about it (``""`` with namespaces), and whether nothing may be graded.

    ``config`` is the bundle's (``isolation``, ``allow_no_isolation``); ``readable`` the kit's paths that
    ``lock_down`` could not make the grader's alone.
    """
    from grader.sandbox import isolation

    chosen = isolation.choose(config.get("isolation", "namespaces"))
    box = chosen.wrap
    if box is not None and box.namespaces:
        return chosen, "", False
    why = f"the sandbox's best level here: {chosen.level}; the autograder's stdout says why"
    if not config.get("allow_no_isolation"):
        return chosen, (f"{STAFF_ONLY}, NOTHING GRADED: this worker offers no Linux namespaces ({why}), and the "
                        "bundle was built to grade only with them. To grade here anyway, rebuild it with "
                        "`kvkit gradescope OUT.zip --allow-no-isolation`: the submission then runs as a uid of its "
                        "own, which cannot read the kit's files."), True
    if box is None or not box.drop_uid:
        return chosen, (f"{STAFF_ONLY}, NOTHING GRADED: no Linux namespaces ({why}), and the submission would run "
                        "as the grader's own user (the autograder must run as root to give it a uid of its own), "
                        "so it could read every file of the kit."), True
    if readable:
        return chosen, (f"{STAFF_ONLY}, NOTHING GRADED: no Linux namespaces ({why}), and {len(readable)} of the "
                        f"kit's files could not be made the grader's alone (e.g. {readable[0]})."), True
    return chosen, (f"{STAFF_ONLY}: this worker offers no Linux namespaces ({why}). The bundle was built with "
                    "--allow-no-isolation, so it graded anyway: the submission ran as a uid of its own, which "
                    "cannot read the kit's files (the grader's alone), but it could reach the network and read "
                    "whatever any user may read on this worker."), False


def autograde(root: str) -> int:
    """Grade ``root``/submission and write ``root``/results/results.json; 0 unless that file cannot be written."""
    from grader.stages import report as report_mod

    started = time.monotonic()
    results_path = os.path.join(root, "results", "results.json")
    staff = ""
    try:
        config, readable = {}, []
        config_path = os.path.join(KIT_ROOT, CONFIG)
        if os.path.exists(config_path):  # a bundle: its files are the grader's alone before any submission runs
            readable = lock_down(KIT_ROOT)
            with open(config_path) as f:
                config = json.load(f)
        sandbox, staff, refused = sandbox_for(config, readable)
        submission = None if refused else find_submission(os.path.join(root, "submission"))
        if refused:
            results = _failure("The autograder could not isolate your code on this machine, so it did not run "
                               "it. Please tell the course staff.")
        elif submission is None:
            results = _failure("No submission found: upload kv_cache.py (with cost.py, kv_cache_torch.py and "
                               "test_*.py if you have them), or a notebook.")
        else:
            from grader.stages.grade import Options, grade_report
            from grader.stages.rubric import load as load_rubric

            rubric = config.get("rubric")
            options = Options(timeout=float(config.get("timeout", 120.0)), trials=int(config.get("trials", 200)),
                              rubric=load_rubric(os.path.join(KIT_ROOT, rubric) if rubric else None),
                              isolation=sandbox)
            if config.get("seed") is not None:
                options.seed = int(config["seed"])
            if options.isolation.warning:
                print(f"warning: {options.isolation.warning}", file=sys.stderr)
            graded = grade_report(submission, options)
            results = graded.to_gradescope(options.rubric, "class")
            report = graded.to_dict()
            results["extra_data"] = {"tier": report["tier"], "seed": report["seed"], "mistakes": report["mistakes"],
                                     "isolation": report["isolation"]}
            report_mod.print_report(report, rubric=options.rubric, audience="class")
    except Exception as exc:  # noqa: BLE001 - the student must still get a results.json
        traceback.print_exc()
        results = _failure(f"The autograder failed ({type(exc).__name__}: {report_mod.clean(str(exc), 200)}). "
                           "Please tell the course staff.")
    if staff:  # in every results.json of a worker without namespaces, for the staff alone
        results.setdefault("tests", []).append(staff_test(staff))
        print(staff)
        print(f"isolation: {sandbox.warning or sandbox.level}")
    results["execution_time"] = round(time.monotonic() - started, 2)
    try:
        report_mod.write_json_atomic(results_path, results)
    except OSError as exc:
        print(f"kvkit gradescope: cannot write {results_path}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``kvkit gradescope``: build the bundle (or, inside it, ``--autograde``); the exit status."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.autograde:
        return autograde(args.root or os.environ.get("KVKIT_AUTOGRADER_ROOT", "/autograder"))
    if not args.out:
        print("kvkit gradescope: give the bundle's path, e.g. kvkit gradescope autograder.zip", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.trials < 1:
        print("kvkit gradescope: --timeout and --trials must be positive", file=sys.stderr)
        return 2
    if args.isolation != "namespaces" and not args.allow_no_isolation:
        print(f"kvkit gradescope: --isolation {args.isolation} may grade without Linux namespaces, where a "
              "submission runs with no boundary but a uid of its own; pass --allow-no-isolation too to build such "
              "a bundle (every results.json then tells the staff NO ISOLATION), or leave --isolation out",
              file=sys.stderr)
        return 2
    from grader.stages.rubric import RubricError, load as load_rubric

    try:
        points = load_rubric(args.rubric).max_score
    except RubricError as exc:
        print(f"kvkit gradescope: {exc}", file=sys.stderr)
        return 2
    config = {"timeout": args.timeout, "trials": args.trials, "isolation": args.isolation, "seed": args.seed,
              "allow_no_isolation": args.allow_no_isolation}
    names = build(args.out, config, args.rubric)
    print(f"wrote {args.out}: setup.sh, run_autograder and {len(names) - 2} kit files; upload it as the "
          f"autograder of a Gradescope programming assignment, and set the assignment's points to {points:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
