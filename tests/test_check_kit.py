"""``kvkit check-kit``: the kit's data agrees with its code, and each check names what breaks it.

The checks live in ``grader/batch/check_kit.py``; this file runs them all once on the kit as it is, then
breaks a copy of each data file in ``tmp_path`` (pointing the check's path constant at it) and shows the
check names the file and the id.
"""
from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

from grader.batch import check_kit
from kvkit import cli

KIT = Path(__file__).resolve().parents[1]


def broken_copy(tmp_path: Path, source: Path, edits: list[tuple[str, str]]) -> Path:
    """A copy of ``source`` in ``tmp_path`` with each ``(old, new)`` replaced once (each must be there)."""
    text = source.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, f"{source.name} no longer holds {old!r}: update this test's edit"
        text = text.replace(old, new, 1)
    target = tmp_path / source.name
    target.write_text(text, encoding="utf-8")
    return target


def entry(name: str, text: str) -> str:
    """The TOML table ``[name]`` of ``text`` up to the next table: the unit the edits below change."""
    match = re.search(rf"^\[{re.escape(name)}\]\n.*?(?=^\[|\Z)", text, flags=re.S | re.M)
    assert match, f"no [{name}]"
    return match[0]


def test_the_kit_passes_every_check(capsys):
    """The whole command on the kit as it is: exit 0 and one line that says so (it takes about a second)."""
    assert cli.main(["check-kit"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.startswith("kvkit check-kit: the kit's data agrees with its code") and out.count("\n") == 1, out


def test_a_problem_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    rubric = broken_copy(tmp_path, check_kit.RUBRIC, [("[criteria.decode]", "[criteria.decoding]")])
    monkeypatch.setattr(check_kit, "RUBRIC", rubric)
    assert check_kit.main(["--only", "rubric"]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2 and all(str(rubric) in line for line in lines), lines
    assert "2 problem(s)" in captured.err
    assert check_kit.main(["--only", "nothing"]) == 2  # a usage error


def test_a_check_that_crashes_is_a_problem_and_the_others_still_run(monkeypatch):
    def crashes():
        raise RuntimeError("bad data")

    monkeypatch.setitem(check_kit.CHECKS, "catalogue", crashes)
    assert check_kit.run_checks(["catalogue", "rubric"]) == [
        "check-kit: the catalogue check stopped: RuntimeError: bad data"]


def test_the_catalogue_check_names_each_mistake_out_of_step(tmp_path, monkeypatch):
    text = check_kit.MISTAKES.read_text(encoding="utf-8")
    repeat, padding, scale = entry("kv_repeat", text), entry("nan_padding", text), entry("missing_scale", text)
    mistakes = broken_copy(tmp_path, check_kit.MISTAKES, [
        (repeat, repeat.replace('criterion = "no_kv_repeat"', 'criterion = "no_repeat"')),
        (padding, padding.replace("mutant = true", "mutant = false")),
        (scale, scale.replace('shown_by = "reproduction"', 'shown_by = "magic"').replace('title = ', 'headline = ')),
    ])
    with open(mistakes, "a", encoding="utf-8") as f:  # a mistake marked planted that mutants.py does not plant
        f.write('\n[kv_ghost]\ntitle = "A ghost"\nwhat = "x"\nshown_by = "memory"\ncriterion = "decode"\n'
                'mutant = true\nexample = "kv_repeat"\nquestion = "q?"\nanswer = "a."\n')
    interview = broken_copy(tmp_path, check_kit.INTERVIEW, [('criterion = "head_mapping"', 'criterion = "heads"')])
    monkeypatch.setattr(check_kit, "MISTAKES", mistakes)
    monkeypatch.setattr(check_kit, "INTERVIEW", interview)
    problems = check_kit.check_catalogue()
    where = str(mistakes)

    def says(*words):
        return any(all(w in p for w in words) for p in problems)

    assert says(where, "kv_repeat", "'no_repeat'", "criteria registry"), problems
    assert says("catalogue/mutants.py", "PLANTED", "nan_padding", "mutant = false"), problems
    assert says(where, "missing_scale", "'magic'") and says(where, "missing_scale", "no title"), problems
    assert says(where, "missing_scale has a field headline that no code reads"), problems
    assert says(where, "kv_ghost", "mutant = true", "does not plant"), problems
    assert says("docs/report.schema.json", "lacks kv_ghost"), problems
    assert says(str(interview), "general question 1", "'heads'"), problems
    assert len(problems) == 8, problems


def test_the_steps_check_names_files_steps_and_mistakes_out_of_step(tmp_path, monkeypatch):
    steps = broken_copy(tmp_path, check_kit.STEPS, [
        ('tests = ["tests/test_step3_mask.py"]', 'tests = ["tests/test_step3_masks.py"]'),
        ("needs = [2]", "needs = [9]"),
        ('fills = "cost.py: all six functions"', 'fills = "costs.py: all six functions"'),
        ("concat_growth = ", "ghost_mistake = "),
        ("missing_scale = ", "kv_repeat = "),
    ])
    monkeypatch.setattr(check_kit, "STEPS", steps)
    problems = check_kit.check_steps()
    where = str(steps)
    assert f"{where}: step 3 names tests/test_step3_masks.py, which is not in exercises/" in problems, problems
    assert f"{where}: no step names tests/test_step3_mask.py, a step test in exercises/tests/" in problems
    assert f"{where}: step 3 needs step 9, which does not come before it" in problems
    assert f"{where}: step 5 fills costs.py, which is not in exercises/" in problems
    assert any(where in p and "ghost_mistake" in p and "catalogue/mistakes.toml" in p for p in problems), problems
    assert any(where in p and "kv_repeat" in p and "does not plant" in p for p in problems), problems
    assert f"{where}: no step's missed table says how a test catches the planted mistake concat_growth" in problems
    assert f"{where}: no step's missed table says how a test catches the planted mistake missing_scale" in problems
    assert len(problems) == 8, problems


def test_the_rubric_check_lists_every_problem_where_load_stops_at_one(tmp_path, monkeypatch):
    text = check_kit.RUBRIC.read_text(encoding="utf-8")
    padding = entry("criteria.padding", text)
    rubric = broken_copy(tmp_path, check_kit.RUBRIC, [
        ("[criteria.decode]", "[criteria.decoding]"),
        (padding, padding.replace('tier = "Strong Hire"', 'tier = "Strongest"')),
        ('weak_mistakes = ["concat_growth"', 'weak_mistakes = ["ghost_mistake", "concat_growth"'),
        ('port_mistake_cap = "Hire"', 'port_mistake_cap = "Maybe"'),
        ("[criteria.cost_model]\n", '[criteria.cost_model]\ntitle = "Costs"\n'),
    ])
    monkeypatch.setattr(check_kit, "RUBRIC", rubric)
    problems = check_kit.check_rubric()
    where = str(rubric)
    assert f"{where}: [criteria.decoding] is not in the criteria registry (grader/stages/registry.py REGISTRY)" \
        in problems, problems
    assert f"{where}: criterion decode of the registry has no [criteria.decode] (points and tier)" in problems
    assert any(where in p and "criterion padding" in p and "'Strongest'" in p for p in problems), problems
    assert f"{where}: weak_mistakes names ghost_mistake, which is not in catalogue/mistakes.toml" in problems
    assert any(where in p and "port_mistake_cap" in p and "'Maybe'" in p for p in problems), problems
    assert any(where in p and "criterion cost_model has a title" in p for p in problems), problems
    assert len(problems) == 6, problems


def test_the_examples_check_pairs_folders_entries_and_mistakes_without_grading(tmp_path, monkeypatch):
    examples = tmp_path / "examples"
    shutil.copytree(check_kit.EXAMPLES, examples, ignore=shutil.ignore_patterns("__pycache__"))
    expected = examples / "expected.toml"
    text = expected.read_text(encoding="utf-8")
    for name in ("misplaced_writes", "shared_position_cache"):  # every example of misplaced_writes misspells it
        text = text.replace(entry(name, text), entry(name, text).replace('"misplaced_writes"', '"misplaced_write"'))
    text = text.replace(entry("hire_basic", text), "")
    text += '\n[ghost_example]\ntier = "Great"\nmistakes = []\nrefuses = ["chunks"]\n'
    expected.write_text(text, encoding="utf-8")
    (examples / "no_kv_cache").mkdir()
    (examples / "no_kv_cache" / "cost.py").write_text("")
    monkeypatch.setattr(check_kit, "EXAMPLES", examples)
    monkeypatch.setattr(check_kit, "EXPECTED", expected)
    problems = check_kit.check_examples()
    where = str(expected)
    assert f"{examples}/hire_basic/ has no entry [hire_basic] in {where}" in problems, problems
    assert f"{examples}/no_kv_cache/ has no entry [no_kv_cache] in {where}" in problems
    assert f"{where}: [ghost_example] has no folder {examples}/ghost_example/" in problems
    assert any(where in p and "[ghost_example]" in p and "'Great'" in p for p in problems), problems
    assert any(where in p and "[ghost_example]" in p and "'chunks'" in p for p in problems), problems
    for name in ("misplaced_writes", "shared_position_cache"):
        assert f"{where}: [{name}] expects misplaced_write in mistakes, which is not in catalogue/mistakes.toml" \
            in problems
    assert f"catalogue/mistakes.toml: misplaced_writes is expected by no example in {where}" in problems
    assert f"catalogue/mistakes.toml: misplaced_writes's example misplaced_writes does not expect it in {where}" \
        in problems
    assert len(problems) == 9, problems


def test_the_notebook_check_names_a_stale_ipynb_and_how_to_rebuild_it(tmp_path, monkeypatch):
    import nbformat

    nb = nbformat.read(check_kit.NOTEBOOK, as_version=4)
    code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[code].source += "\n# edited in the .ipynb, not in the text"
    stale = tmp_path / "kv_cache.ipynb"
    nbformat.write(nb, stale)
    monkeypatch.setattr(check_kit, "NOTEBOOK", stale)
    (problem,) = check_kit.check_notebook()
    assert problem.startswith(f"{stale} is stale: 1 cell(s) differ from what jupytext makes of "
                              f"notebooks/kv_cache.pct.py, cells {code + 1} "), problem
    assert problem.endswith(check_kit.rebuild_command()) and "--to ipynb" in problem, problem
    del nb.cells[code]
    nbformat.write(nb, stale)
    assert [f"has {len(nb.cells)} cells where jupytext makes {len(nb.cells) + 1}" in p
            for p in check_kit.check_notebook()] == [True]


def test_the_bundle_check_names_filled_stubs_private_imports_copied_lines_and_interview_text(tmp_path,
                                                                                               monkeypatch):
    from grader.shipped import bundle

    exercises = tmp_path / "exercises"
    shutil.copytree(check_kit.EXERCISES, exercises, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    cost = exercises / "cost.py"
    cost.write_text(cost.read_text().replace('raise NotImplementedError("step 5: cache_bytes")',
                                             "return 0"))
    copied = bundle.code_lines(KIT / "solutions" / "kv_cache.py")[5]
    question = tomllib.loads(check_kit.MISTAKES.read_text())["kv_repeat"]["question"]
    leak = exercises / "tests" / "test_leak.py"
    leak.write_text(
        f'from solutions.kv_cache import KVCache\n\nCOPIED = """\n{copied}\n"""\nASKED = {question!r}\n')
    monkeypatch.setattr(check_kit, "EXERCISES", exercises)
    problems = check_kit.check_bundle()
    assert any("cost.py has been filled in" in p and "cache_bytes" in p for p in problems), problems
    assert f"grader/shipped/bundle.py: the bundle's tests/test_leak.py (from {leak}) imports solutions.kv_cache, " \
           "which the bundle does not hold" in problems, problems
    assert any("tests/test_leak.py (from" in p and "shares 1 non-trivial line(s)" in p and "solutions/kv_cache.py" in p
               for p in problems), problems
    assert f"grader/shipped/bundle.py: the bundle's tests/test_leak.py (from {leak}) holds the interviewer text of " \
           "kv_repeat" in problems
    assert len(problems) == 4, problems
