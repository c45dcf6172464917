"""The own-tests criterion reads each variant's run as data, and says "error" (never "fail") when pytest
did not finish there; the zygote that runs the variants side by side never closes a task's own pipe, and
every task it forks allocates the same way, whatever the zygote freed before."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from catalogue import mutants
from grader.stages import own_tests as owntests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _session(answers: dict):
    """A stand-in for the sandbox's session: ``{variant: answer or None}`` as its own-tests tasks."""
    tasks = {f"own:{v}": types.SimpleNamespace(answer=a, why=lambda: "killed") for v, a in answers.items()}
    return types.SimpleNamespace(tasks=tasks, reason="")


def _all(code_of_mutant: int = 1, **overrides) -> dict:
    answers = {"none": {"exit": 0}, mutants.CONTROL: {"exit": 0}}
    answers.update({m: {"exit": code_of_mutant} for m in mutants.PLANTED})
    answers.update(overrides)
    return answers


def test_tests_that_catch_every_mutant_pass():
    crit = owntests.criterion(_session(_all()), ["test_mine.py"])
    assert crit.status == "pass", crit.evidence
    assert f"caught {len(mutants.PLANTED)} of {len(mutants.PLANTED)}" in crit.evidence


def test_tests_that_miss_the_key_mutant_fail():
    crit = owntests.criterion(_session(_all(**{mutants.MUST_CATCH: {"exit": 0}})), ["test_mine.py"])
    assert crit.status == "fail" and f"miss {mutants.MUST_CATCH}" in crit.evidence


@pytest.mark.parametrize("answer", [
    {"error": {"type": "OSError", "message": "[Errno 9] Bad file descriptor"}, "trace": "..."},  # escaped the run
    {"exit": None}, {"exit": "0"}, {"exit": True}, {"exit": -1, "error": "no variant was handed over"},
])
def test_a_run_that_did_not_finish_on_the_submission_is_an_error_not_a_failure(answer):
    crit = owntests.criterion(_session(_all(none=answer)), ["test_mine.py"])
    assert crit.status == "error", crit.evidence
    assert "could not be run on the submission" in crit.evidence


def test_a_control_that_did_not_finish_is_an_error():
    crit = owntests.criterion(_session(_all(**{mutants.CONTROL: {"error": "x"}})), ["test_mine.py"])
    assert crit.status == "error" and "control" in crit.evidence


def test_tests_that_fail_on_the_control_cannot_be_judged_and_say_what_to_fix():
    answers = _all(**{mutants.CONTROL: {"exit": 1, "failed": ["test_mine.py::test_x - assert out is last"]}})
    crit = owntests.criterion(_session(answers), ["test_mine.py"])
    assert crit.status == "error", crit.evidence
    assert "fail on the control" in crit.evidence and "outcomes" in crit.evidence and "test_x" in crit.evidence


def test_the_key_mutant_not_run_is_an_error_not_a_miss():
    answers = _all(**{mutants.MUST_CATCH: {"error": {"type": "MemoryError", "message": ""}}})
    crit = owntests.criterion(_session(answers), ["test_mine.py"])
    assert crit.status == "error", crit.evidence
    assert f"not run: {mutants.MUST_CATCH}" in crit.evidence


def test_tests_that_fail_on_the_submission_fail():
    crit = owntests.criterion(_session(_all(none={"exit": 1, "failed": ["test_mine.py::test_x - boom"]})),
                              ["test_mine.py"])
    assert crit.status == "fail" and "pytest exit 1" in crit.evidence and "test_x" in crit.evidence


def _zygote():
    path = os.path.join(ROOT, "grader", "child", "zygote.py")
    spec = importlib.util.spec_from_file_location("_test_zygote", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_task_process_keeps_its_own_pipe_whatever_the_zygote_still_lists():
    """A pipe end another thread closed can be listed in ``_OPEN`` a moment longer, under a number the
    next pipe reuses: the task process forked then must still keep its own ends (its answer arrives)."""
    zygote = _zygote()
    zygote.FDS.update(to_parent=os.open(os.devnull, os.O_WRONLY), from_parent=os.open(os.devnull, os.O_RDONLY))
    zygote._OPEN.update(set(range(3, 1024)) - set(zygote.FDS.values()))  # every number the next pipe could get
    tasks = types.SimpleNamespace(serve=lambda task, job, fd: os.write(fd, b"answer"))
    try:
        pid, read, _, _, _ = zygote._fork_task({"name": "t"}, {}, tasks)
        answer, stopped, waited = zygote._read_answer(read, pid, 10.0)
    finally:
        zygote._OPEN.clear()
        for fd in zygote.FDS.values():
            os.close(fd)
    assert stopped == "" and waited is not None
    assert answer == b"answer"


# In a process of its own (the allocator's state is per process): the zygote frees a large block, as after
# reading a large answer, then forks a task that makes a 9 MiB zeroed buffer (a cache's K or V) and prints
# how much of it the task has written (private dirty KiB: the memory a cgroup charges to the task).
_ALLOCATOR_SCRIPT = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("z", sys.argv[1])
z = importlib.util.module_from_spec(spec)
spec.loader.exec_module(z)
if sys.argv[2] == "fixed":
    z._fixed_malloc()
import numpy as np
def dirty_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))
big = bytes(24 << 20); del big
held = bytearray(20 << 20); del held
pid = os.fork()
if pid == 0:
    before = dirty_kib()
    buffer = np.zeros(9 << 20, dtype=np.uint8)
    print(dirty_kib() - before, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux's /proc/self/smaps_rollup")
def test_a_task_allocates_the_same_way_whatever_the_zygote_freed_before():
    """glibc moves its mmap threshold to each large block freed, and a forked task inherits it: the task
    then takes a zeroed buffer from the heap and writes every page of it. The zygote fixes the threshold."""
    path = os.path.join(ROOT, "grader", "child", "zygote.py")
    written = {}
    for mode in ("moving", "fixed"):
        done = subprocess.run([sys.executable, "-c", _ALLOCATOR_SCRIPT, path, mode], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        written[mode] = int(done.stdout.strip()) / 1024
    if written["moving"] < 8:
        pytest.skip(f"this C library keeps no moving mmap threshold (the zeroed buffer wrote {written['moving']:.1f} MiB)")
    assert written["fixed"] < 1, written


def test_the_first_failure_is_shown_whole_with_short_numbers():
    failed = ["test_mine.py::test_chunk - AssertionError: Not equal to tolerance step [3, 4] "
              "0.23489566434578266 (ACTUAL), 0.24955872234790916 (DESIRED) 1.5e-07"]
    crit = owntests.criterion(_session(_all(none={"exit": 1, "failed": failed})), ["test_mine.py"])
    assert "step [3, 4] 0.235 (ACTUAL), 0.25 (DESIRED)" in crit.evidence, crit.evidence


# ---------------------------------------------------------------- the parent's planted variants (grader/stages/variants.py)

from grader.stages import variants  # noqa: E402
from grader.child import protocol  # noqa: E402
from solutions import kv_cache as reference  # noqa: E402

TASKS = {v: f"own:{v}" for v in ["none", mutants.CONTROL, *mutants.PLANTED]}


def _chunk_after_ragged_rows():
    """A chunked prefill (T = 3 < S) into rows of different lengths, with a padded slot: every
    attention mistake shows here."""
    rng = np.random.default_rng(7)
    cache = reference.KVCache(2, 2, 8, 4, dtype=np.float32)
    cache.append(rng.standard_normal((2, 2, 3, 4), dtype=np.float32),
                 rng.standard_normal((2, 2, 3, 4), dtype=np.float32), np.array([3, 1]))
    n_new = np.array([3, 2])
    cache.append(rng.standard_normal((2, 2, 3, 4), dtype=np.float32),
                 rng.standard_normal((2, 2, 3, 4), dtype=np.float32), n_new)
    q = rng.standard_normal((2, 4, 3, 4), dtype=np.float32)
    return cache, q, n_new, reference.gqa_attention(q, cache, n_new)


def _attend(plan, variant, cache, q, n_new, out):
    S = int(cache.lens.max()) if len(cache.lens) else cache.k.shape[2]  # no rows (B = 0): the buffer's length
    meta, blob = protocol.pack_arrays({"q": q, "k": np.ascontiguousarray(cache.k[:, :, :S]),
                                       "v": np.ascontiguousarray(cache.v[:, :, :S]), "lens": cache.lens.astype(np.int64),
                                       "n_new": n_new.astype(np.int64), "out": out})
    reply, data = plan.serve(TASKS[variant], {"op": "attention", "arrays": meta}, blob)
    assert reply["ok"], reply
    assert set(reply) == {"ok", "arrays"}  # the reply carries the outcome and nothing else
    return protocol.unpack_arrays(reply["arrays"], data, np.frombuffer)["out"]


@pytest.mark.parametrize("variant", ["none", mutants.CONTROL, "length_before_write", "concat_growth"])
def test_a_variant_no_attention_outcome_shows_keeps_the_submissions_own(variant):
    cache, q, n_new, out = _chunk_after_ragged_rows()
    out = out + np.float32(1e-3)  # not the oracle's: the submission's own outcome comes back, bit for bit
    assert np.array_equal(_attend(variants.Planted({v: v for v in TASKS}), variant, cache, q, n_new, out), out)


@pytest.mark.parametrize("mistake", variants.ATTENTION)
def test_each_attention_mistake_is_served_as_the_catalogue_plants_it(mistake):
    cache, q, n_new, out = _chunk_after_ragged_rows()
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    served = _attend(plan, mistake, cache, q, n_new, out)
    Planted, planted_attention = mutants.plant(mistake, reference.KVCache, reference.gqa_attention)
    mine = Planted(2, 2, 8, 4, dtype=np.float32)
    mine.append(cache.k[:, :, :3], cache.v[:, :, :3], np.array([3, 1]))
    rows = [cache.k[b, :, cache.lens[b] - n_new[b]:cache.lens[b]] for b in range(2)]
    k_new = np.zeros((2, 2, 3, 4), np.float32)
    v_new = np.zeros_like(k_new)
    for b in range(2):
        k_new[b, :, :n_new[b]] = rows[b]
        v_new[b, :, :n_new[b]] = cache.v[b, :, cache.lens[b] - n_new[b]:cache.lens[b]]
    mine.append(k_new, v_new, n_new)
    expected = planted_attention(q, mine, n_new)
    valid = np.arange(3)[None, :] < n_new[:, None]  # [B, T]: padded slots are the submission's business
    mask = np.broadcast_to(valid[:, None, :, None], out.shape)
    assert np.allclose(np.where(mask, served, 0), np.where(mask, expected, 0), atol=1e-5, equal_nan=True), mistake
    assert not np.allclose(np.where(mask, served, 0), np.where(mask, out, 0), atol=1e-4, equal_nan=True) \
        or mistake == "nan_padding", f"{mistake} does not show on this input"
    if mistake == "nan_padding":
        assert np.isnan(served[1, :, 2]).all()


@pytest.mark.parametrize("raised", [False, True])
def test_append_outcomes_follow_the_catalogue(raised):
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    before, n_new = np.array([3, 7], np.int64), np.array([2, 2], np.int64)
    after = before if raised else before + n_new
    meta, blob = protocol.pack_arrays({"lens_before": before, "lens_after": after, "n_new": n_new})
    replies = {v: plan.serve(TASKS[v], {"op": "append", "raised": raised, "max_len": 8, "arrays": meta}, blob)[0]
               for v in TASKS}
    assert all(set(r) == {"ok", "lens", "reallocate"} for r in replies.values())
    changed = {v for v, r in replies.items() if r["lens"] is not None or r["reallocate"]}
    if raised:  # row 0 fits (3 + 2 <= 8), row 1 does not: the mistake advances both, then stops
        assert changed == {"length_before_write"} and replies["length_before_write"]["lens"] == [5, 9]
    else:
        assert changed == {"concat_growth"} and replies["concat_growth"]["reallocate"]


def test_calls_that_cannot_be_served_get_the_same_answer_under_every_variant():
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    cache, q, n_new, out = _chunk_after_ragged_rows()
    bad = [({"op": "attention", "arrays": [["q", "<f8", [2, 2]]]}, b"\0" * 8),  # the blob is short
           ({"op": "attention", "arrays": [["q", "|O", [1]]]}, b"\0" * 8),  # a dtype the line does not carry
           ({"op": "fork", "arrays": []}, b""), ("not a call", b"")]
    for call, blob in bad:
        answers = {json.dumps(plan.serve(TASKS[v], call, blob)[0]) for v in TASKS}
        assert len(answers) == 1 and "\"ok\": false" in answers.pop(), call
    # Outside the contract (n_new past T) or too large: the submission's own outcome, counted.
    for variant in TASKS:
        assert np.array_equal(_attend(plan, variant, cache, q, np.array([4, 2]), out), out)
    assert plan.served[TASKS[mutants.MUST_CATCH]]["kept"] == 1
    big = variants.Planted({TASKS[v]: v for v in TASKS})
    q_big = np.zeros((1, 64, 1024, 64), np.float32)
    big_cache = types.SimpleNamespace(k=np.zeros((1, 8, 1024, 64), np.float32), lens=np.array([1024]))
    big_cache.v = big_cache.k
    assert np.array_equal(_attend(big, mutants.MUST_CATCH, big_cache, q_big, np.array([1024]), q_big), q_big)
    assert big.served[TASKS[mutants.MUST_CATCH]]["too_large"] == 1
    assert "too large" in owntests._kept(types.SimpleNamespace(served=big.served), lambda v: TASKS[v])


@pytest.mark.parametrize("mistake", ["chunk_local_mask", "off_by_one_mask"])
def test_a_mistake_silent_on_a_call_gives_back_the_submissions_outcome_bit_for_bit(mistake):
    """At decode a chunk-local mask and a mask that also sees its successor change nothing: the reply is the
    submission's own outcome exactly, as under the control, so comparing bits tells nothing (an attack once
    caught chunk_local_mask with decode-only tests because mutants came back as the oracle's values)."""
    cache, _, _, _ = _chunk_after_ragged_rows()
    rng = np.random.default_rng(3)
    k_one = rng.standard_normal((2, 2, 1, 4), dtype=np.float32)
    cache.append(k_one, k_one, np.array([1, 1]))
    q = rng.standard_normal((2, 4, 1, 4), dtype=np.float32)
    out = reference.gqa_attention(q, cache, np.array([1, 1])) * np.float32(1.0001)  # the submission's own bits
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    served = _attend(plan, mistake, cache, q, np.array([1, 1]), out)
    assert served.dtype == out.dtype and np.array_equal(served.view(np.uint32), out.view(np.uint32))


@pytest.mark.parametrize("shape", [
    (100_000, 1, 1, 1, 1, 1),  # (B, Hq, Hkv, T, S, d): a hundred thousand one-token rows
    (1, 8192, 1, 1, 8192, 1),  # a hundred KB that the oracle would blow up to gigabytes
    (1, 2**27, 1, 0, 0, 1),  # an empty chunk (T = 0) of 2**27 query heads: no bytes on the line
    (0, 2**20, 1, 2**10, 2**10, 1),  # no rows (B = 0), and T x S of a million
])
def test_a_call_past_the_parents_limits_keeps_its_outcome_unworked(shape):
    """Past a limit, the call costs the parent nothing whatever its sizes: an attack once sent an empty chunk
    (T = 0, every product of sizes 0) of 2**27 query heads, and the parent built arrays of 2**27 heads."""
    B, Hq, Hkv, T, S, d = shape
    cache = types.SimpleNamespace(k=np.ones((B, Hkv, S, d), np.float16), v=np.ones((B, Hkv, S, d), np.float16),
                                  lens=np.full(B, S, np.int64))
    q = np.ones((B, Hq, T, d), np.float16)
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    assert variants._over_limits(B, Hq, Hkv, T, S, d)
    n_new = np.full(B, min(T, S), np.int64)  # within the contract: the limits, not the shapes, keep it
    assert np.array_equal(_attend(plan, mutants.MUST_CATCH, cache, q, n_new, q), q)
    assert plan.served[TASKS[mutants.MUST_CATCH]]["too_large"] == 1


def test_json_nested_past_the_readers_stack_is_malformed_not_a_crash():
    deep = b"[" * 100_000 + b"]" * 100_000
    frame = protocol._HEADER.pack(len(deep), 0) + deep
    with pytest.raises(ValueError, match="nested too deep"):
        protocol.decode(frame, json_limit=len(deep))


def test_an_empty_cache_is_served_like_any_other_call():
    """A chunk of padding only (every n_new 0) into empty rows: no key anywhere (an honest random test
    once met this and the parent failed to compute it, which read as the tests failing the control)."""
    cache = reference.KVCache(2, 1, 8, 4)
    cache.append(np.zeros((2, 1, 1, 4), np.float32), np.zeros((2, 1, 1, 4), np.float32), np.array([0, 0]))
    q = np.ones((2, 2, 1, 4), np.float32)
    out = reference.gqa_attention(q, cache, np.array([0, 0]))
    plan = variants.Planted({TASKS[v]: v for v in TASKS})
    for variant in TASKS:
        served = _attend(plan, variant, cache, q, np.array([0, 0]), out)
        assert np.array_equal(served, out) or (variant == "nan_padding" and np.isnan(served).all()), variant
    assert not any(c["kept"] for c in plan.served.values())


def test_tests_that_cannot_be_collected_are_not_judged_and_say_why():
    """pytest exit 2: a test file that cannot be imported (an edited starter step test without its support
    files, once). Whether the tests pass is unknown: error, with the collection error, never "fail"."""
    failed = ["tests/test_step3_mask.py - could not be collected: ModuleNotFoundError: No module named 'stepkit'"]
    crit = owntests.criterion(_session(_all(none={"exit": 2, "failed": failed})), ["tests/test_step3_mask.py"])
    assert crit.status == "error", crit.evidence
    assert "could not run" in crit.evidence and "stepkit" in crit.evidence


@pytest.mark.parametrize("preimport,loaded", [(["numpy", "hypothesis"], True), (["hypothesis.strategies"], True),
                                              (["numpy", "pytest"], False), ([], False)])
def test_hypothesis_plugin_only_for_a_submission_that_imports_hypothesis(preimport, loaded):
    """The sandbox's pytest loads Hypothesis's plugin where a submission file imports Hypothesis (the
    job's preimport list, made by the parent from the files' syntax); the online_softmax_kernel example's
    property test runs under it in each grading of that example (`make test-slow`)."""
    from grader.child import run_own_tests as child_owntests

    args = child_owntests.plugin_args({"preimport": preimport})
    assert (args == ["-p", "_hypothesis_pytestplugin"]) is loaded, args
