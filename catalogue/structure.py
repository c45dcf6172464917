"""Recover what an attention does from its outputs: which keys each query sees, which KV head it reads.

With ``q = 0`` every score is 0, so softmax gives each visible key the same
weight ``1/n``. Give every stored token a one-hot value (its own coordinate of
``v``, numbered by row, KV head and position) and the output of a query is
exactly ``1/n`` on the tokens it sees and 0 elsewhere. One call then shows the
mask, the head map and where tokens were stored; no source is read. Slots that
hold no token (never written, or padding, whose values are 0) add to ``n`` but
not to the output, so they show as ``empty`` reads.

Used by the grader's diagnosis and by the learner's step tests, so this file needs only
NumPy and ``rules.py`` beside it (the windows are the mask rule's), and both ship in the starter bundle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:
    from . import rules
except ImportError:  # loaded by path (the step tests, step 7's shim), which loads rules.py first as _kvkit_rules
    import sys as _sys

    rules = _sys.modules.get("_kvkit_rules") or __import__("rules")  # else: No module named 'rules'

# Recovered weights are k / n for small integers; these bound the decoding.
MAX_KEYS = 512
WEIGHT_TOL = 1e-6


def head_dim_for(B: int, kv_heads: int, positions: int) -> int:
    """``head_dim`` that gives every (row, KV head, position) token its own coordinate."""
    return max(B * kv_heads * positions, 1)


def token_coordinate(b: int, kv_head: int, pos: int, kv_heads: int, positions: int) -> int:
    """The coordinate of ``v`` that is 1 for token ``pos`` of KV head ``kv_head`` in row ``b``."""
    return (b * kv_heads + kv_head) * positions + pos


def one_hot_values(B: int, kv_heads: int, positions: int, lens_before, n_new, T: int) -> np.ndarray:
    """``v_new`` ``[B, Hkv, T, d]`` float64 for one append: real slot ``t`` of row ``b`` is token
    ``lens_before[b] + t``; padded slots (``t >= n_new[b]``) are all 0."""
    d = head_dim_for(B, kv_heads, positions)
    v = np.zeros((B, kv_heads, T, d))
    for b in range(B):
        for t in range(int(n_new[b])):
            for h in range(kv_heads):
                v[b, h, t, token_coordinate(b, h, int(lens_before[b]) + t, kv_heads, positions)] = 1.0
    return v


@dataclass
class Seen:
    """What one query read: ``tokens`` maps ``(row, kv_head, pos)`` to how many slots held it;
    ``empty`` slots held no token; ``n`` keys in all."""

    tokens: dict
    empty: int
    n: int

    def positions(self, row: int, kv_head: int) -> set:
        return {p for (b, h, p) in self.tokens if b == row and h == kv_head}


def decode(out: np.ndarray, B: int, kv_heads: int, positions: int) -> Seen | None:
    """The keys behind one query's output ``out`` (``[d]``), or None when it is not of the form k/n.

    None means the weights are not equal (a mask applied after the softmax, a
    scale on values, garbage in unwritten slots...): nothing can be recovered.
    """
    w = np.asarray(out, dtype=np.float64)
    if w.shape[-1] != head_dim_for(B, kv_heads, positions) or not np.isfinite(w).all() or (w < -WEIGHT_TOL).any():
        return None
    nonzero = np.flatnonzero(w > WEIGHT_TOL)
    if nonzero.size == 0:
        return Seen({}, 0, 0)
    n = int(round(1.0 / w[nonzero].min()))
    if not 1 <= n <= MAX_KEYS:
        return None
    counts = w[nonzero] * n
    if not np.allclose(counts, np.round(counts), atol=1e-4) or np.round(counts).sum() > n:
        return None
    tokens = {}
    for i, c in zip(nonzero, np.round(counts).astype(int)):
        b, rest = divmod(int(i), kv_heads * positions)
        h, p = divmod(rest, positions)
        tokens[(b, h, p)] = int(c)
    return Seen(tokens, n - int(np.round(counts).sum()), n)


def _pattern(name: str):
    """``MASKS[name]``: the window of ``rules.MASKS[name]`` for one query, ``(pos, t, live, n, T, S)`` ->
    ``c`` (keys 0 .. c-1 of the row) or ``(lo, c)`` (keys lo .. c-1); None where the pattern cannot be told
    from the right mask (it sees the same keys there). pos: the query's right position (``live - n + t``);
    t: its slot in the call; live: the row's length after the append; n: the row's new tokens; T: slots in
    the call; S: the longest row's length. ``c`` may be below 0 (one mask for the whole batch when T > S):
    a window no query can show."""
    mask = rules.MASKS[name]

    def seen(pos, t, live, n, T, S):
        lo, c = rules.window(live, n, t, T, S, mask)
        if mask is not rules.RIGHT and (lo, c) == rules.window(live, n, t, T, S):
            return None
        return c if lo == 0 else (lo, c)
    return seen


# The slots a query sees under each known mask pattern (``rules.MASKS``: the right one and each mistake's).
MASKS = {name: _pattern(name) for name in rules.MASKS}
# What a pattern's window is, in words, where one mistake has several (the evidence says which was seen).
SHAPES = {
    "chunk_local_mask": "top-left aligned: the chunk's own causal mask, as if the cache were empty",
    "chunk_local_mask/at_decode_too": "top-left aligned at every call, decode included",
    "chunk_local_mask/prefix_hidden": "the cached prefix hidden: the chunk sees only its own keys",
    "chunk_local_mask/prefix_hidden_at_decode_too": "the cached prefix hidden at every call: a decode query "
                                                    "sees its own key alone",
}
HEAD_MAPS = {
    "right": lambda h, kv_heads, G: h // G,
    "modulo_head_mapping": lambda h, kv_heads, G: h % kv_heads,
    "div_kv_heads_mapping": lambda h, kv_heads, G: h // kv_heads,
}


def mistake_of(pattern: str) -> str:
    """The catalogue id a pattern names (``off_by_one_mask/too_few`` -> ``off_by_one_mask``)."""
    return pattern.split("/")[0]


def _window(c, live: int) -> tuple[set, int]:
    """Positions and empty slots read by a query that sees slots 0 .. c-1 (``c``) or lo .. c-1 (``(lo, c)``)
    of a row of ``live`` tokens."""
    lo, c = c if isinstance(c, tuple) else (0, c)
    return set(range(lo, min(c, live))), max(c - max(live, lo), 0)


def classify(seen: Seen, row: int, head: int, kv_heads: int, G: int, pos: int, t: int,
             lens_after, n_new, T: int, layouts: dict | None = None) -> tuple[set, set]:
    """``(head_patterns, mask_patterns)`` that explain one query exactly.

    ``head_patterns`` are the names in ``HEAD_MAPS`` whose KV head the query
    read; ``mask_patterns`` those of ``MASKS`` whose window it saw (both hold
    ``"right"`` when that part is right), and those of ``layouts`` (the
    predictions of ``shared_position_windows`` for this query) that match.
    An empty set means no known pattern.
    """
    rows = {b for (b, _, _) in seen.tokens}
    heads = {h for (_, h, _) in seen.tokens}
    if rows - {row} or len(heads) > 1:
        return set(), set()
    live, n, S = int(lens_after[row]), int(n_new[row]), int(np.max(lens_after))
    kv = heads.pop() if heads else None
    head_patterns = {name for name, rule in HEAD_MAPS.items() if kv is not None and rule(head, kv_heads, G) == kv}
    if kv is None:
        head_patterns = set(HEAD_MAPS)  # nothing read: no evidence about the head
    got = seen.positions(row, kv) if kv is not None else set()
    if any(c > 1 for c in seen.tokens.values()):
        return head_patterns, {"misplaced_writes"}  # a token read from two slots
    masks = set()
    for name, rule in MASKS.items():
        c = rule(pos, t, live, n, T, S)
        if c is not None and min(c if isinstance(c, tuple) else (c,)) >= 0 and _window(c, live) == (got, seen.empty):
            masks.add(name)
    for name, window in (layouts or {}).items():
        if window == (got, seen.empty):
            masks.add(name)
    return head_patterns, masks


# Designs that write every row at one position of the batch (a shared start_pos / input_pos),
# as storage layouts: where each row's tokens land, and how far each query's mask reaches.
LAYOUTS = {
    # Each row's own lens, but every row written at the batch's end, lens.max().
    "misplaced_writes/at_longest": "at_longest",
    # One position for the batch, advanced by the largest n_new, the mask from that position.
    "misplaced_writes/shared_by_max": "max",
    # The same, advanced by T (every slot, padding included, written as a token).
    "misplaced_writes/shared_by_T": "T",
}


def shared_position_windows(chunks: list, slots: list) -> dict:
    """``{pattern: {(step, row, t): (positions seen, empty slots)}}`` for each design of ``LAYOUTS``.

    ``chunks[i][b]``: tokens row ``b`` receives in call ``i``; ``slots[i]``: that call's T.
    The prediction follows each design's writes slot by slot (padding slots hold
    no token: their values are 0) and the keys its mask lets each query see.
    """
    out = {}
    B = len(chunks[0]) if chunks else 0
    for pattern, how in LAYOUTS.items():
        held = [dict() for _ in range(B)]  # slot -> token position, per row
        lens, shared, windows = [0] * B, 0, {}
        for i, (counts, T) in enumerate(zip(chunks, slots)):
            start = [max(lens, default=0)] * B if how == "at_longest" else [shared] * B
            width = T if how == "T" else max(counts, default=0)
            for b in range(B):
                for t in range(width if how != "at_longest" else counts[b]):
                    if t < counts[b]:
                        held[b][start[b] + t] = lens[b] + t
                    else:
                        held[b].pop(start[b] + t, None)  # a padding slot written over it
            for b in range(B):
                for t in range(counts[b]):
                    c = (lens[b] + t + 1) if how == "at_longest" else start[b] + t + 1
                    seen = {held[b][s] for s in range(c) if s in held[b]}
                    windows[(i, b, t)] = (seen, c - len(seen))
            lens = [lens[b] + counts[b] for b in range(B)]
            shared += width
        out[pattern] = windows
    return out


def explain(patterns_per_query: list[set]) -> set | None:
    """The fewest pattern names that explain every wrong query, or None when one has no known pattern.

    ``patterns_per_query``: for each wrong query, the set of (non-right)
    patterns that reproduce it exactly. A name that is a query's only
    explanation is needed; then names are added, most queries first, until
    every query is explained.
    """
    if any(not p for p in patterns_per_query):
        return None
    chosen = {next(iter(p)) for p in patterns_per_query if len(p) == 1}
    left = [p for p in patterns_per_query if not p & chosen]
    while left:
        counts = {}
        for p in left:
            for name in p:
                counts[name] = counts.get(name, 0) + 1
        best = max(sorted(counts), key=counts.get)
        chosen.add(best)
        left = [p for p in left if best not in p]
    return chosen


def grid(seen_rows: list[set], right_rows: list[set], width: int, empty_rows: list[int] | None = None) -> list[str]:
    """Text picture of a mask: one line per query, ``#`` a key it sees, ``.`` one it does not.

    ``seen_rows``/``right_rows``: positions seen per query (submission / right);
    ``width``: key positions shown; ``empty_rows``: empty slots read per query
    (shown as ``+k``). Returns the lines, submission on the left.
    """
    def line(s):
        return "".join("#" if p in s else "." for p in range(width))

    empty_rows = empty_rows or [0] * len(seen_rows)
    out = [f"{'query':>5}  {'yours':<{width + 4}}  right"]
    for t, (s, r, e) in enumerate(zip(seen_rows, right_rows, empty_rows)):
        extra = f"+{e}" if e else ""
        out.append(f"{t:>5}  {line(s) + extra:<{width + 4}}  {line(r)}")
    return out
