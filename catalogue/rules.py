"""The kit's rules, each written once: which keys a query sees, the bounds, the mistakes' records.

* **Visibility** (``window``, ``visible``, ``MASKS``). One function gives, for every query slot, the
  keys it sees: the bottom-right causal mask by default, or the window a known mistake gives, told by
  a ``Mask`` (top-left alignment, the cached prefix hidden, positions counted from the longest row or
  from one mask for the whole batch, one key too many or too few). The planted mutants
  (``mutants.WINDOWS``), the structure recovery (``structure.MASKS``) and the learner's step checks
  (``stepkit.explain_window``) all read ``MASKS``. ``solutions/kv_cache.py`` keeps its own
  ``visible_keys`` as the answer to read, and the grader's oracle (``grader/stages/oracle.py``
  ``attention_ref``) keeps its loop over keys ``0 .. pos`` as the trusted reference, written for
  obviousness; ``tests/test_rules.py`` holds both to ``visible``. A change of the rule is a change of
  the contract: those two, the contract (docs/contract.md) and the notebook's answer change with it.
* **Bounds** (``BOUNDS``): the one table the structural criteria, the in-process meters and the
  learner's no-repeat step are judged by; docs/measurement.md says how each was measured.
  ``repeat_per_head``, ``call_held`` and ``task_held`` all judge ``no_kv_repeat`` (the first names
  ``kv_repeat``); the port's op watch (``meters.judge_torch_ops``, step 6) counts elements instead.
* **Mistakes** (``mistakes()``): ``mistakes.toml`` beside this file, read once into typed records.

NumPy and the standard library only: this file ships in the learner's starter bundle and is loaded by
path beside ``mutants.py`` and ``structure.py``, so it imports nothing of the kit.
"""
from __future__ import annotations

import functools
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

# --------------------------------------------------------------------------- which keys a query sees

# Where a mask believes query slot t of a row sits: "cache_end", the right one (after the row's cached
# tokens, lens - n_new + t); "chunk", top-left (t, as if the cache were empty); "longest_row", counted
# from the batch's longest row (S - n_new + t); "batch", one bottom-right [T, S] mask for every row (S - T + t).
ORIGINS = ("cache_end", "chunk", "longest_row", "batch")


@dataclass(frozen=True)
class Mask:
    """How a mask picks the keys one query slot sees. The defaults are the bottom-right causal mask.

    Each field departs from it the way a known mistake does:

    - ``origin``: where the mask believes the query sits (``ORIGINS``).
    - ``extra``: keys past that position it also sees: 1 its successor, -1 not even itself.
    - ``causal``: False sees every key of the row, later ones included.
    - ``prefix_hidden``: the row's cached tokens are hidden, the chunk sees only its own keys.
    - ``row_masked``: False lets a row see the slots past its own length, up to the longest row's.
    - ``at_decode``: False keeps the mistake out of one-token calls (T = 1), which get the right mask.
    """

    origin: str = "cache_end"
    extra: int = 0
    causal: bool = True
    prefix_hidden: bool = False
    row_masked: bool = True
    at_decode: bool = True

    def __post_init__(self):
        if self.origin not in ORIGINS:
            raise ValueError(f"Mask origin must be one of {', '.join(ORIGINS)}, got {self.origin!r}")


RIGHT = Mask()

# Every window the kit can name, by pattern: a catalogue id, or "id/variant" where one mistake has several.
MASKS = {
    "right": RIGHT,
    # Top-left aligned (is_causal=True when T != S): the chunk's own causal mask; decode skips the mask.
    "chunk_local_mask": Mask(origin="chunk", at_decode=False),
    # The same mask at decode too: the query of a one-token call sees key 0 alone.
    "chunk_local_mask/at_decode_too": Mask(origin="chunk"),
    # The cached prefix hidden: the chunk attends only to its own keys, causally; decode reads the whole row.
    "chunk_local_mask/prefix_hidden": Mask(prefix_hidden=True, at_decode=False),
    # The same at decode too: a one-token call sees its own key alone.
    "chunk_local_mask/prefix_hidden_at_decode_too": Mask(prefix_hidden=True),
    # Sees its successor too (silent at a row's last token: nothing follows it).
    "off_by_one_mask": Mask(extra=1),
    # Not itself: a row's first token sees nothing.
    "off_by_one_mask/too_few": Mask(extra=-1),
    # No causal mask on a chunk after a prefix: every key of the row.
    "future_keys_visible": Mask(causal=False),
    # Positions counted from the longest row, so a shorter row also sees the empty slots past its length.
    "ragged_keys_unmasked": Mask(origin="longest_row", row_masked=False),
    # One mask for the whole batch: tril(ones(T, S), S - T).
    "ragged_keys_unmasked/batch_mask": Mask(origin="batch", row_masked=False),
}


def window(lens, n_new, t, T: int, S: int, mask: Mask = RIGHT):
    """The keys ``lo .. hi - 1`` query slot ``t`` sees under ``mask``: ``(lo, hi)``.

    Args:
        lens: the row's length after the append.
        n_new: the real tokens the row got in this call (``n_new <= lens``).
        t: the query's slot in the call; meaningful for ``t < n_new`` (later slots are padding).
        T: the call's slots. S: the batch's live length, ``lens.max()``.
        mask: which window (``MASKS``); the bottom-right causal mask by default.

    ``lens``, ``n_new`` and ``t`` are ints (one query: plain ints come back, quickly, for the per-query
    callers) or int arrays that broadcast together (``[B, 1]``, ``[B, 1]``, ``[T]`` for a batch: ``lo``
    and ``hi`` then come back broadcastable to ``[B, T]``).

    Returns:
        ``(lo, hi)``. ``hi <= lo`` means no key. ``hi`` never passes ``S``; it passes ``lens`` (empty
        slots seen) only where ``mask.row_masked`` is False, and it may be below 0 (``"batch"`` when
        ``T > S``).

    Raises:
        Nothing of its own (a ``Mask``'s origin is checked when the mask is made).
    """
    if not mask.at_decode and T == 1:
        mask = RIGHT
    first = lens - n_new  # the chunk's first token's position
    if mask.origin == "cache_end":
        at = first + t
    elif mask.origin == "chunk":
        at = t
    elif mask.origin == "longest_row":
        at = S - n_new + t
    else:  # "batch"
        at = S - T + t
    hi = _least(at + 1 + mask.extra if mask.causal else lens, lens if mask.row_masked else S)
    lo = first if mask.prefix_hidden else 0 * hi  # 0 * hi: a zero of hi's kind, an int or an array
    return lo, hi


def _least(a, b):
    """The smaller of ``a`` and ``b``, elementwise for arrays; plain ``min`` for the per-query ints."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def visible(lens, n_new, T: int, S: int, mask: Mask = RIGHT) -> np.ndarray:
    """Which of the ``S`` live key slots each query slot sees: bool ``[B, T, S]``.

    ``lens``, ``n_new``: int ``[B]`` (lengths after the append, real tokens of this call); padded slots
    (``t >= n_new[b]``) see nothing. The default mask is the bottom-right causal mask, the contract's rule.

    Raises:
        ValueError: ``lens`` and ``n_new`` are not one-dimensional of the same length.
    """
    lens, n_new = np.asarray(lens, dtype=np.int64), np.asarray(n_new, dtype=np.int64)
    if lens.ndim != 1 or lens.shape != n_new.shape:
        raise ValueError(f"lens and n_new must both be [B], got {list(lens.shape)} and {list(n_new.shape)}")
    slots = np.arange(T)
    lo, hi = window(lens[:, None], n_new[:, None], slots[None, :], T, S, mask)
    keys = np.arange(S)
    real = slots[None, :] < n_new[:, None]
    return (keys >= lo[..., None]) & (keys < hi[..., None]) & real[..., None]


def seen_window(name: str, lens: int, n_new: int, t: int, T: int, S: int) -> tuple[int, int]:
    """``window`` of one query under the pattern ``name`` of ``MASKS``, as plain ints ``(lo, hi)``.

    Raises:
        KeyError: ``name`` is no pattern of ``MASKS``.
    """
    lo, hi = window(lens, n_new, t, T, S, MASKS[name])
    return int(lo), int(hi)


# --------------------------------------------------------------------------- the bounds

@dataclass(frozen=True)
class Bound:
    """A limit on one measured ratio: at or above ``limit`` is the mistake's side."""

    id: str
    limit: float
    margin: float  # honest figures stay at or below limit / margin, mistaken ones at or above limit * margin
    rule: str

    def crossed(self, figure: float) -> bool:
        return figure >= self.limit


# Each bound is a ratio of two kernel figures of the same grading run, with its rule in one line, the side a
# mistake lies on, and the margin: the bundled examples stay on their side of the limit by at least that
# factor under every seed the suite tries (tests/test_bounds.py). docs/measurement.md says how each was
# measured and why the limit sits where it does.
BOUNDS = {b.id: b for b in (
    Bound("repeat_per_head", 0.3, 1.5,
          "an attention call's extra peak above its twin's at G = 1, in live K/V per extra query head per KV head "
          "(G - 1): a repeat of K and V adds 1, of K alone 0.5; scores add G T / 2d"),
    Bound("call_held", 4.5, 1.3,
          "an attention call's extra peak in live K/V, against max(4.5, 0.6 G): memory per query head whatever the "
          "twin holds (honest calls hold working copies of K and V: up to 3)"),
    Bound("task_held", 7.5, 1.2,
          "the peak of a decode process at 8 KV heads and d = 128, in live K/V, against max(7.5, 1 + 0.4 G): memory "
          "held for K/V per query head whatever the heads (a cache read in place holds about 2, a mask table 1 more)"),
    Bound("growth_held", 0.6, 1.5,
          "in a run of one-token appends, a part's peak above its end, in live K (or V) at its start: the old "
          "buffer held beside its copy, K's and V's one after the other (a cache written in place frees nothing)"),
    Bound("growth_cpu", 0.3, 1.5,
          "CPU time per one-token append, in copies of the K/V the cache holds (the median stretch; a copy from main "
          "memory timed by the parent in the same run): a copy on every append is 1, wherever it is made (another process too)"),
    Bound("scan", 3.0, 1.5,
          "CPU time of the same decode steps in a reservation 8 to 11 times larger against a little above the live "
          "length, the cheaper of two runs each: attention over max_len"),
)}


def call_held_limit(G: int) -> float:
    """``call_held``'s limit at group size ``G`` (live K/V): a repeat of K and V adds G."""
    return max(BOUNDS["call_held"].limit, 0.6 * G)


def task_held_limit(G: int) -> float:
    """``task_held``'s limit at group size ``G`` (live K/V)."""
    return max(BOUNDS["task_held"].limit, 1 + 0.4 * G)


def repeat_peak_limit(G: int) -> float:
    """``repeat_per_head`` for a meter inside the measured process, at group size ``G``: the most one
    attention call may allocate at its peak, in live K/V (K and V together).

    Such a meter (tracemalloc) has no twin at G = 1 to subtract, so the call's whole peak is charged to all
    ``G`` query heads rather than to the ``G - 1`` extra ones: the one head more stands for the working
    memory the twin's figure would have taken away.
    """
    return BOUNDS["repeat_per_head"].limit * G


# --------------------------------------------------------------------------- the mistakes' records

MISTAKES_TOML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mistakes.toml")


@dataclass(frozen=True)
class Mistake:
    """One entry of ``mistakes.toml`` (its header says what each field means).

    The copies the kit hands out hold fewer fields: the starter bundle's only ``title``, ``what`` and
    ``mutant``; the Gradescope bundle's no ``question`` or ``answer``. A field a copy lacks is None.
    """

    id: str
    title: str
    what: str
    mutant: bool
    shown_by: str | None = None
    criterion: str | None = None
    example: str | None = None
    question: str | None = None
    answer: str | None = None


_REQUIRED = ("title", "what", "mutant")


@functools.lru_cache(maxsize=None)
def mistakes(path: str = MISTAKES_TOML) -> Mapping[str, Mistake]:
    """``{id: Mistake}`` in the file's order, read once per ``path`` (``mistakes.toml`` beside this file);
    read-only, as every caller shares the one copy.

    Raises:
        OSError: the file cannot be read.
        tomllib.TOMLDecodeError: it is not TOML.
        ValueError: an entry is not a table, lacks ``title``, ``what`` or ``mutant``, or holds a field
            ``Mistake`` does not know.
    """
    import tomllib  # here, not at the top: the mask rule alone needs no Python 3.11 (a notebook's helpers)

    with open(path, "rb") as f:
        data = tomllib.load(f)
    known = {f.name for f in fields(Mistake)} - {"id"}
    out = {}
    for mid, entry in data.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: [{mid}] must be a table of fields, got {type(entry).__name__}")
        missing = [key for key in _REQUIRED if key not in entry]
        unknown = sorted(set(entry) - known)
        if missing or unknown:
            raise ValueError(f"{path}: [{mid}] " + "; ".join(
                part for part in (missing and f"lacks {', '.join(missing)}",
                                  unknown and f"holds fields no record reads: {', '.join(unknown)}") if part))
        out[mid] = Mistake(id=mid, **entry)
    return types.MappingProxyType(out)
