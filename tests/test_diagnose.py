"""Diagnosis from recovered structure: a mistake is named only when the keys or heads a submission
was seen to read are that mistake's pattern; anything else is "wrong output, no known mistake".

Fast: the structure trials run in this process on trusted code (planted mutants around the
reference, the catalogue's example files, and small hand-written bugs).
"""
from __future__ import annotations

import importlib.util
import os
import types

import numpy as np
import pytest

from catalogue import mutants, structure
from grader.stages import compare, criteria, diagnose, jobs, suite
from grader.child import tasks
from solutions import kv_cache as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(KVCache, attention, trials):
    """``(comparison, outputs_by_trial)`` of ``trials`` run in process."""
    spec, data = jobs.encode(trials)
    records, flat = tasks.run_trials(types.SimpleNamespace(KVCache=KVCache, gqa_attention=attention),
                                     spec["trials"], data)
    it, outputs = iter(flat), []
    for trial, rec in zip(trials, records):
        outputs.append([next(it).reshape(s.q.shape) if i < len(rec) and rec[i].get("stored") else None
                        for i, s in enumerate(trial.steps)])
    comparison = compare.compare(trials, records, outputs, compare.expected_outputs(trials))
    return comparison, {t.name: o for t, o in zip(trials, outputs)}


def recovered(KVCache, attention, seed=1):
    comparison, outputs = run(KVCache, attention, suite.structure_trials(seed))
    return diagnose.recover(comparison, outputs)


def example(name):
    path = os.path.join(ROOT, "catalogue", "examples", name, "kv_cache.py")
    spec = importlib.util.spec_from_file_location(f"diag_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KVCache, module.gqa_attention


@pytest.mark.parametrize("variant", ["chunk_local_mask", "off_by_one_mask", "off_by_one_mask/too_few",
                                     "ragged_keys_unmasked", "ragged_keys_unmasked/batch_mask",
                                     "modulo_head_mapping"])
@pytest.mark.parametrize("seed", [1, 2])
def test_each_planted_pattern_is_recovered_and_named_alone(variant, seed):
    diag = recovered(*mutants.plant(variant, ref.KVCache, ref.gqa_attention), seed=seed)
    assert set(diag.named) == {structure.mistake_of(variant)}, diag.named
    assert diag.mask or diag.heads


@pytest.mark.parametrize("name", ["future_keys_visible", "misplaced_writes", "div_kv_heads_mapping", "shared_position_cache",
                                  "chunk_local_mask", "off_by_one_mask", "ragged_keys_unmasked",
                                  "modulo_head_mapping"])
def test_each_example_shows_its_own_pattern(name):
    want = {"shared_position_cache": "misplaced_writes"}.get(name, name)  # a real design: one shared position
    assert set(recovered(*example(name)).named) == {want}


def test_right_code_and_a_missing_scale_show_no_structure_mistake():
    assert recovered(ref.KVCache, ref.gqa_attention).wrong_queries == 0
    diag = recovered(*mutants.plant("missing_scale", ref.KVCache, ref.gqa_attention))
    assert diag.named == {} and diag.wrong_queries == 0  # q = 0: the scale changes nothing


def test_an_output_head_permutation_is_not_called_a_mapping_mistake():
    """Heads 0 and 7 swapped on the way out: query head 0 reads KV head 3, which no known map gives."""
    def swapped(q, cache, n_new):
        out = np.array(ref.gqa_attention(q, cache, n_new))
        out[:, [0, -1]] = out[:, [-1, 0]]
        return out

    diag = recovered(ref.KVCache, swapped)
    assert diag.wrong_queries and diag.named == {}
    assert diag.heads["yours"][0] == 3 and diag.heads["right"][0] == 0


def test_values_scaled_after_the_softmax_show_no_known_mistake():
    def halved(q, cache, n_new):
        return np.asarray(ref.gqa_attention(q, cache, n_new)) * 0.5

    diag = recovered(ref.KVCache, halved)
    assert diag.wrong_queries and diag.named == {}


def test_decode_reads_the_exact_key_set():
    B, Hkv, P = 2, 2, 3
    out = np.zeros(structure.head_dim_for(B, Hkv, P))
    for pos in (0, 1):
        out[structure.token_coordinate(1, 1, pos, Hkv, P)] = 1 / 3  # two tokens and one empty slot
    seen = structure.decode(out, B, Hkv, P)
    assert seen.tokens == {(1, 1, 0): 1, (1, 1, 1): 1} and seen.empty == 1 and seen.n == 3
    assert structure.decode(np.full_like(out, np.nan), B, Hkv, P) is None
    uneven = out.copy()
    uneven[structure.token_coordinate(1, 1, 0, Hkv, P)] = 0.5
    assert structure.decode(uneven, B, Hkv, P) is None  # weights of 1/2 and 1/3: not one softmax of equal scores


def test_explain_needs_every_wrong_query_and_takes_the_fewest_names():
    assert structure.explain([{"a"}, {"a", "b"}, {"b", "c"}]) in ({"a", "b"}, {"a", "c"})
    assert structure.explain([{"a"}, {"a", "b"}]) == {"a"}
    assert structure.explain([{"a"}, set()]) is None


def test_the_grid_puts_yours_beside_the_right_window():
    lines = structure.grid([{0, 1, 2}], [{0, 1}], 3, [1])
    assert lines[1].split() == ["0", "###+1", "##."]


def test_head_mapping_errors_rather_than_fails_when_no_head_value_comes_back():
    """A value-slicing bug: outputs are wrong but are no KV head's value, so the mapping cannot be told."""
    def sliced(q, cache, n_new):
        out = np.array(ref.gqa_attention(q, cache, n_new))
        out[..., 1:] = out[..., :-1].copy()  # values shifted by one coordinate
        return out

    trials = [t for t in suite.targeted_trials(1) if t.name.startswith("head-map-")]
    comparison, outputs = run(ref.KVCache, sliced, trials)
    result = criteria.head_mapping(comparison, outputs)
    assert result.status == "error" and "no KV head's value" in result.evidence
    comparison, outputs = run(*mutants.plant("modulo_head_mapping", ref.KVCache, ref.gqa_attention), trials)
    result = criteria.head_mapping(comparison, outputs)
    assert result.status == "fail" and "returns v of KV head" in result.evidence


def test_a_decode_bug_is_not_taken_for_an_overflow_bug():
    """The decode after a failed append is judged against the same decode without that append."""
    trials = suite.overflow_trials(1)
    comparison, outputs = run(*mutants.plant("modulo_head_mapping", ref.KVCache, ref.gqa_attention), trials)
    assert any(s.status == "wrong" for s in comparison.of_kind("after_overflow"))
    assert criteria.overflow_from_trials(comparison, outputs).status == "pass"
    comparison, outputs = run(*mutants.plant("length_before_write", ref.KVCache, ref.gqa_attention), trials)
    result = criteria.overflow_from_trials(comparison, outputs)
    assert result.status == "fail" and result.mistakes == ["length_before_write"]


def test_a_strict_mask_whose_first_query_sees_nothing_is_the_off_by_one_mask():
    """`s < pos` instead of `s <= pos`, with a softmax kept finite: each query misses its own key, and the
    first token of a row sees nothing and returns 0. That first query is the same pattern, not an unknown."""
    def strict(q, cache, n_new):
        q = np.asarray(q)
        B, Hq, T, d = q.shape
        G = Hq // cache.k.shape[1]
        out = np.zeros(q.shape, dtype=q.dtype)
        for b in range(B):
            lens, n = int(cache.lens[b]), int(n_new[b])
            for t in range(n):
                pos = lens - n + t
                for h in range(Hq):
                    k, v = cache.k[b, h // G, :pos], cache.v[b, h // G, :pos]  # keys 0 .. pos - 1
                    if pos:
                        s = k @ q[b, h, t] / np.sqrt(d)
                        w = np.exp(s - s.max())
                        out[b, h, t] = (w / w.sum()) @ v
        return out

    assert set(recovered(ref.KVCache, strict).named) == {"off_by_one_mask"}

    def first_query_zero(q, cache, n_new):  # right everywhere but a row's first token, which returns 0
        out = np.array(ref.gqa_attention(q, cache, n_new))
        for b in range(out.shape[0]):
            start = int(cache.lens[b]) - int(n_new[b])
            if start == 0 and int(n_new[b]) > 0:
                out[b, :, 0] = 0.0
        return out

    diag = recovered(ref.KVCache, first_query_zero)
    assert diag.wrong_queries and not diag.named, diag.named  # only zeros show it: nothing is named


def test_a_top_left_mask_at_decode_too_is_still_the_chunk_local_mask():
    """Learner and grader name the same code alike: top-left at every call, decode included."""
    def top_left_everywhere(q, cache, n_new):
        out = np.array(ref.gqa_attention(q, cache, n_new))
        q = np.asarray(q)
        B, Hq, T, d = q.shape
        G = Hq // cache.k.shape[1]
        for b in range(B):
            for t in range(int(n_new[b])):
                for h in range(Hq):
                    k, v = cache.k[b, h // G, :t + 1], cache.v[b, h // G, :t + 1]
                    s = k @ q[b, h, t] / np.sqrt(d)
                    w = np.exp(s - s.max())
                    out[b, h, t] = (w / w.sum()) @ v
        return out

    assert set(recovered(ref.KVCache, top_left_everywhere).named) == {"chunk_local_mask"}


def test_the_flat_inputs_are_written_as_laid_end_to_end(tmp_path):
    """``Flat.save`` streams each dtype's chunks into one ``.npy`` file: the same array as concatenating them."""
    flat = jobs.Flat()
    refs = [flat.ref(np.arange(6.0).reshape(2, 3), "float32"), flat.ref(np.ones(3), "float64"),
            flat.ref(np.arange(4)[::2], "float32")]  # a strided chunk too
    for dtype, expected in flat.arrays().items():
        flat.save(dtype, str(tmp_path / f"{dtype}.npy"))
        written = np.load(tmp_path / f"{dtype}.npy", allow_pickle=False)
        assert written.dtype == np.dtype(dtype) and np.array_equal(written, expected)
    assert refs[2] == [6, [2]]
