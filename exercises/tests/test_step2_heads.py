"""Step 2: grouped-query attention without copying K/V per query head.

Fills the first part of ``gqa_attention`` in kv_cache.py: which KV head each
query head reads, and the scaled softmax. Every check here is a full prefill
of one row (T = S) or a decode step, and only looks at outputs the causal
mask does not change, so the mask can wait for step 3.
"""
import numpy as np
import pytest

import adapters
import stepkit as kit

STEP = 2


def backend():
    return kit.numpy_backend(adapters.kv_cache(STEP))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_output_has_q_shape_and_dtype(dtype):
    kit.run_heads(backend(), "output shape and dtype", Hkv=2, G=2, T=3, d=4, dtype=dtype)


@pytest.mark.parametrize("Hkv,G", [(1, 4), (4, 1), (2, 2), (2, 4), (4, 2), (3, 2), (8, 4)],
                         ids=["MQA Hkv=1 G=4", "MHA Hkv=4 G=1", "Hkv=2 G=2", "Hkv=2 G=4", "Hkv=4 G=2",
                              "Hkv=3 G=2", "Llama-3.1-8B Hkv=8 G=4"])
def test_query_head_h_reads_kv_head_h_div_g(Hkv, G):
    kind = "MQA" if Hkv == 1 else ("MHA" if G == 1 else "GQA")
    kit.run_heads(backend(), f"head mapping, {kind}", Hkv=Hkv, G=G, T=3, d=4)


def test_scores_are_scaled_by_one_over_sqrt_d():
    kit.run_scale(backend(), "the score scale")


def test_large_scores_do_not_overflow():
    kit.run_large_scores(backend(), "large scores", np.float32)


def test_no_copy_of_k_or_v_per_query_head():
    kit.run_no_repeat_numpy(backend(), "no K/V repeat")


def test_bad_input_is_refused_with_a_clear_error():
    kit.run_bad_attention(backend(), "bad input to gqa_attention")
