"""The hidden trials: sequences of appends and attention calls, as plain data.

A trial is a cache shape plus a list of steps; each step appends ``k_new``/``v_new``
with ``n_new`` real tokens per row and asks for the attention of ``q``. Three sets:

* ``random_trials``: the spec's protocol (README, "Grading"): Hkv in {1, 2, 4}, G
  from 1 to 8, 1 to 3 rows, final lengths 0 to 40 fed in chunks of 1 to 8 tokens.
* ``targeted_trials``: MQA, MHA, decode, full prefill, chunked prefill, zero-token
  rows, B = 0, an all-empty cache, T = 0, float32, and the head layouts of real
  checkpoints (Hq/Hkv = 32/8, 48/2, 64/8, 16/4).
* ``small_cases``: tiny configurations in order of size, so the first one that
  fails is the smallest failing configuration a report can show.
* ``structure_trials``: ``q = 0`` and one-hot values (``catalogue.structure``),
  from which diagnosis reads the keys each query sees and the KV head each
  query head reads. They decide no criterion.

Every value is drawn from a seeded generator, so a seed fixes the whole suite.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from catalogue import structure


@dataclass
class Step:
    """One ``append`` then one ``gqa_attention`` call.

    ``k_new``/``v_new``: ``[B, Hkv, T, d]``; ``q``: ``[B, Hq, T, d]``; ``n_new``: int64 ``[B]``.
    """

    k_new: np.ndarray
    v_new: np.ndarray
    n_new: np.ndarray
    q: np.ndarray
    overflow: bool = False  # an append past max_len: it must raise and change nothing; no attention follows


@dataclass
class Trial:
    """A cache ``[B, Hkv, max_len, d]`` of ``dtype`` and the steps run against it."""

    name: str
    group: str  # "random", "targeted", "small" or "structure"
    B: int
    Hkv: int
    G: int
    d: int
    max_len: int
    dtype: str = "float64"
    steps: list[Step] = field(default_factory=list)

    @property
    def Hq(self) -> int:
        return self.G * self.Hkv

    @property
    def size(self) -> tuple:
        """Sort key, smallest first: rows x query heads x tokens, then steps."""
        tokens = sum(int(s.n_new.sum()) for s in self.steps)
        return (self.B * self.Hq * max(tokens, 1) * self.d, len(self.steps))

    def describe(self) -> str:
        """The configuration in words, without any value: safe to show a candidate."""
        chunks = " then ".join(str(list(map(int, s.n_new))) + f" (T={s.q.shape[2]})" for s in self.steps)
        return (f"B={self.B}, Hkv={self.Hkv}, G={self.G} (Hq={self.Hq}), d={self.d}, "
                f"max_len={self.max_len}, {self.dtype}; tokens appended per row: {chunks or 'none'}")


def _step(rng, B, Hkv, G, d, n_new, T, dtype) -> Step:
    def draw(heads):
        return rng.standard_normal((B, heads, T, d)).astype(dtype)

    return Step(draw(Hkv), draw(Hkv), np.asarray(n_new, dtype=np.int64), draw(Hkv * G))


def build(name, group, rng, B, Hkv, G, d, chunks, *, max_len=None, dtype="float64", T=None) -> Trial:
    """A trial whose step ``i`` appends ``chunks[i][b]`` tokens to row ``b``.

    ``T`` (slots per step) is an int for every step or a list with one entry per
    step; ``None`` means the largest count of the step (at least 1). ``max_len``
    defaults to the final longest row.
    """
    chunks = [list(c) for c in chunks]
    slots = T if isinstance(T, list) else [T] * len(chunks)
    slots = [w if w is not None else max(max(c, default=0), 1) for c, w in zip(chunks, slots)]
    if max_len is None:
        # Room for every step's full width T: a contract-abiding submission may
        # refuse T larger than the space left in any row (docs/contract.md).
        lens, max_len = np.zeros(B, dtype=int), 0
        for counts, width in zip(chunks, slots):
            max_len = max(max_len, int(lens.max(initial=0)) + width)
            lens += np.asarray(counts, dtype=int)
    trial = Trial(name, group, B, Hkv, G, d, int(max_len), dtype)
    for counts, width in zip(chunks, slots):
        trial.steps.append(_step(rng, B, Hkv, G, d, counts, width, dtype))
    return trial


FULL_TRIALS = 200  # random trials of a full grading (fewer make a quick one, said in its report)


def random_trials(seed: int, count: int = FULL_TRIALS) -> list[Trial]:
    """The spec's random protocol: ``count`` trials, float64, seeded by ``seed``."""
    rng = np.random.default_rng([seed, 1])
    trials = []
    for i in range(count):
        Hkv = int(rng.choice([1, 2, 4]))
        G = int(rng.integers(1, 9))
        B = int(rng.integers(1, 4))
        d = int(rng.choice([2, 4, 8, 16]))
        final = rng.integers(0, 41, size=B)
        done = np.zeros(B, dtype=np.int64)
        chunks, slots = [], []
        while (done < final).any():
            T = int(rng.integers(1, 9))
            # Some rows get zero tokens in a call; the rest take up to T.
            take = np.where(rng.random(B) < 0.2, 0, rng.integers(1, T + 1, size=B))
            counts = np.minimum(final - done, take)
            if not counts.any():
                continue
            chunks.append(counts.tolist())
            slots.append(T)
            done += counts
        if not chunks:  # every row ends empty: still make one all-padding call
            chunks, slots = [[0] * B], [int(rng.integers(1, 9))]
        # max_len leaves room for the widest chunk (8 slots) past the longest row,
        # so no call has T larger than the space left (bad input by the contract).
        trial = Trial(f"random-{i}", "random", B, Hkv, G, d, int(final.max()) + 8 + int(rng.integers(0, 6)))
        for counts, T in zip(chunks, slots):
            trial.steps.append(_step(rng, B, Hkv, G, d, counts, T, "float64"))
        trials.append(trial)
    return trials


# Head layouts where mapping bugs hide: (Hq, Hkv) of real checkpoints and the
# cases Hkv == G and Hkv != G (README, "Grading").
LAYOUTS = [(32, 8), (48, 2), (64, 8), (16, 4), (8, 2), (4, 1), (4, 4)]


def targeted_trials(seed: int) -> list[Trial]:
    """The named cases of README, "Grading" (see the module docstring)."""
    rng = np.random.default_rng([seed, 2])
    t = []
    for Hq, Hkv in LAYOUTS:
        G = Hq // Hkv
        # One token per row: the output of head h is exactly v of the KV head it
        # reads, whatever the mask or the scale, so this isolates the mapping.
        t.append(build(f"head-map-{Hq}/{Hkv}", "targeted", rng, 2, Hkv, G, 8, [[1, 1]]))
        t.append(build(f"layout-{Hq}/{Hkv}", "targeted", rng, 2, Hkv, G, 8,
                       [[6, 6], [3, 3], [1, 1], [1, 1]], max_len=16))
    for Hkv, G, label in ((1, 4, "mqa"), (4, 1, "mha"), (2, 3, "gqa")):
        t.append(build(f"{label}-decode", "targeted", rng, 2, Hkv, G, 16, [[5, 5], [1, 1], [1, 1], [1, 1]]))
        t.append(build(f"{label}-prefill", "targeted", rng, 2, Hkv, G, 16, [[7, 7]]))
        t.append(build(f"{label}-chunked", "targeted", rng, 2, Hkv, G, 16, [[4, 4], [3, 3], [5, 5], [2, 2]]))
    t.append(build("decode-long", "targeted", rng, 1, 2, 2, 8, [[30]] + [[1]] * 3))
    # Rows that always move together, at several batch sizes: Hire's decode and prefill checks.
    for B, Hkv, G in ((2, 2, 4), (3, 1, 8), (3, 8, 4)):
        t.append(build(f"uniform-{B}x{Hkv * G}/{Hkv}", "targeted", rng, B, Hkv, G, 16,
                       [[9] * B, [1] * B, [1] * B, [4] * B, [1] * B]))
    t.append(build("chunk-after-prefix", "targeted", rng, 1, 1, 2, 4, [[5], [3]]))
    t.append(build("zero-token-rows", "targeted", rng, 3, 2, 2, 8, [[3, 0, 2], [0, 4, 1], [2, 0, 0], [1, 1, 0]]))
    t.append(build("ragged-decode", "targeted", rng, 3, 2, 2, 8, [[9, 2, 5], [1, 1, 1], [1, 1, 1]]))
    t.append(build("ragged-chunks", "targeted", rng, 2, 1, 4, 8, [[7, 2], [2, 5], [3, 1]]))
    t.append(build("padded-slots", "targeted", rng, 2, 2, 2, 8, [[2, 5], [3, 1]], T=6))
    t.append(build("empty-batch", "targeted", rng, 0, 2, 2, 4, [[], []], max_len=8, T=3))
    t.append(build("all-empty-cache", "targeted", rng, 2, 2, 2, 4, [[0, 0]], max_len=8, T=3))
    t.append(build("no-slots", "targeted", rng, 2, 2, 2, 4, [[3, 2], [0, 0]], max_len=8, T=[None, 0]))
    for Hkv, G in ((1, 4), (2, 2), (8, 4)):
        t.append(build(f"float32-{Hkv * G}/{Hkv}", "targeted", rng, 2, Hkv, G, 16,
                       [[6, 3], [2, 2], [1, 1]], dtype="float32"))
    return t


TWIN = "-twin"  # the name suffix of an overflow trial's twin


def overflow_trials(seed: int) -> list[Trial]:
    """Appends past ``max_len`` inside trials, each followed by a decode step.

    The cache's state is ``lens`` and each row's live tokens: after a failed
    append the next decode must give exactly what it gives without that
    append. So the verdict comes from outputs (a row that claims tokens it
    never stored reads the wrong keys), never from what the child says.
    The overflowing row is the last, then the first (rows before it are the
    ones an eager loop moves): it is empty and receives more tokens than
    ``max_len``, while the other row, 7 tokens long, receives one that fits.
    No call is a chunk after cached tokens, so a clear refusal of chunked
    prefill does not touch them (it is charged to chunked prefill alone); the
    decode after the failed append is judged against the trial's twin, so a
    design wrong on ragged rows is judged on overflow alone.
    """
    rng = np.random.default_rng([seed, 4])
    trials = []
    for name, before, over in (("overflow-last-row", [7, 0], [1, 9]), ("overflow-first-row", [0, 7], [9, 1])):
        trial = build(name, "targeted", rng, 2, 2, 2, 4, [before], max_len=8)
        # The overflowing append: T = max(over), wider than the space left in the row that overflows.
        step = _step(rng, 2, 2, 2, 4, over, max(over), "float64")
        step.overflow = True
        trial.steps.append(step)
        trial.steps.append(_step(rng, 2, 2, 2, 4, [1, 1], 1, "float64"))
        # Its twin: the same calls without the failed append. The decode after a failed append must give
        # what the twin's decode gives, right or wrong: so a decode bug is never taken for an overflow one.
        twin = Trial(f"{name}{TWIN}", "targeted", 2, 2, 2, 4, 8, "float64",
                     [s for s in trial.steps if not s.overflow])
        trials += [trial, twin]
    return trials


def small_cases(seed: int) -> list[Trial]:
    """Tiny configurations, smallest first (rows x heads x tokens), for the smallest failing case."""
    rng = np.random.default_rng([seed, 3])
    histories = {
        # name: (rows, chunks)
        "decode": (1, [[1], [1]]),
        "prefill": (1, [[2]]),
        "chunk": (1, [[1], [2]]),
        "prefill-3": (1, [[3]]),
        "chunk-2-2": (1, [[2], [2]]),
        "ragged": (2, [[1, 2], [1, 1]]),
        "zero-row": (2, [[2, 0], [1, 0]]),
        "ragged-chunk": (2, [[1, 3], [2, 1]]),
    }
    cases = []
    for (Hkv, G), (label, (B, chunks)) in itertools.product(
            [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 2)], histories.items()):
        cases.append(build(f"small-{label}-{Hkv * G}/{Hkv}", "small", rng, B, Hkv, G, 2, chunks))
    return sorted(cases, key=lambda trial: trial.size)


# Histories for structure recovery: prefixes of 3+ tokens before every chunk, so no two
# mask patterns give the same window; Hkv = 4, G = 2, so h // G, h % Hkv and h // Hkv differ.
STRUCTURE = {
    "structure-uniform": (1, [[4], [3], [1], [2]]),
    "structure-ragged": (2, [[4, 2], [3, 3], [1, 1], [0, 2]]),
}


def structure_trials(seed: int) -> list[Trial]:
    """Trials with ``q = 0`` and a one-hot value per token (see ``catalogue.structure``).

    Each token's value is 1 on its own coordinate (row, KV head, position), so
    ``head_dim = B * Hkv * positions``; padded slots are all 0. Keys are random:
    with ``q = 0`` they do not change any score.
    """
    rng = np.random.default_rng([seed, 5])
    trials = []
    for name, (B, chunks) in STRUCTURE.items():
        positions = int(np.sum(chunks, axis=0).max())
        Hkv, G = 4, 2
        trial = build(name, "structure", rng, B, Hkv, G, structure.head_dim_for(B, Hkv, positions), chunks)
        lens = np.zeros(B, dtype=np.int64)
        for step in trial.steps:
            T = step.q.shape[2]
            step.v_new = structure.one_hot_values(B, Hkv, positions, lens, step.n_new, T)
            step.q = np.zeros_like(step.q)
            lens = lens + step.n_new
        trials.append(trial)
    return trials


@functools.lru_cache(maxsize=4)
def hidden_suite(seed: int, count: int = FULL_TRIALS) -> list[Trial]:
    """Every trial the grader runs: random, targeted, overflow, small and structure cases (built once per seed)."""
    return (random_trials(seed, count) + targeted_trials(seed) + overflow_trials(seed) + small_cases(seed)
            + structure_trials(seed))
