"""Chunked prefill as the rubric says (issue 21, points 6 and 9).

* The chunked-prefill check that can make a verdict Weak reads only rows that have had the same length and
  received all T tokens of every call since the cache was empty; a mask offset right there but wrong on
  ragged rows fails ragged rows alone (Hire), and names no uniform-rows mistake.
* A clear refusal of chunked prefill is charged once: ragged rows, padding, overflow, own tests and the port
  are judged on the calls it does not touch.
* The mask that hides the cached prefix (a chunk sees only its own keys) is ``chunk_local_mask``.

Fast: the hidden trials run in this process on the catalogue's example files (trusted code).
"""
from __future__ import annotations

import numpy as np
import pytest

from catalogue import mutants, structure
from grader.stages import compare, criteria as criteria_mod, diagnose, grade, own_tests as owntests, registry, suite
from grader.stages.compare import Comparison, StepVerdict
from grader.stages.evidence import Evidence
from solutions import kv_cache as ref
from test_diagnose import example, recovered, run
from test_owntests import _all, _session

SEED = 3


def _trials():
    return (suite.targeted_trials(SEED) + suite.overflow_trials(SEED) + suite.small_cases(SEED)
            + suite.structure_trials(SEED) + suite.random_trials(SEED, 20))


def _graded(name: str):
    """``(criteria, named)`` of an example's outputs on the hidden trials, decided as ``kvkit grade`` does."""
    comparison, outputs = run(*example(name), _trials())
    crits = _correctness(comparison, outputs)
    named, _ = diagnose.name_mistakes(crits, comparison, outputs)
    crits["overflow_atomic"] = criteria_mod.overflow_from_trials(comparison, outputs)
    return crits, named


def _correctness(comparison, outputs) -> dict:
    """The criteria decided from outputs, by the registry."""
    return registry.decide_all(Evidence(comparison=comparison, outputs=outputs), ids=registry.CORRECTNESS)


# ---------------------------------------------------------------- uniform rows decide chunked prefill

def test_a_step_after_a_padded_call_is_ragged_though_its_rows_are_equal():
    """Equal rows that once received fewer tokens than T slots: a design that advances one shared position
    by T (padding included) is wrong there, and that is a ragged-rows (padding) case, not chunked prefill."""
    rng = np.random.default_rng(0)
    padded_first = suite.build("p", "targeted", rng, 2, 1, 2, 4, [[3, 3], [2, 2]], T=[4, 2])
    assert compare.step_kinds(padded_first) == ["ragged", "ragged"]
    uniform = suite.build("u", "targeted", rng, 2, 1, 2, 4, [[3, 3], [2, 2], [1, 1]])
    assert compare.step_kinds(uniform) == ["full_prefill", "chunked_prefill", "decode"]


def test_a_mask_offset_right_on_uniform_rows_and_wrong_on_ragged_rows_fails_ragged_rows_alone():
    """One causal offset for the batch (S - T) and a padding mask: chunked prefill passes on uniform rows; a
    shorter row's chunk sees its own later tokens, the window future_keys_visible gives, but on ragged rows
    only: no uniform-rows mistake is named, and no catalogued ragged pattern fits (unnamed)."""
    crits, named = _graded("shared_offset_mask")
    assert crits["chunked_prefill"].status == "pass", crits["chunked_prefill"].evidence
    assert crits["ragged_rows"].status == "fail"
    assert all(crits[c].status == "pass" for c in ("decode", "full_prefill", "head_mapping", "padding"))
    assert named == {}, named
    diag = recovered(*example("shared_offset_mask"))
    assert diag.wrong_queries and diag.named == {}, diag.named


def test_the_rubric_makes_that_offset_hire():
    crits, named = _graded("shared_offset_mask")
    every = {cid: grade.criteria_mod.Criterion(cid, "pass", "ok") for cid in grade.rubric_mod.load().criteria}
    report = grade.build_report("x", grade.Options(seed=1), {**every, **crits}, named, {}, [], "none", 0.0, None)
    assert report["tier"] == "Hire" and report["mistakes"] == [], (report["tier_reason"], report["mistakes"])
    assert "Ragged rows" in report["tier_reason"]


@pytest.mark.parametrize("pattern", ["future_keys_visible", "off_by_one_mask", "chunk_local_mask"])
def test_a_uniform_rows_pattern_seen_only_on_ragged_rows_explains_nothing(pattern):
    """The pattern of a uniform-rows check counts for a ragged query only when uniform rows show it too."""
    ragged_only = diagnose._judged_on_uniform_rows([{pattern}, {pattern, "ragged_keys_unmasked"}], [False, False])
    assert ragged_only == [set(), {"ragged_keys_unmasked"}]
    shown = diagnose._judged_on_uniform_rows([{pattern}, {pattern}], [True, False])
    assert shown == [{pattern}, {pattern}]


def test_the_planted_ragged_and_chunked_masks_are_still_named():
    for variant, mistake in (("chunk_local_mask", "chunk_local_mask"), ("ragged_keys_unmasked/batch_mask",
                                                                        "ragged_keys_unmasked")):
        assert set(recovered(*mutants.plant(variant, ref.KVCache, ref.gqa_attention)).named) == {mistake}


# ---------------------------------------------------------------- a refusal is charged once

def _verdict(trial, index, kind, status, chunk):
    error = {"type": "NotImplementedError", "message": "no chunks", "value_error": False} \
        if status == "raised" else None
    return StepVerdict(trial, index, kind, status, detail="append raised NotImplementedError: no chunks"
                       if error else "", error=error, chunk_after_prefix=chunk)


def test_ragged_rows_are_judged_on_the_calls_a_refusal_does_not_touch():
    trial = suite.Trial("t", "targeted", 2, 1, 1, 2, 16)
    steps = [_verdict(trial, 0, "decode", "ok", False), _verdict(trial, 1, "full_prefill", "ok", False),
             _verdict(trial, 2, "chunked_prefill", "raised", True),
             _verdict(trial, 3, "ragged", "raised", True),  # a ragged chunk after cached tokens, refused
             _verdict(trial, 4, "ragged", "ok", False)]     # a ragged decode, answered right
    crits = _correctness(Comparison(steps), {})
    assert crits["chunked_prefill"].status == "not_attempted"
    assert "charged here only" in crits["chunked_prefill"].evidence
    assert crits["ragged_rows"].status == "pass", crits["ragged_rows"].evidence
    assert "charged to chunked prefill alone" in crits["ragged_rows"].evidence
    # Without a refusal (a chunk answered wrong), the ragged chunks count as ever.
    steps[2].status, steps[2].error = "wrong", None
    crits = _correctness(Comparison(steps), {})
    assert crits["chunked_prefill"].status == "fail" and crits["ragged_rows"].status == "fail"


def test_a_refusal_keyed_on_the_calls_width_is_charged_once_too():
    """A refusal of every call with T > 1 after cached tokens also refuses a padded one that gives a row a
    single token (T < S all the same): that call is the refusal's, not a ragged-rows failure; a call of
    that width answered wrong still counts."""
    trial = suite.Trial("t", "targeted", 2, 1, 1, 2, 16)
    steps = [_verdict(trial, 0, "decode", "ok", False), _verdict(trial, 1, "full_prefill", "ok", False),
             _verdict(trial, 2, "chunked_prefill", "raised", True),
             _verdict(trial, 3, "ragged", "raised", False),  # T = 2, n_new = [1, 0] onto cached rows: refused
             _verdict(trial, 4, "ragged", "ok", False)]
    steps[3].wide_after_prefix = True
    crits = _correctness(Comparison(steps), {})
    assert crits["chunked_prefill"].status == "not_attempted" and crits["ragged_rows"].status == "pass", \
        crits["ragged_rows"].evidence
    steps[3].status, steps[3].error = "wrong", None
    assert _correctness(Comparison(steps), {})["ragged_rows"].status == "fail"


@pytest.mark.parametrize("name", ["hire_refuses_chunks", "refuses_chunks_with_port"])
def test_a_refusal_of_chunks_fails_nothing_else(name):
    """ValueError or NotImplementedError before the cache is touched: chunked prefill is not attempted, and
    ragged rows, padding and overflow pass on the calls the refusal does not touch; nothing is named."""
    crits, named = _graded(name)
    assert crits["chunked_prefill"].status == "not_attempted", crits["chunked_prefill"].evidence
    for cid in ("decode", "full_prefill", "head_mapping", "ragged_rows", "padding", "overflow_atomic"):
        assert crits[cid].status == "pass", (cid, crits[cid].evidence)
    assert named == {}


def test_no_overflow_trial_sends_a_chunk_after_cached_tokens():
    """An append past max_len still overflows with several tokens, but into an empty row: a cache that refuses
    chunks before it checks the room is judged on its overflow, not refused twice."""
    for trial in suite.overflow_trials(SEED):
        lens = np.zeros(trial.B, dtype=np.int64)
        for step in trial.steps:
            assert not ((lens > 0) & (step.n_new > 1)).any(), trial.describe()
            lens = lens + (0 if step.overflow else step.n_new)
        over = [s for s in trial.steps if s.overflow]
        assert all(int(s.n_new.max()) > 1 for s in over)


def test_a_refusal_made_before_the_room_is_checked_passes_the_overflow_check():
    class Refusing(ref.KVCache):
        def append(self, k_new, v_new, n_new):
            if np.any((np.asarray(self.lens) > 0) & (np.asarray(n_new) > 1)):
                raise NotImplementedError("no chunked prefill")
            return super().append(k_new, v_new, n_new)

    comparison, outputs = run(Refusing, ref.gqa_attention, suite.overflow_trials(SEED))
    result = grade.criteria_mod.overflow_from_trials(comparison, outputs)
    assert result.status == "pass", result.evidence


def test_own_tests_of_a_refusal_may_catch_the_ragged_mask_instead():
    """The chunk-local mutant changes mostly the calls a refusal refuses: tests that catch the ragged-rows mask
    mutant on the calls it does not touch pass; tests that catch neither fail, naming both."""
    answers = _all(**{mutants.MUST_CATCH: {"exit": 0}})
    crit = owntests.criterion(_session(answers), ["test_mine.py"], chunks_refused=True)
    assert crit.status == "pass" and "chunked prefill is refused" in crit.evidence, crit.evidence
    assert owntests.criterion(_session(answers), ["test_mine.py"]).status == "fail"
    neither = _all(**{mutants.MUST_CATCH: {"exit": 0}, owntests.KEY_MUTANT_IF_CHUNKS_REFUSED: {"exit": 0}})
    crit = owntests.criterion(_session(neither), ["test_mine.py"], chunks_refused=True)
    assert crit.status == "fail" and "miss chunk_local_mask or ragged_keys_unmasked" in crit.evidence


# ---------------------------------------------------------------- the cached prefix hidden

@pytest.mark.parametrize("seed", [1, 2])
def test_a_chunk_that_sees_only_its_own_keys_is_the_chunk_local_mask(seed):
    diag = recovered(*mutants.plant("chunk_local_mask/prefix_hidden", ref.KVCache, ref.gqa_attention), seed=seed)
    assert set(diag.named) == {"chunk_local_mask"}, diag.named
    assert "the cached prefix hidden" in diag.named["chunk_local_mask"]
    picture = diag.mask
    assert picture["yours"][0] == [picture["right"][0][-1]]  # query 0 of the chunk sees its own key alone
    lines = diagnose.picture_lines(picture, "mask")
    assert lines[2].split()[1].startswith("." * len(picture["right"][0][:-1]) + "#")


def test_the_top_left_mask_keeps_its_own_evidence():
    diag = recovered(*mutants.plant("chunk_local_mask", ref.KVCache, ref.gqa_attention))
    assert "top-left aligned" in diag.named["chunk_local_mask"]


def test_the_prefix_hidden_example_is_weak_for_chunk_local_mask():
    crits, named = _graded("chunk_prefix_hidden")
    assert crits["chunked_prefill"].status == "fail" and set(named) == {"chunk_local_mask"}, named
    assert all(crits[c].status == "pass" for c in ("decode", "full_prefill", "head_mapping", "padding"))


def test_a_prefix_hidden_window_is_read_as_such_and_nothing_else():
    """Query 1 of a 3-token chunk after 4 cached tokens sees keys 4 and 5 (not 0 .. 5)."""
    seen = structure.Seen({(0, 0, 4): 1, (0, 0, 5): 1}, 0, 2)
    heads, masks = structure.classify(seen, 0, 0, 1, 1, 5, 1, np.array([7]), np.array([3]), 3)
    assert masks == {"chunk_local_mask/prefix_hidden", "chunk_local_mask/prefix_hidden_at_decode_too"}
    seen = structure.Seen({(0, 0, 6): 1}, 0, 1)  # a decode query that sees its own key alone
    _, masks = structure.classify(seen, 0, 0, 1, 1, 6, 0, np.array([7]), np.array([1]), 1)
    assert masks == {"chunk_local_mask/prefix_hidden_at_decode_too"}
