"""Step 4: ragged rows and NaN-free padding.

Rows hold different numbers of tokens, calls carry padded slots (t >= n_new[b])
and rows that receive nothing. A row never sees a key at or past its own
length; a padded slot's output is exactly 0; nothing raises a floating-point
error. Everything here runs under ``np.errstate(divide, over, invalid='raise')``
(underflow to 0 is fine: exp(-large) is an exact 0 that numpy merely flags).
"""
import numpy as np
import pytest

import adapters
import stepkit as kit

STEP = 4


def backend():
    return kit.numpy_backend(adapters.kv_cache(STEP))


@pytest.fixture(autouse=True)
def raise_on_floating_point_errors():
    # conftest.py turns a FloatingPointError from kv_cache.py into a plain-words failure.
    with np.errstate(divide="raise", over="raise", invalid="raise", under="ignore"):
        yield


def test_a_row_that_gets_no_tokens_returns_zeros():
    kit.run_windows(backend(), "a row with n_new=0", Hkv=1, G=2, calls=[([3, 0], 3), ([0, 2], 2)])


def test_padded_slots_are_exactly_zero():
    kit.run_windows(backend(), "padded slots", Hkv=2, G=2, calls=[([4, 2], 4), ([1, 3], 3)])


def test_ragged_rows_see_only_their_own_keys():
    # lens [2, 5, 3] after the first call, then a chunk with different counts per row.
    kit.run_windows(backend(), "ragged rows", Hkv=2, G=2,
                    calls=[([2, 5, 3], 5), ([3, 1, 2], 3), ([1, 1, 1], 1)], poison=True)


def test_ragged_decode_with_idle_rows():
    kit.run_windows(backend(), "ragged decode", Hkv=1, G=3,
                    calls=[([6, 2, 4], 6), ([1, 1, 0], 1), ([0, 1, 1], 1)], check={1, 2}, poison=True)


def test_random_queries_keep_padding_at_zero():
    kit.run_padding_random(backend(), "random inputs with padding")


def test_empty_batch_empty_cache_and_no_slots():
    kit.run_empty(backend(), "nothing to attend")
