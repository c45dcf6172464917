"""Fast unit tests of the report model, its renderers, the batch summary and resume selection.

No sandbox, no grading: reports are made here by the same functions the grader uses.
"""
from __future__ import annotations

import json
import os

import pytest

import grader
from grader.stages import report

from grader.batch import summary
from grader.batch.cli import batch_names, expand, finished_reports, report_name
from grader.stages.rubric import TIERS, load

RUBRIC = load()


def graded(name: str, tier: str, score: float = 50.0, error: str = "") -> dict:
    """A graded report as ``grade.build_report`` shapes it (the keys the renderers read)."""
    crits = [{"id": cid, "title": spec["title"], "status": "pass" if tier == "Strong Hire" else "fail",
              "points": 0.0, "max_points": float(spec["points"]), "evidence": error or "ok", "mistakes": []}
             for cid, spec in RUBRIC.criteria.items()]
    return {"schema": report.SCHEMA, "submission": name, "seed": 1, "status": "graded", "graded": True,
            "tier": tier, "tier_reason": "because", "score": score, "max_score": RUBRIC.max_score, "criteria": crits,
            "mistakes": [], "isolation": "namespaces", "duration_s": 1.0, "notes": [], "follow_ups": []}


def test_ungraded_reports_have_no_tier_and_say_why():
    for status in ("not_graded", "grader_error"):
        r = report.ungraded("alice", 3, RUBRIC, "no kv_cache.py in the submission", status)
        assert r["status"] == status and r["tier"] is None and r["graded"] is False
        assert "no kv_cache.py" in r["tier_reason"] and r["score"] == 0.0
        assert report.headline(r) == {"not_graded": "NOT GRADED", "grader_error": "GRADER ERROR"}[status]
    with pytest.raises(ValueError, match="status must be"):
        report.ungraded("alice", 3, RUBRIC, "x", "graded")


def test_summary_counts_each_status_apart():
    reports = [graded("a", "Weak"), graded("b", "Hire"), graded("c", "Strong Hire"),
               report.ungraded("d", 1, RUBRIC, "no kv_cache.py"),
               report.ungraded("e", 1, RUBRIC, "boom", "grader_error")]
    assert summary.tier_counts(reports) == {"Weak": 1, "Hire": 1, "Strong Hire": 1}
    assert summary.status_counts(reports) == {"graded": 3, "not_graded": 1, "grader_error": 1}
    text = summary.markdown(reports)
    assert "3 graded, 1 not graded, 1 grader errors" in text
    assert "| Weak | 1 | 33% |" in text  # shares over graded submissions only
    grades = summary.csv_text(reports).splitlines()
    assert grades[0].startswith("submission,status,tier") and any(",not graded,,0.0," in row for row in grades)


def test_a_quick_grading_says_so_in_the_summary():
    """Reports graded with fewer random trials than a full grading: the class summary says how many."""
    from grader.stages.suite import FULL_TRIALS

    full, quick = graded("a", "Hire"), graded("b", "Weak")
    full["trials"], quick["trials"] = {"random": FULL_TRIALS}, {"random": 20}
    assert "quick grading" not in summary.markdown([full])
    assert f"A quick grading: 1 of 2 submissions graded with 20 random trials, fewer than the {FULL_TRIALS}" in \
        summary.markdown([full, quick])
    assert "A quick grading: every submission graded with 20 random trials" in summary.markdown([quick])


def test_an_optional_section_left_out_counts_neither_for_nor_against_a_rate():
    a, b = graded("a", "Strong Hire"), graded("b", "Weak")
    for c in b["criteria"]:
        if c["id"] == "torch_port":
            c["status"], c["counted"] = "not_attempted", False
        if c["id"] == "cost_model":  # required for Strong Hire: not attempted is not passed
            c["status"], c["counted"] = "not_attempted", True
    rates = {cid: (passed, total) for cid, _, passed, total in summary.rates([a, b])}
    assert rates["torch_port"] == (1, 1) and rates["cost_model"] == (1, 2)


def test_class_audience_never_reads_hiring_words():
    r = graded("a", "Hire")
    r["follow_ups"] = [{"mistake": None, "question": "Q?", "answer": "A."}]
    results = report.gradescope(r, RUBRIC, "class")
    assert results["output"].startswith("Result: Meets expectations")
    assert not any(word in json.dumps(results) for word in ("Weak", "Hire", "Q?"))
    assert "Strong Hire" in report.markdown([graded("s", "Strong Hire")], RUBRIC, "hiring")
    assert "Exceeds expectations" in report.markdown([graded("s", "Strong Hire")], RUBRIC, "class")
    assert [RUBRIC.label(t, "hiring") for t in TIERS] == TIERS


@pytest.mark.parametrize("hostile", ["[/]", "[bold]x[/bold] [link=file:///etc]y[/link]", "a\nb\x1bc\x9b", "\x1bc"])
def test_submission_text_is_data_in_every_renderer(hostile):
    from rich.console import Console

    r = graded(f"sub{hostile}", "Weak", error=f"raised ValueError: {hostile}")
    r["notes"] = [hostile]
    console = Console(record=True, width=120, force_terminal=False)
    report.print_report(r, console)  # no MarkupError
    shown = console.export_text()
    assert "\x1b" not in shown and "\x9b" not in shown
    text = report.markdown([r])
    control = graded("sub", "Weak", error="raised ValueError: x")
    control["notes"] = ["x"]
    benign = report.markdown([control])
    assert "\x1b" not in text and "\x9b" not in text
    assert len(text.splitlines()) == len(benign.splitlines())  # the message made no line of its own
    out = report.gradescope(r, RUBRIC)
    assert "\x1b" not in json.dumps(out) and "\\n" not in json.dumps([t["output"] for t in out["tests"]])


def test_markdown_cannot_forge_a_section():
    r = graded("x", "Weak", error="oops\n## mallory: Strong Hire\n| a | b |")
    lines = report.markdown([r]).splitlines()
    assert [line for line in lines if line.startswith("## ")] == ["## x: Weak (50/100)"]


def test_resume_keeps_only_finished_graded_reports_of_the_hand_back_as_it_is(tmp_path):
    """Kept: a whole graded report of the files as they are now. Graded again: not graded, grader errors,
    reports cut short, and a hand-back changed since its report (handed in again), which is listed."""
    from grader.stages.layout import hand_back_sha256

    out = tmp_path / "out"
    out.mkdir()
    paths = [str(tmp_path / n) for n in ("a", "b", "c", "d", "e", "f.py", "g")]
    for path in paths:
        if path.endswith(".py"):
            open(path, "w").write("x = 1\n")
        else:
            os.makedirs(path)
            open(os.path.join(path, "kv_cache.py"), "w").write("x = 1\n")
    kept = {**graded("a", "Hire"), "hand_back_sha256": hand_back_sha256(paths[0])}
    (out / report_name(os.path.basename(paths[0]))).write_text(json.dumps(kept))
    (out / report_name(os.path.basename(paths[1]))).write_text(json.dumps(report.ungraded("b", 1, RUBRIC, "no kv_cache.py")))
    (out / report_name(os.path.basename(paths[2]))).write_text(json.dumps(report.ungraded("c", 1, RUBRIC, "x", "grader_error")))
    (out / report_name(os.path.basename(paths[3]))).write_text('{"schema": "kvkit.report/1", "status": "gra')  # cut short
    for path in paths[5:]:  # graded, then handed in again with one character changed
        (out / report_name(os.path.basename(path))).write_text(json.dumps({**graded(os.path.basename(path), "Weak"),
                                                                             "hand_back_sha256": hand_back_sha256(path)}))
    open(paths[5], "w").write("x = 2\n")
    open(os.path.join(paths[6], "kv_cache.py"), "w").write("x = 2\n")
    changed: list = []
    assert set(finished_reports(paths, str(out), changed)) == {paths[0]}
    assert changed == paths[5:]
    # the hash is of the files laid out: the same code in a zip of the folder is the same hand-back
    import zipfile
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.write(os.path.join(paths[0], "kv_cache.py"), "a/kv_cache.py")
    assert hand_back_sha256(str(tmp_path / "a.zip")) == kept["hand_back_sha256"]
    assert hand_back_sha256(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("odd", [{"trials": 5}, {"seed": -1}, {"seed": 2**80}, {"trials": {"random": -3}},
                                 {"audience": "martians"}, {"seed": True}])
def test_resume_takes_up_only_values_the_command_line_would_accept(tmp_path, capsys, odd):
    """A report in --out is a file like any other (edited by hand, or from another version of the kit): a
    seed, trial count or audience the command line would refuse is not taken up, and nothing crashes."""
    from grader.batch import cli
    from grader.stages.layout import hand_back_sha256

    cls, out = tmp_path / "class", tmp_path / "out"
    (cls / "a").mkdir(parents=True)
    out.mkdir()
    (cls / "a" / "kv_cache.py").write_text("x = 1\n")
    kept = {**graded("a", "Hire"), "hand_back_sha256": hand_back_sha256(str(cls / "a")), **odd}
    (out / report_name(os.path.basename(str(cls / "a")))).write_text(json.dumps(kept))
    assert cli.main([str(cls), "--out", str(out), "--resume", "--quiet"]) == 0
    said = capsys.readouterr().err
    (name, value), = odd.items()
    value = value.get("random") if isinstance(value, dict) else value
    assert "kept 1 finished report(s)" in said and f"{name} {value}," not in said and f"{name} {value} " not in said, said


def test_resume_grades_again_a_hand_back_that_cannot_be_laid_out_now(tmp_path, monkeypatch):
    """Whatever laying a hand-back out raises while --resume compares it, that one is graded again (its
    report says why); the batch goes on."""
    from grader.stages import layout as submission

    out = tmp_path / "out"
    out.mkdir()
    paths = [str(tmp_path / n) for n in ("a", "b")]
    for path in paths:
        os.makedirs(path)
        open(os.path.join(path, "kv_cache.py"), "w").write("x = 1\n")
        report_of = {**graded(os.path.basename(path), "Hire"), "hand_back_sha256": submission.hand_back_sha256(path)}
        (out / report_name(os.path.basename(path))).write_text(json.dumps(report_of))
    real = submission.materialize

    def broken_for_b(path, workdir, notes=None):
        if path.endswith("b"):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real(path, workdir, notes)

    monkeypatch.setattr(submission, "materialize", broken_for_b)
    changed: list = []
    assert set(finished_reports(paths, str(out), changed)) == {paths[0]} and changed == [paths[1]]


def test_a_class_folder_gives_one_row_per_entry(tmp_path):
    cls = tmp_path / "class"
    (cls / "alice").mkdir(parents=True)
    (cls / "bob.py").write_text("x = 1\n")
    (cls / "carol.zip").write_bytes(b"PK")
    (cls / "notes.txt").write_text("hello")
    (cls / ".hidden").write_text("")
    os.symlink(cls / "alice", cls / "linked")
    rows = [os.path.basename(p) for p in expand([str(cls)])]
    assert rows == ["alice", "bob.py", "carol.zip", "linked", "notes.txt"]
    # Notebooks in a class folder are entries too; a folder with one notebook (and notes) is one hand-back.
    (cls / "dave.ipynb").write_text("{}")
    (cls / "erin.ipynb").write_text("{}")
    rows = [os.path.basename(p) for p in expand([str(cls)])]
    assert rows == ["alice", "bob.py", "carol.zip", "dave.ipynb", "erin.ipynb", "linked", "notes.txt"]
    single = tmp_path / "frank"
    single.mkdir()
    (single / "work.ipynb").write_text("{}")
    (single / "notes.txt").write_text("hello")
    assert expand([str(single)]) == [str(single)]


def test_entries_that_are_not_submissions_are_not_graded(tmp_path):
    from grader.stages.grade import Options, grade

    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "linked")
    for name, why in (("notes.txt", "a submission is"), ("linked", "symbolic link")):
        r = grade(str(tmp_path / name), Options(seed=1, trials=5))
        assert r["status"] == "not_graded" and r["tier"] is None and why in r["tier_reason"], r["tier_reason"]


def test_every_status_follows_the_schema():
    import jsonschema

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                           "report.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(graded("a", "Hire"), schema)
    for status in ("not_graded", "grader_error"):
        jsonschema.validate(report.ungraded("b", 1, RUBRIC, "why", status), schema)
    bad = report.ungraded("b", 1, RUBRIC, "why")
    bad["tier"] = "Weak"  # a tier without a verdict
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_folder_that_is_one_submission_is_not_split(tmp_path):
    misnamed = tmp_path / "misnamed"
    misnamed.mkdir()
    for name in ("kvcache.py", "cost.py", "test_kv_cache.py"):
        (misnamed / name).write_text("x = 1\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert expand([str(misnamed)]) == [str(misnamed)]  # one row: a submission without kv_cache.py
    assert expand([str(empty)]) == [str(empty)]


def test_stale_temporary_folders_of_dead_graders_are_swept(tmp_path):
    import subprocess
    import sys

    from grader.sandbox import launch

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"kvkit-run-{dead}-abc").mkdir()
    (tmp_path / f"kvkit-probe-data-{dead}-xyz").mkdir()
    mine = launch.temp_dir("kvkit-run-", str(tmp_path))
    (tmp_path / "kvkit-run-notapid").mkdir()
    launch.sweep_stale(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(mine), "kvkit-run-notapid"])


def test_a_folder_of_other_files_is_one_bad_hand_back(tmp_path):
    (tmp_path / "README.md").write_text("hi")
    assert expand([str(tmp_path)]) == [str(tmp_path)]


def test_a_rubric_whose_points_do_not_add_up_is_refused(tmp_path):
    from grader.stages.rubric import DEFAULT, RubricError

    text = open(DEFAULT).read().replace("max_score = 100.0", "max_score = 50.0")
    (tmp_path / "r.toml").write_text(text)
    with pytest.raises(RubricError, match="add up to 100"):
        load(str(tmp_path / "r.toml"))


# --- the rubric, scores and questions as build_report applies them ------------------------------

from grader.stages import criteria as criteria_mod  # noqa: E402
from grader.stages import grade as grade_mod  # noqa: E402
from grader.stages import port as port_mod  # noqa: E402


def decided(overrides: dict | None = None) -> dict:
    """Every rubric criterion passing, with ``overrides`` ({id: (status, evidence)})."""
    out = {cid: criteria_mod.Criterion(cid, "pass", "ok") for cid in RUBRIC.criteria}
    for cid, (status, evidence) in (overrides or {}).items():
        out[cid] = criteria_mod.Criterion(cid, status, evidence)
    return out


def built(crits: dict, named=None, port_named=None) -> dict:
    options = grade_mod.Options(seed=1, rubric=RUBRIC)
    return grade_mod.build_report("x", options, crits, named or {}, port_named or {}, [], "test", 0.0, None)


def test_an_optional_section_not_attempted_counts_neither_for_nor_against():
    perfect_without_port = built(decided({"torch_port": ("not_attempted", "no kv_cache_torch.py")}))
    assert perfect_without_port["tier"] == "Strong Hire"
    assert perfect_without_port["score"] == pytest.approx(RUBRIC.max_score, abs=0.1)
    capped = built(decided({"torch_port": ("fail", "port mistakes: kv_repeat")}), port_named={"kv_repeat": "peak"})
    assert capped["tier"] == "Hire" and capped["score"] < perfect_without_port["score"]
    # A Strong Hire criterion not attempted (own tests) still counts against.
    no_tests = built(decided({"own_tests": ("not_attempted", "no tests")}))
    assert no_tests["score"] < RUBRIC.max_score


def test_the_tier_reason_says_a_check_was_not_measured_and_why():
    r = built(decided({"no_kv_repeat": ("error", "the memory probe raised IndexError in attention"),
                       "decode": ("fail", "3 of 9 decode steps fail")}))
    assert r["tier"] == "Weak"
    reason = r["tier_reason"]
    assert "not measured: the memory probe raised IndexError" in reason
    assert reason.index("Decode") < reason.index("No materialised")  # the failure, the cause, first
    long = built(decided({"head_mapping": ("error", "could not be told: one-token rows return no KV head's value "
                                                     + "(first: a trial of many words) " * 8)}))
    shown = long["tier_reason"].split("not measured: ", 1)[1]
    assert shown.endswith(" ...)") and len(shown) < 170, shown  # cut at a word, never mid-word


def test_port_mistakes_are_tagged_by_section_and_the_cap_is_spelled_out():
    r = built(decided({"torch_port": ("fail", "port mistakes: kv_repeat")}), port_named={"kv_repeat": "peak"})
    assert report.mistakes_line(r) == "port: kv_repeat (caps the tier at Hire)"
    assert "port: kv_repeat (caps the tier at Hire)" in r["tier_reason"]
    # A class reads its own tier names there too, in the terminal and in the Markdown (never "Hire").
    in_class = report.mistakes_line(r, RUBRIC, "class")
    assert in_class == f"port: kv_repeat (caps the tier at {RUBRIC.label('Hire', 'class')})" and "Hire" not in in_class
    assert f"Mistakes: port: kv\\_repeat (caps the tier at {RUBRIC.label('Hire', 'class')})" in \
        report.markdown([r], RUBRIC, "class")
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, color_system=None)
    report.print_report(r, console, RUBRIC, "class")
    terminal = " ".join(console.file.getvalue().split())
    assert "Mistakes: port: kv_repeat (caps the tier at " + RUBRIC.label("Hire", "class") in terminal, terminal


def test_the_class_summary_counts_a_port_mistake_apart_from_the_same_name_in_numpy():
    """A port's kv_repeat caps the tier; NumPy's makes it Weak: the summary never adds the two up."""
    port = built(decided({"torch_port": ("fail", "port mistakes: kv_repeat")}), port_named={"kv_repeat": "peak"})
    numpy_too = built(decided({"no_kv_repeat": ("fail", "9x")}), named={"kv_repeat": "9x"},
                      port_named={"kv_repeat": "peak"})
    assert summary.mistake_counts([port, numpy_too]) == {"port: kv_repeat": 2, "kv_repeat": 1}
    text = summary.markdown([port, numpy_too])
    assert "| `port: kv_repeat` | 2 | 100% |" in text and "| `kv_repeat` | 1 | 50% |" in text
    assert "mistake,port: kv_repeat,port: kv_repeat,2,2" in summary.summary_csv([port, numpy_too])
    rows = summary.csv_text([port, numpy_too]).splitlines()
    assert ",port: kv_repeat," in rows[1] and ",kv_repeat; port: kv_repeat," in rows[2], rows


def test_a_port_that_scans_max_len_caps_the_tier_though_the_numpy_part_would_not():
    """Any mistake named in the port caps the tier (a gpt-fast port over the whole reservation), while the
    same mistake in the NumPy part costs the live-length points and caps nothing."""
    port = built(decided({"torch_port": ("fail", "port mistakes: max_len_scan")}), port_named={"max_len_scan": "10x"})
    assert port["tier"] == "Hire" and port["port_cap"] == "Hire", port["tier_reason"]
    assert "port: max_len_scan (caps the tier at Hire)" in port["tier_reason"]
    numpy = built(decided({"live_length": ("fail", "25x: attention scans max_len")}), named={"max_len_scan": "25x"})
    assert numpy["tier"] == "Strong Hire" and numpy["score"] < RUBRIC.max_score, numpy["tier_reason"]


def test_follow_ups_follow_the_diagnosis():
    asked = lambda r: [q["question"] for q in r["follow_ups"]]  # noqa: E731
    port_q = next(q["question"] for q in grade_mod.load_catalogue()[1] if q.get("criterion") == "torch_port")
    assert port_q not in asked(built(decided()))  # the port passed: no port question
    assert port_q in asked(built(decided({"torch_port": ("not_attempted", "none")})))
    refused = built(decided({"chunked_prefill": ("not_attempted", "refused with a clear error")}))
    first = refused["follow_ups"][0]  # what the refused call must do, tagged with no mistake of theirs
    assert first["mistake"] is None and first["about"] == "chunked_prefill"
    assert "bottom-right" in first["answer"]
    named = built(decided({"decode": ("fail", "wrong")}), named={"missing_scale": "reproduced"})
    assert named["follow_ups"][0]["mistake"] == "missing_scale"


def _steps(statuses, value_error=True):
    """Step verdicts of one trial: each a chunk after cached tokens, with the given statuses."""
    from grader.stages.compare import StepVerdict
    from grader.stages.suite import Trial

    trial = Trial("t", "targeted", 1, 1, 1, 2, 8)
    return [StepVerdict(trial, i, "chunked_prefill", s, detail="append raised ValueError: no chunks",
                        error={"type": "ValueError", "message": "no chunks", "value_error": value_error}
                        if s == "raised" else None, chunk_after_prefix=True)
            for i, s in enumerate(statuses)]


def test_a_refusal_is_credited_only_when_every_chunked_call_was_refused():
    every = _steps(["raised", "raised"])
    assert criteria_mod.correctness("chunked_prefill", every, "chunked", refusable=every).status == "not_attempted"
    some = _steps(["raised", "ok"])  # a uniform chunk refused, another answered: the refusal is no rule
    ragged_answered = _steps(["wrong"])
    result = criteria_mod.correctness("chunked_prefill", some[:1], "chunked", refusable=some + ragged_answered)
    assert result.status == "fail"
    unclear = _steps(["raised"], value_error=False)
    unclear[0].error["type"] = "IndexError"
    assert criteria_mod.correctness("chunked_prefill", unclear, "chunked", refusable=unclear).status == "fail"


def test_nan_padding_gets_its_smallest_failing_case():
    from grader.stages import diagnose
    from grader.stages.compare import Comparison, StepVerdict
    from grader.stages.suite import Trial

    big, small = Trial("big", "random", 3, 2, 4, 16, 40), Trial("small", "small", 1, 1, 1, 2, 4)
    comparison = Comparison([StepVerdict(big, 0, "ragged", "ok", padding="nonfinite"),
                             StepVerdict(small, 2, "ragged", "ok", padding="nonfinite")])
    assert "NaN or inf in padded query slots" in diagnose.smallest_failing(comparison)
    assert "B=1" in diagnose.smallest_failing(comparison)
    assert "smallest: step 3 of trial 'small'" in criteria_mod.padding(comparison).evidence


def test_one_registry_of_criteria_and_a_rubric_of_points_and_tiers_only(tmp_path):
    from grader.stages.registry import REGISTRY
    from grader.stages.rubric import RubricError, Tier

    # That grader/rubric.toml gives every registry criterion points and a tier and no title is
    # ``kvkit check-kit``'s (grader/batch/check_kit.py ``check_rubric``); here, what load and Rubric do.
    assert all(RUBRIC.title(cid) == spec.title for cid, spec in REGISTRY.items())
    text = open(os.path.join(grader.HOME, "rubric.toml")).read()
    with_title = tmp_path / "titled.toml"
    with_title.write_text(text.replace("[criteria.decode]\n", '[criteria.decode]\ntitle = "Decode"\n'))
    with pytest.raises(RubricError, match="titles come from the kit's registry"):
        load(str(with_title))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(text.replace("[criteria.decode]", "[criteria.decoding]"))
    with pytest.raises(RubricError, match="unknown criteria decoding; no points for decode"):
        load(str(unknown))
    assert [t.value for t in Tier] == TIERS and Tier.HIRE == "Hire" and json.dumps(Tier.WEAK) == '"Weak"'


def test_diagnosis_pictures_reach_the_terminal_and_the_markdown_as_png(tmp_path):
    from rich.console import Console

    from grader.stages import diagnose

    mask = {"case": "B=1, Hkv=4, G=2; step 2", "row": 0, "head": 0, "keys": 7,
            "yours": [[0, 1, 2, 3, 4, 5, 6]] * 3, "right": [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], list(range(7))],
            "empty": [0, 0, 0]}
    heads = {"case": "B=1; step 1", "yours": [0, 1, 2, 3, 0, 1, 2, 3], "right": [0, 0, 1, 1, 2, 2, 3, 3]}
    r = graded("alice", "Weak")
    r["diagnosis"] = {"summary": "recovered: future_keys_visible", "pictures": {"mask": mask, "heads": heads},
                      "lines": diagnose.picture_lines(mask, "mask") + diagnose.picture_lines(heads, "heads")}
    console = Console(record=True, width=120)
    report.print_report(r, console)
    text = console.export_text()
    assert "Diagnosis: recovered: future_keys_visible" in text and "#######      #####.." in text
    assert "yours       0 1 2 3 0 1 2 3" in text
    path = tmp_path / "out" / "report.md"
    report.write_markdown(str(path), [r])
    md = path.read_text()
    pngs = sorted((tmp_path / "out" / "report-img").glob("*.png"))
    assert [p.name.split("-")[-1] for p in pngs] == ["heads.png", "mask.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert f"](report-img/{pngs[1].name})" in md and "```text" in md


def test_chunked_prefill_silently_wrong_is_weak_and_a_refusal_is_not():
    wrong = decided({"chunked_prefill": ("fail", "3 of 9 chunked prefill steps fail")})
    wrong["chunked_prefill"].silent = True
    r = built(wrong)
    assert r["tier"] == "Weak" and "silently wrong" in r["tier_reason"] and r["mistakes"] == []
    raised = decided({"chunked_prefill": ("fail", "3 of 9 chunked prefill steps raise IndexError")})
    assert built(raised)["tier"] == "Hire"  # failing by raising is not silent
    refused = decided({"chunked_prefill": ("not_attempted", "chunked prefill refused with a clear error "
                                                            "(ValueError: chunks after cached tokens)")})
    assert built(refused)["tier"] == "Hire"
    # The reason says what the check saw (a refusal), not only that nothing was attempted.
    assert "(not attempted: chunked prefill refused with a clear error" in built(refused)["tier_reason"]


def test_a_sandbox_that_never_reaches_a_task_is_a_grader_error(monkeypatch):
    """No submission code ran (the grader's Python or isolation is broken): never a Weak verdict."""
    from grader.stages import run as run_mod
    from grader.sandbox.launch import SessionResult

    def never_starts(workdir, plan, limits, wrap, port=False, meanwhile=None):
        return {"numpy": SessionResult(reason="the sandbox ended before every task ran"), "meanwhile": meanwhile()}

    monkeypatch.setattr(run_mod, "run_sessions", never_starts)
    r = grade_mod.grade(os.path.join(grader.KIT_ROOT, "catalogue", "examples", "hire_basic"),
                        grade_mod.Options(seed=1, trials=5))
    assert r["status"] == "grader_error" and r["tier"] is None and "did not start" in r["tier_reason"]


def test_the_batch_table_marks_the_ports_mistakes():
    """A name in the port caps the tier; the same name in NumPy is Weak: the table keeps them apart."""
    from grader.batch.summary import _mistakes_cell

    assert _mistakes_cell({"mistakes": ["kv_repeat"], "numpy_mistakes": [], "port_mistakes": ["kv_repeat"]}) \
        == "port: kv_repeat"
    assert _mistakes_cell({"mistakes": ["chunk_local_mask", "kv_repeat"], "numpy_mistakes": ["chunk_local_mask"],
                           "port_mistakes": ["kv_repeat"]}) == "chunk_local_mask; port: kv_repeat"
    assert _mistakes_cell({"mistakes": []}) == ""


def test_only_the_untouched_template_is_not_graded():
    """Every hidden trial stopping at NotImplementedError before any step ran is the template handed back
    (not graded, saying so); a template with anything written is graded."""
    from grader.stages.grade import _nothing_written

    stub = {"stage": "init", "error": {"type": "NotImplementedError", "message": ""}}
    assert _nothing_written({"records": [[stub], [stub]]})
    assert _nothing_written({"records": [[{**stub, "stage": "append"}]]})
    assert not _nothing_written({"records": [[stub], [{"stage": "appended"}, {"stage": "attention", "error": stub["error"]}]]})
    assert not _nothing_written({"records": [[{**stub, "error": {"type": "ValueError"}}]]})
    assert not _nothing_written({"records": []})


def test_a_submission_that_does_not_load_is_weak_with_each_criterion_saying_why():
    """Graded at the lowest tier (the candidate's code ran and failed), every criterion keeps its section
    and tier; what was not handed in is not attempted, the port left out and the rest scaled to the total."""
    from grader.stages.grade import _not_measured_lines
    from grader.stages.report import ungraded

    rubric = load()
    report = ungraded("dave", 1, rubric, "kv_cache.py: failed to import: SyntaxError")
    report["criteria"] = [line.to_dict() for line in _not_measured_lines(
        ["kv_cache.py", "cost.py"], "not measured: kv_cache.py: failed to import", rubric)]
    by_id = {c["id"]: c for c in report["criteria"]}
    assert by_id["torch_port"]["status"] == "not_attempted" and by_id["torch_port"]["counted"] is False
    assert by_id["own_tests"]["status"] == "not_attempted"
    assert by_id["cost_model"]["status"] == "error" and "cost.py" in by_id["cost_model"]["evidence"]
    assert by_id["decode"]["evidence"].startswith("not measured") and by_id["decode"]["tier"] == "Hire"
    assert abs(sum(c["max_points"] for c in report["criteria"]) - rubric.max_score) < 1e-6


def test_hand_backs_of_one_name_get_their_folders_in_their_names(tmp_path):
    """nbgrader's submitted/<student>/<assignment>/<notebook>.ipynb: every student's file has one name, and
    their reports in --out overwrote one another. Each name now takes as many parent folders as tell it apart."""
    paths = [str(tmp_path / "submitted" / who / "kv_cache" / "kv_cache.ipynb") for who in ("alice", "bob")]
    paths.append(str(tmp_path / "extra" / "carol.zip"))
    names = batch_names(paths)
    assert names == {paths[0]: "alice/kv_cache/kv_cache.ipynb", paths[1]: "bob/kv_cache/kv_cache.ipynb",
                     paths[2]: "carol.zip"}
    assert len({report_name(n) for n in names.values()}) == 3
    assert batch_names([paths[0], paths[0]]) == {paths[0]: "kv_cache.ipynb"}  # the same hand-back twice


def test_a_batch_writes_one_report_per_hand_back_of_the_same_name(tmp_path):
    from grader.batch import cli

    for who in ("alice", "bob"):
        (tmp_path / who / "work").mkdir(parents=True)
        (tmp_path / who / "work" / "notes.txt").write_text("no code here\n")  # not graded: nothing runs
    out = tmp_path / "out"
    assert cli.main([str(tmp_path / "alice" / "work"), str(tmp_path / "bob" / "work"), "--out", str(out),
                     "--quiet"]) == 0
    written = {json.loads((out / n).read_text())["submission"] for n in os.listdir(out) if n.endswith(".json")}
    assert written == {"alice/work", "bob/work"}


def test_report_file_names_never_clash_and_fit_a_file_system():
    """'a/k.py' (folders in its name) beside a hand-back named 'a_k.py', and a 255-byte name: each report
    gets a file of its own (once, one overwrote the other, and the long one ended the batch)."""
    names = ["a/k.py", "a_k.py", "b" * 252 + ".py", "c" * 252 + ".py/k.py", "k.py"]
    files = [report_name(n) for n in names]
    assert len(set(files)) == len(names)
    assert files[1] == "a_k.py.json" and files[4] == "k.py.json"  # a plain name keeps its file (--resume)
    assert all(len(f.encode()) <= 255 and "/" not in f for f in files), files


def test_a_class_with_a_name_as_long_as_a_file_system_allows_loses_no_report(tmp_path):
    from grader.batch import cli

    cls = tmp_path / "class"
    for name in ("a_first", "b" * 255, "c_last"):  # 255 bytes: the longest name a folder may have
        (cls / name).mkdir(parents=True)
        (cls / name / "notes.txt").write_text("no code here\n")  # not graded: nothing runs
    out = tmp_path / "out"
    assert cli.main([str(cls), "--out", str(out), "--quiet"]) == 0
    written = [n for n in os.listdir(out) if n.endswith(".json")]
    assert len(written) == 3 and not [n for n in os.listdir(out) if n.startswith(".tmp-")], os.listdir(out)
    assert {json.loads((out / n).read_text())["submission"] for n in written} == {"a_first", "b" * 255, "c_last"}


def test_a_figure_no_run_can_judge_does_not_fail_the_port():
    """A criterion the kernel's figures cannot judge either way (``unjudgeable``) leaves the port's points as
    they are; a probe that raised still fails it."""
    unjudged = criteria_mod.Criterion("live_length", "error", "not judged", unjudgeable=True)
    raised = criteria_mod.Criterion("live_length", "error", "the live-length probe (large reservation): raised")
    assert port_mod.failures([unjudged]) == [] and port_mod.failures([raised]) == [raised]
    assert port_mod.failures([criteria_mod.Criterion("chunked_prefill", "error", "refused")]) == []


def test_no_two_hand_backs_of_a_batch_share_a_report_file():
    """A folder named like another's flattened name and digest, or the same name but for its case (one file
    on a file system that ignores case): the later gets a file of its own (once, it overwrote the other)."""
    from grader.batch.cli import report_files

    first = "/c/n1/x/k"
    forged = "/c/q/" + report_name("n1/x/k")[:-len(".json")]  # its folder named as the first one's file
    paths = [first, "/c/n2/x/k", forged, "/c/Alice", "/c/alice"]
    files = report_files(paths)
    assert len({f.casefold() for f in files.values()}) == len(paths), files
    assert files[first] == report_name("n1/x/k") and files[forged] == report_name("n1/x/k")[:-5] + "-2.json"
    assert files["/c/Alice"] == "Alice.json" and files["/c/alice"] == "alice-2.json"
    composed, decomposed = "/x/caf\u00e9", "/y/cafe\u0301"  # one name to macOS's file systems
    assert report_files([composed, decomposed])[decomposed].endswith("-2.json")


def test_a_live_length_no_figure_can_judge_counts_neither_for_nor_against():
    """nanoGPT's mask table made with the cache: its live length cannot be judged, so its points leave the
    total as an optional section's do, and the honest design scores as the same code without the table."""
    unjudged = criteria_mod.Criterion("live_length", "error", "not judged: making the cache ...", unjudgeable=True)
    crits = {**decided(), "live_length": unjudged}
    r = built(crits)
    assert r["score"] == pytest.approx(RUBRIC.max_score, abs=0.1) and r["tier"] == "Strong Hire"
    row = next(c for c in r["criteria"] if c["id"] == "live_length")
    assert row["counted"] is False and row["max_points"] == 0 and row["status"] == "error"
    raised = built({**decided(), "live_length": criteria_mod.Criterion("live_length", "error", "probe raised")})
    assert raised["score"] < RUBRIC.max_score - 1  # a probe that could not run still costs its points


def test_resume_keeps_no_report_of_another_hand_back(tmp_path):
    """A late hand-back 'A' beside 'a' and 'a-2' moves the files' suffixes: 'a' now reads the file that held
    'a-2''s report, of the same files. A kept report counts only under its own hand-back's name (once, 'a-2'
    was listed twice and 'a' not at all)."""
    from grader.batch.cli import report_files
    from grader.stages.layout import hand_back_sha256

    cls, out = tmp_path / "class", tmp_path / "out"
    out.mkdir()
    for name in ("a", "a-2", "A"):
        (cls / name).mkdir(parents=True)
        (cls / name / "kv_cache.py").write_text("x = 1\n")  # the same files in each
    before = [str(cls / n) for n in ("a", "a-2")]
    for path, file in report_files(before).items():  # the first run's files, before 'A' came
        (out / file).write_text(json.dumps({**graded(os.path.basename(path), "Hire"),
                                            "hand_back_sha256": hand_back_sha256(path)}))
    now = [str(cls / n) for n in ("A", "a", "a-2")]
    kept = finished_reports(now, str(out))
    assert all(r["submission"] == os.path.basename(p) for p, r in kept.items()), kept
    assert str(cls / "a") not in kept  # its file now is a-2's old one


def test_a_hand_back_name_that_is_not_utf8_is_written_escaped(tmp_path):
    """Linux allows any bytes in a name; Python reads them as lone surrogates. The summaries are written
    with them escaped (once, the batch ended with a UnicodeEncodeError before summary.md)."""
    bad = report.ungraded("bad\udcff", 1, RUBRIC, "no kv_cache.py")  # listed by name under "Not graded"
    summary.write([bad, graded("ok", "Weak")], str(tmp_path))
    assert "bad\\udcff" in (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "bad\\udcff" in (tmp_path / "grades.csv").read_text(encoding="utf-8")


@pytest.mark.parametrize("edit", [{"tier": "hire"}, {"tier": None}, {"criteria": 5}, {"criteria": [{}]},
                                  {"numpy_mistakes": 5}, {"score": "80"}])
def test_resume_grades_again_a_kept_report_edited_out_of_shape(tmp_path, edit):
    """A kept report edited by hand (a lowercase tier, criteria that are not a list): the summaries could not
    read it, and the batch once ended before grades.csv. It is graded again, and every summary is written."""
    from grader.batch import cli
    from grader.stages.layout import hand_back_sha256

    cls, out = tmp_path / "class", tmp_path / "out"
    for name in ("alice", "bob"):
        (cls / name).mkdir(parents=True)
        (cls / name / "notes.txt").write_text("no code here\n")  # not graded: nothing runs
    out.mkdir()
    kept = {**graded("alice", "Hire"), "hand_back_sha256": hand_back_sha256(str(cls / "alice")), **edit}
    (out / "alice.json").write_text(json.dumps(kept))
    assert cli.main([str(cls), "--out", str(out), "--resume", "--quiet"]) == 0
    assert {"summary.md", "summary.csv", "grades.csv"} <= set(os.listdir(out))
    assert json.loads((out / "alice.json").read_text())["status"] == "not_graded"  # graded again


def test_the_terminal_marks_a_check_that_could_not_be_measured_as_not_measured():
    """'ERR' read as the grader failing (a new user's reading); the check was not measured, and says why."""
    import io

    from rich.console import Console

    r = built(decided({"live_length": ("error", "not judged: making the cache costs too much")}))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    report.print_report(r, console, RUBRIC)
    row = next(line for line in console.file.getvalue().splitlines() if "live length" in line)
    assert row.lstrip().startswith("not measured") and "ERR" not in row, row


def test_a_performance_finding_beside_strong_hire_is_said_to_decide_no_tier():
    """max_len_scan named beside every check passing: Strong Hire, and the reason says the finding is reported
    and decides no tier (a hiring manager read 'every check passes' beside a named mistake as a contradiction)."""
    crits = decided({"live_length": ("fail", "attention scans max_len")})
    crits["live_length"].mistakes = ["max_len_scan"]
    report = built(crits, named={"max_len_scan": "scan"})
    assert report["tier"] == "Strong Hire"
    assert "max_len_scan is reported and decides no tier" in report["tier_reason"], report["tier_reason"]
    assert "decides no tier" not in built(decided())["tier_reason"]
