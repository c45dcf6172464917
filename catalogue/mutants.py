"""Planted mutants: each catalogued mistake planted around a correct implementation.

``plant(mistake_id, KVCache, gqa_attention)`` takes any implementation of the
NumPy contract (the reference, or a learner's own finished code) and returns a
``(KVCache, gqa_attention)`` pair that makes exactly that mistake. Wrapping,
rather than editing a copy of some reference source, means a mutant never
carries reference code: it can run next to a candidate's tests, inside the
grader's sandbox or in the starter bundle, without giving an answer away.

The attention mistakes are all "the wrong keys are visible": the wrapper
recomputes each affected query as a decode step over the window of keys the
mistake would let it see, using the wrapped implementation itself. Slow, and
only meant for the small inputs of tests and diagnosis.

This file needs only NumPy and ``rules.py`` beside it (the windows are the mask rule's), so the two
can be copied into a sandbox or a bundle together.
"""
from __future__ import annotations

import math

import numpy as np

try:
    from . import rules
except ImportError:  # loaded by path (the step tests, step 7's shim), which loads rules.py first as _kvkit_rules
    import sys as _sys

    rules = _sys.modules.get("_kvkit_rules") or __import__("rules")  # else: No module named 'rules'

# Every variant the grader compares a wrong output against, by mistake id.
VARIANTS = {
    "chunk_local_mask": ["chunk_local_mask", "chunk_local_mask/prefix_hidden"],
    "off_by_one_mask": ["off_by_one_mask", "off_by_one_mask/too_few"],
    "ragged_keys_unmasked": ["ragged_keys_unmasked", "ragged_keys_unmasked/batch_mask"],
    "modulo_head_mapping": ["modulo_head_mapping"],
    "missing_scale": ["missing_scale"],
    "nan_padding": ["nan_padding"],
    "length_before_write": ["length_before_write"],
}


def _planted(mask: "rules.Mask"):
    """The window of ``mask`` as a planted mutant applies it: ``(pos, t, lens, n, T, S)`` -> ``c`` (keys
    0 .. c-1), ``(lo, c)`` (keys lo .. c-1), or None where no key is visible (left undefined: real code
    gives 0, NaN or anything, so diagnosis skips it). ``pos`` (``lens - n + t``) is the query's right
    position, ``lens`` the row length after the append, ``n`` its new tokens, ``T`` the slots, ``S`` =
    lens.max()."""
    def seen(pos, t, lens, n, T, S):
        lo, c = rules.window(lens, n, t, T, S, mask)
        if c <= lo:
            return None
        return c if lo == 0 else (lo, c)
    return seen


# Visible-window rules of the planted attention mistakes: every variant of ``VARIANTS`` that is a window
# of ``rules.MASKS`` (the mask rule and each mistake's window are written there once).
WINDOWS = {name: _planted(rules.MASKS[name]) for names in VARIANTS.values() for name in names if name in rules.MASKS}

# Mistakes whose planted mutant differs from the correct code in what a test can
# observe (outputs, buffers, lens); the rest show only in time or memory.
PLANTED = ["chunk_local_mask", "off_by_one_mask", "ragged_keys_unmasked", "modulo_head_mapping",
           "missing_scale", "nan_padding", "length_before_write", "concat_growth"]
# The control: the same wrapping machinery with no change in behaviour. Tests
# that fail on it detect the wrapper, not a mistake.
CONTROL = "identity"
# The mistake a candidate's own tests must catch (the grader, the learner's step 7, the notebook).
MUST_CATCH = "chunk_local_mask"


def kill_matrix(exit_codes: dict) -> dict:
    """Which planted mistakes a test suite caught, from pytest's exit code per variant.

    ``exit_codes``: ``{"none": code on the implementation itself, CONTROL: code
    on the no-change wrapper, mistake_id: code on that mutant, ...}``; a
    missing or None code means the run did not finish. Exit 1 (a test failed)
    is a catch, 0 a miss, anything else (no tests, a crash) "not run".

    Returns ``{"passes", "control_passes", "caught", "missed", "not_run",
    "must_catch", "caught_must", "summary"}``; the one place the kit builds a
    kill matrix (the grader, the learner's step 7 and the notebook call it).
    """
    code = exit_codes.get
    caught = [m for m in PLANTED if code(m) == 1]
    missed = [m for m in PLANTED if code(m) == 0]
    not_run = [m for m in PLANTED if code(m) not in (0, 1)]
    summary = f"caught {len(caught)} of {len(PLANTED)} planted mistakes: {', '.join(caught) or 'none'}"
    if missed:
        summary += f"; missed: {', '.join(missed)}"
    if not_run:
        summary += f"; not run: {', '.join(not_run)}"
    return {"passes": code("none") == 0, "control_passes": code(CONTROL) == 0 if CONTROL in exit_codes else None,
            "caught": caught, "missed": missed, "not_run": not_run, "must_catch": MUST_CATCH,
            "caught_must": MUST_CATCH in caught, "summary": summary}


def _windowed_attention(rule, KVCache, gqa_attention, q, cache, n_new):
    """An attention that lets each query see ``rule(...)`` keys, built on a correct one."""
    out = np.array(gqa_attention(q, cache, n_new), dtype=np.asarray(q).dtype)
    q = np.asarray(q)
    n_new = np.asarray(n_new, dtype=np.int64)
    lens = np.asarray(cache.lens, dtype=np.int64)
    B, Hq, T, d = q.shape
    kv_heads = cache.k.shape[1]
    S = int(lens.max()) if B else 0
    for b in range(B):
        live, n = int(lens[b]), int(n_new[b])
        for t in range(n):
            right = rules.window(live, n, t, T, S)  # keys 0 .. pos: pos is the query's right position
            c = rule(right[1] - 1, t, live, n, T, S)
            if c is None:
                out[b, :, t] = np.nan
                continue
            lo, c = c if isinstance(c, tuple) else (0, c)
            if (lo, c) != right:
                # The query as a decode step over exactly keys lo .. c-1.
                w = c - lo
                window = KVCache(1, kv_heads, w, d, dtype=cache.k.dtype)
                window.append(cache.k[b:b + 1, :, lo:c], cache.v[b:b + 1, :, lo:c], np.array([w]))
                single = np.zeros((1, Hq, w, d), dtype=q.dtype)
                single[0, :, w - 1] = q[b, :, t]
                out[b, :, t] = np.asarray(gqa_attention(single, window, np.array([w])))[0, :, w - 1]
    return out


def _modulo_heads(gqa_attention, q, cache, n_new):
    """Query head h reads KV head h % Hkv: permute the heads around a correct h // G."""
    q = np.asarray(q)
    Hq, kv_heads = q.shape[1], cache.k.shape[1]
    G = Hq // kv_heads
    h = np.arange(Hq)
    # Head h = a * Hkv + j should read KV head j; slot j * G + a does under h // G.
    slot = (h % kv_heads) * G + h // kv_heads
    moved = np.empty_like(q)
    moved[:, slot] = q
    return np.asarray(gqa_attention(moved, cache, n_new))[:, slot]


def _nan_padding(gqa_attention, q, cache, n_new):
    out = np.array(gqa_attention(q, cache, n_new))
    T = out.shape[2]
    padded = np.arange(T)[None, :] >= np.asarray(n_new)[:, None]  # [B, T]
    out[padded[:, None, :, None].repeat(out.shape[1], 1).repeat(out.shape[3], 3)] = np.nan
    return out


def attention_as(mistake_id: str, KVCache, gqa_attention, q, cache, n_new):
    """``gqa_attention(q, cache, n_new)`` as it would be with the mistake ``mistake_id`` (or ``CONTROL``)."""
    if mistake_id in WINDOWS:
        return _windowed_attention(WINDOWS[mistake_id], KVCache, gqa_attention, q, cache, n_new)
    if mistake_id == "modulo_head_mapping":
        return _modulo_heads(gqa_attention, q, cache, n_new)
    if mistake_id == "missing_scale":
        return gqa_attention(np.asarray(q) * math.sqrt(np.asarray(q).shape[-1]), cache, n_new)
    if mistake_id == "nan_padding":
        return _nan_padding(gqa_attention, q, cache, n_new)
    return gqa_attention(q, cache, n_new)


def append_as(mistake_id: str, append, cache, k_new, v_new, n_new):
    """``append(cache, k_new, v_new, n_new)`` (the wrapped class's own) as it would be with the mistake."""
    if mistake_id == "length_before_write":
        # Row by row, the length first (lens[b] += n), then the check, then the write: when a row
        # overflows, it and every row before it claim their new tokens; only the earlier ones stored them.
        before = np.array(cache.lens, copy=True)
        try:
            return append(cache, k_new, v_new, n_new)
        except ValueError:
            end = before + np.asarray(n_new, dtype=np.int64)
            max_len = cache.k.shape[2]
            for b in range(len(end)):
                cache.lens[b] = end[b]
                if end[b] > max_len:
                    break
            raise
    result = append(cache, k_new, v_new, n_new)
    if mistake_id == "concat_growth":
        # Reallocates and copies the whole buffer on every append.
        cache.k = np.concatenate([cache.k[:, :, :0], cache.k], axis=2)
        cache.v = np.concatenate([cache.v[:, :, :0], cache.v], axis=2)
    return result


def _keeper(mistake_id: str, KVCache, gqa_attention):
    """A suspended generator that holds the variant and the wrapped implementation, and serves calls.

    The proxies below hold nothing but ``send``. This runs in the learner's own
    process (step 7, the notebook), where nothing is at stake; the grader keeps
    the variant out of the candidate's process altogether (``grader/stages/variants.py``
    applies ``attention_as`` and ``append_as`` there, on the oracle).
    """
    caches, request = {}, (yield None)
    while True:
        try:
            kind, handle, args = request
            if kind == "new":
                caches[handle] = KVCache(*args[0], **args[1])
                result = None
            elif kind == "append":
                result = append_as(mistake_id, KVCache.append, caches[handle], *args)
            elif kind == "attention":
                q, cache, n_new = args
                result = attention_as(mistake_id, KVCache, gqa_attention, q, caches[handle], n_new)
                # Every variant hands back a new array: the object a call returns tells nothing.
                result = np.array(result, copy=True) if isinstance(result, np.ndarray) else result
            elif kind == "get":
                result = getattr(caches[handle], args)
            elif kind == "set":
                result = setattr(caches[handle], *args)
            else:  # "drop"
                result = caches.pop(handle, None) and None
            request = yield (True, result)
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, who raises it
            request = yield (False, exc)


class _Proxy:
    """The planted ``KVCache``: the same class for every variant, holding only a handle and a channel."""

    __slots__ = ("_kvkit_handle", "_kvkit_send", "__weakref__")

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_kvkit_handle", id(self))
        object.__setattr__(self, "_kvkit_send", type(self)._kvkit_channel)
        _call(self._kvkit_send, ("new", self._kvkit_handle, (args, kwargs)))

    def append(self, k_new, v_new, n_new):
        return _call(self._kvkit_send, ("append", self._kvkit_handle, (k_new, v_new, n_new)))

    def __getattr__(self, name):
        if name.startswith("_kvkit_"):
            raise AttributeError(name)
        return _call(self._kvkit_send, ("get", self._kvkit_handle, name))

    def __setattr__(self, name, value):
        _call(self._kvkit_send, ("set", self._kvkit_handle, (name, value)))

    def __del__(self):
        try:
            _call(self._kvkit_send, ("drop", self._kvkit_handle, None))
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _call(send, request):
    ok, result = send(request)
    if not ok:
        raise result
    return result


def plant(mistake_id: str, KVCache, gqa_attention):
    """Return ``(KVCache, gqa_attention)`` that make the mistake ``mistake_id``.

    ``mistake_id`` is a catalogue id from ``PLANTED``, a key of ``WINDOWS``, or
    ``CONTROL`` (no change). Every variant, the control included, is the same
    proxy code; the variant and the wrapped implementation live only in a
    suspended generator's frame (see ``_keeper``), so only behaviour tells a
    mutant from the control. The proxies carry the originals' names, modules
    and docstrings.

    Raises:
        KeyError: an id with no planted mutant (``kv_repeat``, ``max_len_scan``
            show only in memory and time, never in outputs).
    """
    if mistake_id not in PLANTED and mistake_id not in WINDOWS and mistake_id != CONTROL:
        raise KeyError(f"no planted mutant for mistake {mistake_id!r}; planted: {', '.join(PLANTED)}")
    keeper = _keeper(mistake_id, KVCache, gqa_attention)
    next(keeper)
    send = keeper.send
    cls = type(getattr(KVCache, "__name__", "KVCache"), (_Proxy,), {"__slots__": (), "_kvkit_channel": send,
                                                                  "__doc__": getattr(KVCache, "__doc__", None)})
    cls.__module__ = getattr(KVCache, "__module__", "kv_cache")
    cls.__qualname__ = getattr(KVCache, "__qualname__", cls.__name__)

    def attention(q, cache, n_new):
        handle = object.__getattribute__(cache, "_kvkit_handle") if isinstance(cache, _Proxy) else None
        if handle is None:
            raise TypeError(f"cache must be a {cls.__name__} made by this module, got {type(cache).__name__}")
        return _call(send, ("attention", handle, (q, cache, n_new)))

    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(attention, attr, getattr(gqa_attention, attr, None))
    return cls, attention
