"""The mistakes catalogue is one source of truth: it holds the spec's mistakes, and each planted mutant and
example behaves as its entry says. That the catalogue's ids, fields, mutants and examples agree with the code
that reads them is ``kvkit check-kit``'s (grader/batch/check_kit.py; tests/test_check_kit.py)."""
from __future__ import annotations

import importlib.util
import os
import tomllib

import numpy as np
import pytest

from catalogue import mutants
from grader.inprocess.checks import check, check_all
from solutions import kv_cache as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "catalogue", "mistakes.toml"), "rb") as f:
    MISTAKES = tomllib.load(f)
with open(os.path.join(ROOT, "catalogue", "examples", "expected.toml"), "rb") as f:
    EXPECTED = tomllib.load(f)
SPEC_IDS = ["concat_growth", "kv_repeat", "modulo_head_mapping", "chunk_local_mask", "off_by_one_mask",
            "ragged_keys_unmasked", "nan_padding", "length_before_write", "missing_scale", "max_len_scan"]
# Patterns real code shows that the spec's list lacks (recovered structure names them).
KIT_IDS = ["future_keys_visible", "misplaced_writes", "div_kv_heads_mapping"]
# The in-process checks are named by the criterion ids they decide (grader.stages.registry.REGISTRY).
CHECKED = ("preallocated_in_place", "overflow_atomic", "head_mapping", "decode", "full_prefill",
           "chunked_prefill", "ragged_rows", "padding")


def load_example(name):
    path = os.path.join(ROOT, "catalogue", "examples", name, "kv_cache.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_spec_mistake_is_catalogued():
    assert sorted(MISTAKES) == sorted(SPEC_IDS + KIT_IDS)


@pytest.mark.parametrize("mistake", mutants.PLANTED)
def test_each_planted_mutant_is_named_by_its_check(mistake):
    KVCache, attention = mutants.plant(mistake, ref.KVCache, ref.gqa_attention)
    name = MISTAKES[mistake]["criterion"]
    result = check(name, KVCache, attention, count=20)
    assert not result.passed, f"{mistake}: the {name} check passed on the planted mutant"
    if mistake in ("concat_growth", "length_before_write", "nan_padding"):
        assert mistake in result.mistakes, result.message


def test_chunk_local_mutant_is_silent_at_decode_and_full_prefill():
    KVCache, attention = mutants.plant("chunk_local_mask", ref.KVCache, ref.gqa_attention)
    for name in ("decode", "full_prefill", "head_mapping"):
        assert check(name, KVCache, attention, count=20).passed, name
    assert not check("chunked_prefill", KVCache, attention, count=20).passed


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_each_example_behaves_as_its_entry_says(example):
    """Correct examples pass every output check; a mistake's example fails exactly the checks it should."""
    module = load_example(example)
    mistakes = EXPECTED[example]["mistakes"]
    failing_checks = {MISTAKES[m]["criterion"] for m in mistakes if MISTAKES[m]["criterion"] in CHECKED}
    failing_checks |= set(EXPECTED[example].get("refuses", []))  # refused with a clear error: no output to pass
    if "chunked_prefill" in EXPECTED[example].get("refuses", []):
        # The in-process check counts every ragged step, refused chunks included (the notebook grades
        # ragged_rows_unchunked apart); kvkit grade judges ragged rows on the calls the refusal does not touch.
        failing_checks.add("ragged_rows")
    failing_checks |= set(EXPECTED[example].get("fails", []))  # wrong with no catalogued pattern
    if {"chunk_local_mask", "ragged_keys_unmasked", "future_keys_visible"} & set(mistakes):
        failing_checks.add("ragged_rows")  # ragged trials contain chunks too
    if {"modulo_head_mapping", "div_kv_heads_mapping", "missing_scale", "off_by_one_mask"} & set(mistakes):
        failing_checks |= {"decode", "full_prefill", "chunked_prefill", "ragged_rows"} - (
            {"decode"} if "off_by_one_mask" in mistakes else set())
    results = check_all(CHECKED, module.KVCache, module.gqa_attention, count=20)
    for name in CHECKED:
        result = results[name]
        if name in failing_checks:
            assert not result.passed, f"{example}: {name} should fail"
        elif name in ("decode", "full_prefill", "head_mapping", "preallocated_in_place", "overflow_atomic", "padding") \
                or not mistakes:
            assert result.passed, f"{example}: {name} should pass: {result.message}"
