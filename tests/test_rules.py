"""catalogue/rules.py: the mask rule, the bounds and the mistakes' records, each written once.

The reference's ``visible_keys`` (the answer to read) is the rule's default mask; every window the
planted mutants, the structure recovery and the learner's step checks know is one of the rule's
``MASKS``; the in-process meters and the step checks read their limits from ``BOUNDS``; the grader reads
``mistakes.toml`` through the typed loader, which also reads the copies the bundles ship.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from catalogue import mutants, rules, structure
from grader.inprocess import meters
from grader.shipped import bundle
from solutions import kv_cache as ref

KIT = Path(__file__).resolve().parent.parent


@st.composite
def calls(draw):
    """``(lens, n_new, T, S)`` of one attention call: lengths after the append, ``n_new <= lens``,
    ``T >= n_new.max()`` (padded slots too), ``S >= lens.max()`` (the contract passes ``lens.max()``)."""
    B = draw(st.integers(0, 4))
    lens = np.array(draw(st.lists(st.integers(0, 12), min_size=B, max_size=B)), dtype=np.int64)
    n_new = np.array([draw(st.integers(0, int(n))) for n in lens], dtype=np.int64)
    T = draw(st.integers(int(n_new.max(initial=0)), int(n_new.max(initial=0)) + 3))
    S = int(lens.max(initial=0)) + draw(st.sampled_from([0, 0, 0, 2]))
    return lens, n_new, T, S


@settings(max_examples=300, deadline=None)
@given(calls())
def test_the_references_visible_keys_is_the_rules_default_mask(call):
    lens, n_new, T, S = call
    got = ref.visible_keys(lens, n_new, T, S)
    want = rules.visible(lens, n_new, T, S)
    assert got.shape == want.shape == (len(lens), T, S) and want.dtype == bool
    assert np.array_equal(got, want)


def test_the_ports_visible_keys_is_the_rules_default_mask():
    torch = pytest.importorskip("torch")
    from solutions import kv_cache_torch as port

    rng = np.random.default_rng(5)
    for _ in range(200):
        B = int(rng.integers(0, 4))
        lens = rng.integers(0, 10, size=B)
        n_new = np.array([rng.integers(0, n + 1) for n in lens], dtype=np.int64)
        T = int(n_new.max(initial=0)) + int(rng.integers(0, 3))
        S = int(lens.max(initial=0))
        got = port.visible_keys(torch.as_tensor(lens), torch.as_tensor(n_new), T, S).numpy()
        assert np.array_equal(got, rules.visible(lens, n_new, T, S))


def test_each_named_window_on_one_chunk():
    """A chunk of 3 real tokens in 4 slots appended to a row that now holds 7 (the batch's longest holds 9):
    query 1 sits at position 5."""
    lens, n, t, T, S = 7, 3, 1, 4, 9
    want = {
        "right": (0, 6),
        "chunk_local_mask": (0, 2),  # keys 0..t: the chunk's own triangle at the top left
        "chunk_local_mask/at_decode_too": (0, 2),
        "chunk_local_mask/prefix_hidden": (4, 6),  # the chunk's own keys 4, 5
        "chunk_local_mask/prefix_hidden_at_decode_too": (4, 6),
        "off_by_one_mask": (0, 7),
        "off_by_one_mask/too_few": (0, 5),
        "future_keys_visible": (0, 7),  # every key of the row
        "ragged_keys_unmasked": (0, 8),  # counted from S: S - n + t = 7, past the row's 7 keys
        "ragged_keys_unmasked/batch_mask": (0, 7),  # tril(ones(T, S), S - T): S - T + t = 6
    }
    assert set(want) == set(rules.MASKS)
    for name, window in want.items():
        assert rules.seen_window(name, lens, n, t, T, S) == window, name


def test_decode_keeps_or_shows_each_mistake_as_the_mask_says():
    """At T = 1 (lens 7, the longest row 9) the chunk-local masks that skip decode see the right keys."""
    right = rules.seen_window("right", 7, 1, 0, 1, 9)
    assert right == (0, 7)
    assert rules.seen_window("chunk_local_mask", 7, 1, 0, 1, 9) == right
    assert rules.seen_window("chunk_local_mask/prefix_hidden", 7, 1, 0, 1, 9) == right
    assert rules.seen_window("chunk_local_mask/at_decode_too", 7, 1, 0, 1, 9) == (0, 1)
    assert rules.seen_window("chunk_local_mask/prefix_hidden_at_decode_too", 7, 1, 0, 1, 9) == (6, 7)
    assert rules.seen_window("off_by_one_mask", 7, 1, 0, 1, 9) == right  # nothing follows the last token
    assert rules.seen_window("ragged_keys_unmasked", 7, 1, 0, 1, 9) == (0, 9)


def test_a_mask_knows_its_origins():
    with pytest.raises(ValueError, match="origin"):
        rules.Mask(origin="top_left")
    with pytest.raises(ValueError, match="lens and n_new"):
        rules.visible([3, 2], [1], 1, 3)


def test_the_planted_and_recovered_windows_are_the_rules():
    """mutants.WINDOWS and structure.MASKS are the windows of rules.MASKS, query for query."""
    assert set(structure.MASKS) == set(rules.MASKS)
    assert set(mutants.WINDOWS) <= set(rules.MASKS)
    assert set(mutants.WINDOWS) == {v for vs in mutants.VARIANTS.values() for v in vs} & set(rules.MASKS)

    def as_window(c):
        return None if c is None else (c if isinstance(c, tuple) else (0, c))

    for S in range(1, 7):
        for lens in range(1, S + 1):
            for n in range(1, lens + 1):
                for T in range(n, n + 3):
                    for t in range(n):
                        pos = lens - n + t
                        right = rules.seen_window("right", lens, n, t, T, S)
                        for name in rules.MASKS:
                            window = rules.seen_window(name, lens, n, t, T, S)
                            recovered = as_window(structure.MASKS[name](pos, t, lens, n, T, S))
                            assert recovered == (None if window == right and name != "right" else window), name
                            if name in mutants.WINDOWS:
                                planted = as_window(mutants.WINDOWS[name](pos, t, lens, n, T, S))
                                assert planted == (None if window[1] <= window[0] else window), name


def _stepkit():
    path = KIT / "exercises" / "tests" / "stepkit.py"
    spec = importlib.util.spec_from_file_location("kvkit_test_rules_stepkit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_checks_name_a_mistake_by_its_window():
    """stepkit.explain_window names the mistake whose window of rules.MASKS the query saw."""
    stepkit = _stepkit()
    names = {"chunk_local_mask": (7, 3, 1, 3, 7), "chunk_local_mask/at_decode_too": (7, 1, 0, 1, 7),
             "off_by_one_mask": (7, 3, 1, 3, 7), "off_by_one_mask/too_few": (7, 3, 1, 3, 7),
             "ragged_keys_unmasked": (5, 2, 0, 3, 9), "ragged_keys_unmasked/batch_mask": (5, 1, 0, 3, 9)}
    for name, (lens, n, t, T, S) in names.items():
        lo, hi = rules.seen_window(name, lens, n, t, T, S)
        assert (lo, hi) != rules.seen_window("right", lens, n, t, T, S), name
        why = stepkit.explain_window((lo, hi - 1), lens - n + t, t, lens, n, T, S)
        assert f"({structure.mistake_of(name)})" in why, (name, why)
    assert "one mask was built for the whole batch" in stepkit.explain_window((0, 6), 4, 0, 5, 1, 3, 9)
    assert "counted from the longest row" in stepkit.explain_window((0, 7), 3, 0, 5, 2, 3, 9)


# --------------------------------------------------------------------------- the bounds

def test_the_meters_repeat_limit_is_the_tables():
    G, live = 8, 1_000_000
    limit = rules.repeat_peak_limit(G) * live
    assert rules.repeat_peak_limit(G) == rules.BOUNDS["repeat_per_head"].limit * G
    below = meters.judge_repeat({"peak_bytes": int(limit) - 1, "live_kv_bytes": live, "G": G})
    at = meters.judge_repeat({"peak_bytes": int(limit) + 1, "live_kv_bytes": live, "G": G})
    assert below.status == "pass" and at.status == "fail" and at.mistakes == ["kv_repeat"]


def test_no_module_of_the_kit_keeps_a_bound_of_its_own():
    assert not (KIT / "grader" / "stages" / "bounds.py").exists()
    for path in (KIT / "grader" / "inprocess" / "meters.py", KIT / "exercises" / "tests" / "stepkit.py"):
        text = path.read_text()
        assert "REPEAT_FACTOR" not in text and "GROWTH_FRACTION" not in text and "G // 2" not in text, path


# --------------------------------------------------------------------------- the mistakes' records

def test_the_catalogue_reads_into_records():
    records = rules.mistakes()
    assert rules.mistakes() is records  # read once
    assert list(records) == list(tomllib.loads((KIT / "catalogue" / "mistakes.toml").read_text()))
    entry = records["chunk_local_mask"]
    assert entry.id == "chunk_local_mask" and entry.criterion == "chunked_prefill" and entry.mutant
    assert entry.shown_by == "structure" and entry.question and entry.answer
    assert sorted(m for m, e in records.items() if e.mutant) == sorted(mutants.PLANTED)


def test_the_bundles_public_copy_reads_with_the_private_fields_absent(tmp_path):
    path = tmp_path / "mistakes.toml"
    path.write_text(bundle.public_mistakes((KIT / "catalogue" / "mistakes.toml").read_text()))
    public = rules.mistakes(str(path))
    assert list(public) == list(rules.mistakes())
    entry = public["kv_repeat"]
    assert entry.title and entry.what and entry.mutant is False
    assert entry.criterion is entry.question is entry.answer is entry.shown_by is None


@pytest.mark.parametrize("text,words", [
    ('[ghost]\ntitle = "t"\nwhat = "w"\nmutant = false\neffect = "weak"\n', "effect"),
    ('[ghost]\ntitle = "t"\nmutant = false\n', "lacks what"),
    ('ghost = 3\n', "must be a table"),
])
def test_a_catalogue_the_records_cannot_hold_is_refused(tmp_path, text, words):
    path = tmp_path / "mistakes.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=words):
        rules.mistakes(str(path))


# --------------------------------------------------------------------------- shipped beside the others

@pytest.fixture
def no_loaded_rules():
    """``_kvkit_rules`` (the name a file loaded by path finds rules.py under) unset for the test, then restored."""
    saved = sys.modules.pop("_kvkit_rules", None)
    yield
    sys.modules.pop("_kvkit_rules", None)
    if saved is not None:
        sys.modules["_kvkit_rules"] = saved


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_the_mutants_and_structure_load_by_path_with_rules_beside_them(tmp_path, no_loaded_rules):
    """As the starter bundle and step 7's shim load them: files in a folder that is no package."""
    for name in ("mutants.py", "structure.py", "rules.py", "mistakes.toml"):
        shutil.copy(KIT / "catalogue" / name, tmp_path / name)
    sys.modules["_kvkit_rules"] = _load("_kvkit_rules", tmp_path / "rules.py")  # first, as the step tests do
    planted = _load("kvkit_test_rules_mutants", tmp_path / "mutants.py")
    recovered = _load("kvkit_test_rules_structure", tmp_path / "structure.py")
    assert Path(sys.modules["_kvkit_rules"].__file__).parent == tmp_path
    assert set(recovered.MASKS) == set(rules.MASKS)
    KVCache, attention = planted.plant("chunk_local_mask", ref.KVCache, ref.gqa_attention)
    cache, plain = KVCache(1, 1, 8, 2, dtype=np.float64), ref.KVCache(1, 1, 8, 2, dtype=np.float64)
    rng = np.random.default_rng(0)
    for n in (4, 3):
        kv = rng.standard_normal((1, 1, n, 2))
        cache.append(kv, kv, np.array([n]))
        plain.append(kv, kv, np.array([n]))
    q = rng.standard_normal((1, 1, 3, 2))
    assert not np.allclose(attention(q, cache, np.array([3])), ref.gqa_attention(q, plain, np.array([3])))


def test_a_copy_without_rules_says_what_it_needs(tmp_path, no_loaded_rules):
    shutil.copy(KIT / "catalogue" / "mutants.py", tmp_path / "mutants.py")
    with pytest.raises(ImportError, match="rules"):
        _load("kvkit_test_rules_lonely", tmp_path / "mutants.py")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_graders_oracle_attends_over_the_rules_window(data):
    """The oracle (``grader/stages/oracle.py`` ``attention_ref``) keeps its own loop over keys 0 .. pos, written
    for obviousness; the keys it reads are the rule's: a softmax over ``rules.visible`` gives its outputs."""
    from grader.stages.oracle import attention_ref

    B = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, 4))
    n_new = np.array(data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
    lens = n_new + np.array(data.draw(st.lists(st.integers(0, 5), min_size=B, max_size=B)))
    S = int(lens.max())
    assume(S > 0)  # an empty batch attends to nothing: the oracle's own edge, not the rule's
    Hkv, G, d = 2, 2, 3
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    q = rng.standard_normal((B, Hkv * G, T, d))
    k, v = rng.standard_normal((B, Hkv, S + 2, d)), rng.standard_normal((B, Hkv, S + 2, d))
    seen = rules.visible(lens, n_new, T, S)  # [B, T, S]
    kr, vr = np.repeat(k[:, :, :S], G, axis=1), np.repeat(v[:, :, :S], G, axis=1)  # fine here: tiny
    scores = np.where(seen[:, None], q @ kr.swapaxes(-1, -2) / np.sqrt(d), -np.inf)
    top = np.where(seen[:, None].any(-1, keepdims=True), scores.max(-1, keepdims=True), 0.0)
    w = np.where(seen[:, None], np.exp(scores - top), 0.0)
    want = np.nan_to_num(w / np.where(w.sum(-1, keepdims=True) > 0, w.sum(-1, keepdims=True), 1.0)) @ vr
    np.testing.assert_allclose(attention_ref(q, k, v, lens, n_new), want, atol=1e-10)
