"""Shared checks for the step tests: inputs whose right answer is obvious, and plain-words failures.

No check here computes attention. Each one feeds inputs whose expected output
can be read off directly, then says what came back:

* values that are a *position code* (``v[pos] = [pos, pos**2, 1, ...]``) with
  all-zero queries: every visible key gets the same weight, so the output is
  the mean code of the visible keys, and from its first two entries we read
  back exactly which keys a query saw (``saw keys 0..2``);
* values constant per KV head (``v = 10 * (j + 1)`` for KV head ``j``): the
  output says which KV head a query head read;
* two keys with known scores: the output is one softmax weight, which says
  how the scores were scaled.

Every failure names the step, the configuration (B, Hkv, G, d, lens, n_new,
T), what was expected and what came back, and the catalogue's id for a known
mistake (``chunk_local_mask``, ``modulo_head_mapping``, ...).

The same scenarios run over NumPy (steps 1-4) and PyTorch (step 6) through a
small ``Backend``.
"""
from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

STEP: int | None = None  # set by conftest.py before each test, from the test module's STEP
_CASES: list[str] = []
_FAILED_CASE: list[str] = []


# --------------------------------------------------------------------------- messages

def fail(message: str):
    """End the test with ``message`` in plain words, prefixed with the step (no traceback)."""
    prefix = f"step {STEP}: " if STEP is not None and not message.startswith("step ") else ""
    # "from None": called inside an except block, the report still shows the message alone.
    raise pytest.fail.Exception(prefix + message, pytrace=False) from None


def fmt(value) -> str:
    """A value as a message shows it: arrays and tensors as plain lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


@contextlib.contextmanager
def case(text: str):
    """Name the configuration being run, so an exception from the learner's code can say which one.

    The calls inside run under the per-check timeout (``watch``).
    """
    _CASES.append(text)
    try:
        with watch(text):
            yield
    except BaseException:
        if not _FAILED_CASE:
            _FAILED_CASE.append(text)
        raise
    finally:
        _CASES.pop()


def reset_case() -> None:
    _FAILED_CASE.clear()
    if _WATCHES:  # a check left open by an alarm that fired just as it ended
        _WATCHES.clear()
        _arm()


def failed_case() -> str:
    """The configuration that was running when the current test raised, or ''."""
    return _FAILED_CASE[0] if _FAILED_CASE else (_CASES[-1] if _CASES else "")


# --------------------------------------------------------------------------- the per-check timeout
#
# One check (the calls into the learner's KVCache, append, gqa_attention or
# cost functions that a step test makes under one configuration: one ``case``
# block, or one ``expect_error`` call) may run TIMEOUT_ENV seconds, 10 by
# default. Two layers, neither needing a package the bundle does not ship:
#
# * SIGALRM in this process (signal.setitimer). Its handler raises CheckTimeout
#   in whatever frame is running, which is the learner's loop, so conftest.py
#   reads the function, file and line from the exception's traceback the same
#   way it does for any other exception, and the step ends as an ordinary
#   plain-words failure naming the configuration; the report is complete and
#   a plain `python -m pytest tests/test_step3_mask.py` gets it too. A Python
#   signal handler runs only between bytecodes of the main thread, and only on
#   POSIX, so it cannot end everything.
# * faulthandler.dump_traceback_later, the backstop, armed only when the
#   progress runner names a file in DUMP_ENV: a C watchdog thread that needs no
#   cooperation from the stuck code. BACKSTOP_GRACE_S after the alarm (a call
#   stuck inside NumPy or PyTorch, a bare `except:` that swallowed
#   CheckTimeout, Windows) it writes every thread's stack (file, line and
#   function of each frame) after the header below, and ends the process;
#   progress.py reads the file back.
#
# progress.py also puts a wall-clock limit on each step's whole pytest run, the
# last resort: alone, it could name neither the check nor the line.

TIMEOUT_ENV = "KVKIT_CHECK_TIMEOUT"
DUMP_ENV = "KVKIT_CHECK_DUMP"
DEFAULT_TIMEOUT_S = 10.0
BACKSTOP_GRACE_S = 3.0


class CheckTimeout(BaseException):
    """Raised inside the learner's code when one check runs past the timeout.

    A BaseException, so an ``except Exception`` in the learner's loop lets it through.
    """

    def __init__(self, seconds: float, text: str):
        super().__init__(f"did not return within {seconds:g} s")
        self.seconds = seconds
        self.text = text


def check_timeout() -> float:
    """Seconds one check may run: ``$KVKIT_CHECK_TIMEOUT``, else 10; 0 turns the timeout off."""
    try:
        return float(os.environ.get(TIMEOUT_ENV, "") or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S


_WATCHES: list[tuple[str, float, float]] = []  # open checks, innermost last: (configuration, seconds, deadline)
_ALARM: dict = {}  # "previous": the SIGALRM handler ours replaced while a check is open
_DUMP: dict = {}   # "file": the backstop's open file


def _on_alarm(signum, frame):
    if _WATCHES:
        text, seconds, _ = _WATCHES[-1]
        raise CheckTimeout(seconds, text)


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _warm_up_cuda() -> None:
    """Start CUDA before a check's clock starts: its first use can take seconds that are not the learner's."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_available() and not torch.cuda.is_initialized():
            torch.zeros(1, device="cuda")
    except Exception:
        pass


def _dump_file():
    path = os.environ.get(DUMP_ENV)
    if not path:
        return None
    if "file" not in _DUMP:
        try:
            _DUMP["file"] = open(path, "w", encoding="utf-8")
        except OSError:
            _DUMP["file"] = None
    return _DUMP["file"]


def _arm() -> None:
    """Point the alarm and the backstop at the innermost open check, or turn both off when none is open."""
    alarm = _can_alarm()
    dump = _dump_file()
    if not _WATCHES:
        if alarm and "previous" in _ALARM:
            signal.setitimer(signal.ITIMER_REAL, 0)  # first stop the timer, then give SIGALRM back
            previous = _ALARM.pop("previous")
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if dump is not None:
            faulthandler.cancel_dump_traceback_later()
        return
    text, seconds, deadline = _WATCHES[-1]
    left = max(deadline - time.monotonic(), 0.001)
    if alarm:
        if "previous" not in _ALARM:
            _ALARM["previous"] = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, left)
    if dump is not None:
        dump.seek(0)
        dump.truncate()
        dump.write(f"step: {STEP}\nseconds: {seconds:g}\ncheck: {' '.join(text.split())}\n")
        dump.flush()
        faulthandler.dump_traceback_later(left + BACKSTOP_GRACE_S, exit=True, file=dump)


@contextlib.contextmanager
def watch(text: str):
    """Run the block as one check: past ``check_timeout()`` seconds, CheckTimeout is raised inside it."""
    seconds = check_timeout()
    if seconds <= 0:
        yield
        return
    _warm_up_cuda()
    _WATCHES.append((text, seconds, time.monotonic() + seconds))
    _arm()
    try:
        yield
    finally:
        _WATCHES.pop()
        _arm()


def expect_error(call, what: str, names, nothing_changed=None):
    """Check that ``call()`` raises ValueError or TypeError whose message names one of ``names``.

    ``what`` describes the bad input in plain words; ``nothing_changed``, if
    given, is called afterwards and returns a complaint string or None.
    """
    wanted = " or ".join(names)
    problem = None
    try:
        with watch(what):
            call()
    except (ValueError, TypeError) as exc:
        text = str(exc)
        if not any(name.lower() in text.lower() for name in names):
            problem = (f"it raised {type(exc).__name__}({text!r}), which does not say which argument is wrong; "
                       f"raise your own error naming it ({wanted}) with the shapes or values.")
    except Exception as exc:
        problem = f"it raised {type(exc).__name__}({exc}) but should raise a ValueError (or TypeError) naming {wanted}."
    else:
        problem = f"it returned normally but should raise a ValueError (or TypeError) naming {wanted}."
    if problem is None and nothing_changed is not None:
        complaint = nothing_changed()
        if complaint:
            problem = f"it raised, but {complaint}"
    if problem:  # failed outside the except block: no chained traceback in the report
        fail(f"{what}: {problem}")


# --------------------------------------------------------------------------- backends

class Backend:
    """NumPy arrays in and out: what steps 1-4 run on."""

    name = "NumPy"
    f32, f64 = np.float32, np.float64

    def __init__(self, module):
        self.mod = module

    def cache(self, B, Hkv, max_len, d, dtype=None):
        return self.mod.KVCache(B, Hkv, max_len, d, dtype=self.f64 if dtype is None else dtype)

    def array(self, a, dtype=None):
        return np.asarray(a, dtype=self.f64 if dtype is None else dtype)

    def counts(self, n):
        return np.asarray(n, dtype=np.int64)

    def numpy(self, x):
        return np.array(x.tolist() if hasattr(x, "detach") else x, dtype=np.float64)

    def lens(self, cache):
        return [int(x) for x in np.asarray(cache.lens).reshape(-1).tolist()]

    def is_array(self, x):
        return isinstance(x, np.ndarray)

    def dtype_of(self, x):
        return x.dtype

    def shape_of(self, x):
        return tuple(x.shape)

    def write(self, buf, b, lo, hi, values):
        buf[b, :, lo:hi] = values

    def snapshot(self, buf):
        return np.array(buf, copy=True)

    def same_buffer(self, before, after):
        return after is before

    def attention(self, q, cache, n_new):
        return self.mod.gqa_attention(q, cache, n_new)


def numpy_backend(module) -> Backend:
    return Backend(module)


# --------------------------------------------------------------------------- step 1: the cache

def token_code(call: int, b: int, j: int, t: int) -> int:
    """The value every element of token slot ``t`` of KV head ``j``, row ``b``, append call ``call`` holds in K."""
    return 10000 * call + 1000 * b + 100 * j + t + 1


def describe_code(x: float, counts) -> str:
    """Read a stored K (positive) or V (negative) value back as the token it came from."""
    if x == 0:
        return "0 (nothing written there)"
    if not math.isfinite(x) or x != int(x):
        return f"{fmt(x)} (a value no append wrote)"
    side = "k_new" if x > 0 else "v_new"
    x = abs(int(x))
    call, rest = divmod(x, 10000)
    b, rest = divmod(rest, 1000)
    j, t = divmod(rest, 100)
    t -= 1
    if not (1 <= call <= len(counts)) or t < 0:
        return f"{fmt(x)} (a value no append wrote)"
    note = ""
    if b < len(counts[call - 1]) and t >= counts[call - 1][b]:
        note = f", a padding slot (n_new[{b}] was {counts[call - 1][b]})"
    return f"{side} of append #{call}, row {b}, KV head {j}, slot {t}{note}"


def coded_tokens(call: int, B: int, Hkv: int, T: int, d: int):
    """``(k_new, v_new)`` ``[B, Hkv, T, d]`` float64 with every element set to its token code (V negated)."""
    k = np.zeros((B, Hkv, T, d))
    for b in range(B):
        for j in range(Hkv):
            for t in range(T):
                k[b, j, t] = token_code(call, b, j, t)
    return k, -k


def run_appends(be, label: str, B: int, Hkv: int, d: int, max_len: int, calls, dtype=None, watch=None):
    """Append coded tokens call by call and check the buffers, ``lens`` and buffer identity after each.

    ``calls`` is a list of ``(n_new, T)``. ``watch``, if given, is a context
    manager factory wrapped around each append (step 6 watches the ops).
    """
    setup = f"{label} (B={B}, Hkv={Hkv}, d={d}, max_len={max_len})"
    with case(f"{setup}: KVCache({B}, {Hkv}, {max_len}, {d})"):
        cache = be.cache(B, Hkv, max_len, d, dtype)
    k0, v0 = cache.k, cache.v
    start_k, start_v = be.snapshot(cache.k), be.snapshot(cache.v)
    counts, done, lens = [], [], [0] * B
    for i, (n_new, T) in enumerate(calls, start=1):
        counts.append(list(n_new))
        k_new, v_new = coded_tokens(i, B, Hkv, T, d)
        done.append(f"append #{i} with n_new={fmt(n_new)}, T={T}")
        history = "; ".join(done)
        with case(f"{setup}: {history}"):
            if watch is None:
                cache.append(be.array(k_new, dtype), be.array(v_new, dtype), be.counts(n_new))
            else:
                with watch(f"{setup}: {history}"):
                    cache.append(be.array(k_new, dtype), be.array(v_new, dtype), be.counts(n_new))
        lens = [lens[b] + n_new[b] for b in range(B)]
        for name, before, now in (("k", k0, cache.k), ("v", v0, cache.v)):
            if not be.same_buffer(before, now):
                fail(f"{setup}: after {history}, cache.{name} is a different {'array' if be.name == 'NumPy' else 'tensor'} "
                     f"from the one KVCache.__init__ allocated. The buffers are allocated once and written in place, "
                     f"never rebuilt or regrown (concat_growth).")
        got_lens = cache.lens
        if be.name == "NumPy" and (not isinstance(got_lens, np.ndarray) or got_lens.dtype != np.int64):
            fail(f"{setup}: after {history}, cache.lens is {type(got_lens).__name__} "
                 f"of dtype {getattr(got_lens, 'dtype', None)}; it should be an int64 NumPy array of shape [B]=({B},).")
        if be.lens(cache) != lens:
            fail(f"{setup}: after {history}, cache.lens is {fmt(be.lens(cache))} but should be {fmt(lens)} "
                 f"(each row's length grows by its own n_new[b], padding slots do not count).")
        check_contents(be, setup, history, cache, counts, lens, start_k, start_v)
    return cache


def check_contents(be, setup, history, cache, counts, lens, start_k, start_v):
    """Every stored token where it belongs, and every slot past ``lens[b]`` untouched."""
    got_k, got_v = be.numpy(cache.k), be.numpy(cache.v)
    start = {"k": be.numpy(start_k), "v": be.numpy(start_v)}
    B, Hkv, max_len, _ = got_k.shape
    for b in range(B):
        expected = [(c, t) for c, n in enumerate(counts, start=1) for t in range(n[b])]
        for j in range(Hkv):
            for name, got, sign in (("k", got_k, 1), ("v", got_v, -1)):
                for p in range(max_len):
                    cell = got[b, j, p]
                    if p < lens[b]:
                        c, t = expected[p]
                        want = sign * token_code(c, b, j, t)
                        if not np.all(cell == want):
                            before = sum(n[b] for n in counts[: c - 1])
                            fail(f"{setup}: after {history}, cache.{name}[{b}, {j}, {p}] holds "
                                 f"{describe_code(float(cell[0]), counts)} but should hold "
                                 f"{describe_code(float(want), counts)}: append #{c} writes row {b}'s "
                                 f"tokens starting at its length before the call, lens[{b}]={before}.")
                    elif not np.array_equal(cell, start[name][b, j, p], equal_nan=True):
                        fail(f"{setup}: after {history}, cache.{name}[{b}, {j}, {p}] changed to "
                             f"{describe_code(float(cell[0]), counts)}, but row {b} holds only {lens[b]} token{'' if lens[b] == 1 else 's'}: "
                             f"slots at or past lens[{b}] must stay untouched (padding slots are never stored).")


def run_overflow(be, label: str):
    """An append that overflows one row of three must raise ValueError and change nothing."""
    B, Hkv, max_len, d = 3, 2, 6, 2
    setup = f"{label} (B={B}, Hkv={Hkv}, d={d}, max_len={max_len})"
    with case(setup):
        cache = be.cache(B, Hkv, max_len, d)
        k_new, v_new = coded_tokens(1, B, Hkv, 5, d)
        cache.append(be.array(k_new), be.array(v_new), be.counts([2, 5, 1]))
    lens0, k_before, v_before = be.lens(cache), be.numpy(cache.k), be.numpy(cache.v)
    k_new, v_new = coded_tokens(2, B, Hkv, 2, d)
    what = (f"{setup}: with lens={fmt(lens0)}, append(n_new=[2, 2, 2], T=2) would take row 1 to 5 + 2 = 7 > max_len=6 "
            f"(rows 0 and 2 fit)")
    try:
        with case(what):
            cache.append(be.array(k_new), be.array(v_new), be.counts([2, 2, 2]))
    except ValueError:
        pass
    else:
        fail(f"{what}; it returned normally, lens is now {fmt(be.lens(cache))}. It must raise ValueError "
             f"and change nothing.")
    if be.lens(cache) != lens0:
        fail(f"{what}; it raised ValueError, but lens changed from {fmt(lens0)} to {fmt(be.lens(cache))}: a row's "
             f"length moved before every row was checked, so it now claims tokens it never stored "
             f"(length_before_write). Check every row against max_len first, then write, then move lens.")
    for name, before, now in (("k", k_before, be.numpy(cache.k)), ("v", v_before, be.numpy(cache.v))):
        if not np.array_equal(before, now):
            b = int(np.argwhere(before != now)[0][0])
            fail(f"{what}; it raised ValueError, but cache.{name} row {b} was written before the overflow of row 1 "
                 f"was found. Check every row first, write only when all fit.")
    k_new, v_new = coded_tokens(3, B, Hkv, 4, d)
    what = f"{setup}: with lens={fmt(lens0)}, append(n_new=[4, 1, 4], T=4) fills rows 0 and 1 exactly to max_len=6"
    try:
        with case(what):
            cache.append(be.array(k_new), be.array(v_new), be.counts([4, 1, 4]))
    except ValueError as exc:
        fail(f"{what}; it raised ValueError({exc}). lens[b] + n_new[b] == max_len fits: only > max_len overflows.")
    if be.lens(cache) != [6, 6, 5]:
        fail(f"{what}; lens is {fmt(be.lens(cache))} but should be [6, 6, 5].")


def run_bad_appends(be, label: str):
    """Wrong shapes and counts in ``append`` raise a ValueError naming the argument, and change nothing."""
    B, Hkv, T, d, max_len = 2, 2, 3, 4, 8
    setup = f"{label} (cache B={B}, Hkv={Hkv}, d={d}, max_len={max_len})"
    with case(setup):
        cache = be.cache(B, Hkv, max_len, d)
        cache.append(be.array(np.ones((B, Hkv, 1, d))), be.array(np.ones((B, Hkv, 1, d))), be.counts([1, 1]))
    lens0 = be.lens(cache)

    def unchanged():
        if be.lens(cache) != lens0:
            return f"lens changed from {fmt(lens0)} to {fmt(be.lens(cache))}; a refused append changes nothing."
        return None

    good = np.ones((B, Hkv, T, d))
    cases = [
        ("k_new for 3 rows", np.ones((3, Hkv, T, d)), np.ones((3, Hkv, T, d)), [1, 1], ["k_new"]),
        ("k_new with 3 KV heads", np.ones((B, 3, T, d)), np.ones((B, 3, T, d)), [1, 1], ["k_new"]),
        ("k_new with d=5", np.ones((B, Hkv, T, 5)), np.ones((B, Hkv, T, 5)), [1, 1], ["k_new"]),
        ("k_new of 3 dimensions", np.ones((B, T, d)), np.ones((B, T, d)), [1, 1], ["k_new"]),
        ("v_new of a different shape from k_new", good, np.ones((B, Hkv, T - 1, d)), [1, 1], ["v_new"]),
        ("n_new of length 3 for 2 rows", good, good, [1, 1, 1], ["n_new"]),
        ("n_new=[4, 1] with T=3 slots", good, good, [4, 1], ["n_new"]),
        ("n_new=[-1, 1]", good, good, [-1, 1], ["n_new"]),
    ]
    for what, k_new, v_new, n_new, names in cases:
        shapes = f"k_new {list(k_new.shape)}, v_new {list(v_new.shape)}, n_new={fmt(n_new)}"
        expect_error(lambda: cache.append(be.array(k_new), be.array(v_new), be.counts(n_new)),
                     f"{setup}: append with {what} ({shapes})", names, unchanged)


# --------------------------------------------------------------------------- step 2: heads and scores

def run_heads(be, label: str, Hkv: int, G: int, T: int = 3, d: int = 4, dtype=None, seed: int = 0):
    """Full prefill of one row with V constant per KV head: query head h must return KV head h // G's value."""
    rng = np.random.default_rng(seed)
    Hq, B = Hkv * G, 1
    setup = f"{label} (B={B}, Hkv={Hkv}, G={G}, Hq={Hq}, d={d}, full prefill T=S={T}, n_new=[{T}])"
    k = rng.standard_normal((B, Hkv, T, d))
    v = np.zeros((B, Hkv, T, d))
    for j in range(Hkv):
        v[:, j] = 10 * (j + 1)
    q = rng.standard_normal((B, Hq, T, d))
    with case(setup):
        cache = be.cache(B, Hkv, T + 2, d, dtype)
        cache.append(be.array(k, dtype), be.array(v, dtype), be.counts([T]))
        out = be.attention(be.array(q, dtype), cache, be.counts([T]))
    check_output_type(be, setup, out, (B, Hq, T, d), be.f64 if dtype is None else dtype)
    got = be.numpy(out)
    if not np.all(np.isfinite(got)):
        b, h, t, _ = np.argwhere(~np.isfinite(got))[0].tolist()
        first = ""
        if t == 0 and np.all(np.isfinite(got[:, :, 1:])):
            first = (" Only slot 0 is, the first token of the prefill, which sees nothing but its own key: a mask "
                     "that hides a query's own key leaves it no key at all (off_by_one_mask).")
        fail(f"{setup}: the output holds NaN or inf at query head {h}, slot {t}; with V = 10 * (j + 1) for KV "
             f"head j every output should be a plain number.{first}")
    read = got / 10 - 1  # which KV head's value came back
    expected = np.arange(Hq) // G
    for h in range(Hq):
        for t in range(T):
            r = read[0, h, t]
            if np.allclose(r, expected[h], atol=1e-4):
                continue
            modulo = all(np.allclose(read[0, x, :], x % Hkv, atol=1e-4) for x in range(Hq))
            where = f"query head {h} (slot {t})"
            if np.allclose(r, np.round(r[0]), atol=1e-4) and 0 <= round(float(r[0])) < Hkv:
                got_text = f"read KV head {round(float(r[0]))}"
            else:
                got_text = (f"returned {fmt(got[0, h, t, 0])}, which is no single KV head's value "
                            f"(V is 10 * (j + 1) on KV head j: 10, 20, ...), so it mixed heads or values")
            message = (f"{setup}: {where} {got_text}; with G={G} query heads per KV head it should read "
                       f"KV head {h} // {G} = {expected[h]}.")
            if modulo:
                message += (f" Every query head h read KV head h % Hkv: the groups are interleaved instead of "
                            f"contiguous (modulo_head_mapping).")
            fail(message)


def check_output_type(be, setup, out, shape, dtype):
    """The output is an array (tensor) of ``shape`` in q's ``dtype``."""
    if not be.is_array(out):
        fail(f"{setup}: gqa_attention returned {type(out).__name__}; it should return "
             f"{'a NumPy array' if be.name == 'NumPy' else 'a torch tensor'} of shape {list(shape)}.")
    if be.shape_of(out) != tuple(shape):
        fail(f"{setup}: the output has shape {list(be.shape_of(out))} but should have q's shape "
             f"[B, Hq, T, d] = {list(shape)}.")
    if be.dtype_of(out) != dtype:
        want = np.dtype(dtype).name if be.name == "NumPy" else dtype
        why = ""
        if be.name == "NumPy" and want == "float32" and be.dtype_of(out) == np.float64:
            why = (" In NumPy 2 a float32 array combined with a NumPy float64 scalar (np.sqrt(d) is one) "
                   "becomes float64: cast the result to q.dtype, or scale by a Python float (math.sqrt).")
        fail(f"{setup}: the output has dtype {be.dtype_of(out)} but should have q's dtype {want} "
             f"(q, k and v were all {want}).{why}")


def run_scale(be, label: str, d: int = 16, dtype=None):
    """Two keys whose scores are 0 and ln 3 after scaling: the output is the second key's weight, 0.75."""
    a = math.log(3) / math.sqrt(d)  # q . k1 = d * a, scaled by 1/sqrt(d) gives ln 3
    q = np.zeros((1, 1, 2, d))
    q[0, 0, 1] = a
    k = np.zeros((1, 1, 2, d))
    k[0, 0, 1] = 1.0
    v = np.zeros((1, 1, 2, d))
    v[0, 0, 1] = 1.0
    raw = d * a
    setup = (f"{label} (B=1, Hkv=1, G=1, d={d}, full prefill T=S=2; the last query has raw scores q.k = "
             f"[0, {raw:.4f}] against keys 0 and 1, V = [0, 1])")
    with case(setup):
        cache = be.cache(1, 1, 4, d, dtype)
        cache.append(be.array(k, dtype), be.array(v, dtype), be.counts([2]))
        out = be.numpy(be.attention(be.array(q, dtype), cache, be.counts([2])))
    got = float(out[0, 0, 1, 0])
    want = 0.75
    if abs(got - want) <= 1e-5:
        return
    known = {
        "no scaling at all": raw,
        "scaling by 1/d instead of 1/sqrt(d)": raw / d,
        "multiplying by sqrt(d) instead of dividing": raw * math.sqrt(d),
    }
    why = ""
    for text, score in known.items():
        if abs(got - 1 / (1 + math.exp(-score))) <= 1e-5:
            why = f": that is what {text} gives"
            if text == "no scaling at all":
                why += " (missing_scale)"
            break
    fail(f"{setup}: softmax([0, {raw:.4f}] / sqrt({d})) = softmax([0, ln 3]) = [0.25, 0.75], so the output "
         f"should be 0.75; got {got:.6g}{why}.")


def run_large_scores(be, label: str, dtype):
    """Scores of 200 must not overflow exp: the output is the second key's value, not NaN."""
    d = 4
    q = np.zeros((1, 1, 2, d))
    q[0, 0, 1] = 200.0
    k = np.zeros((1, 1, 2, d))
    k[0, 0, 1] = 1.0
    v = np.zeros((1, 1, 2, d))
    v[0, 0, 1] = 1.0
    setup = (f"{label} (B=1, Hkv=1, G=1, d={d}, dtype {np.dtype(dtype).name if be.name == 'NumPy' else dtype}; "
             f"the last query's scaled scores are [0, 400])")
    with case(setup):
        cache = be.cache(1, 1, 4, d, dtype)
        cache.append(be.array(k, dtype), be.array(v, dtype), be.counts([2]))
        with np.errstate(all="ignore"):
            out = be.numpy(be.attention(be.array(q, dtype), cache, be.counts([2])))
    got = out[0, 0, 1]
    if not np.all(np.isfinite(got)) or not np.allclose(got, 1.0, atol=1e-5):
        fail(f"{setup}: the weights are softmax([0, 400]) = [0, 1] to within 1e-170, so the output should be "
             f"V[1] = 1.0; got {fmt(got[0])}. exp(400) overflows to inf (and inf / inf is NaN): subtract each "
             f"query's largest score before exp, which leaves the softmax unchanged.")


def run_no_repeat_numpy(be, label: str):
    """A decode step must not allocate G copies of K: peak bytes inside attention stay well under G x live K."""
    B, Hkv, G, S, d = 1, 2, 16, 256, 64
    Hq = Hkv * G
    rng = np.random.default_rng(7)
    setup = (f"{label} (B={B}, Hkv={Hkv}, G={G}, Hq={Hq}, d={d}, float32; a decode step, T=1, "
             f"over S={S} keys after a prefill)")
    with case(setup):
        cache = be.cache(B, Hkv, S + 8, d, np.float32)
        tokens = rng.standard_normal((B, Hkv, S, d)).astype(np.float32)
        cache.append(tokens[:, :, :-1], tokens[:, :, :-1], be.counts([S - 1]))
        cache.append(tokens[:, :, -1:], tokens[:, :, -1:], be.counts([1]))
        q = rng.standard_normal((B, Hq, 1, d)).astype(np.float32)
        be.attention(q, cache, be.counts([1]))  # warm up: first-call allocations are not the point
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            be.attention(q, cache, be.counts([1]))
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if not was_tracing:
                tracemalloc.stop()
    rules = catalogue_module("rules")
    if rules is None:
        fail("the kit's catalogue/rules.py is not next to the exercises; this check reads its memory limit there.")
    live_k = B * Hkv * S * d * 4
    # The grader's kv_repeat bound, in bytes: the table counts live K and V together, this message live K.
    limit = rules.repeat_peak_limit(G) * 2 * live_k
    if peak >= limit:
        fail(f"{setup}: gqa_attention allocated {peak / 1024:,.0f} KiB at its peak, {peak / live_k:.1f} times the "
             f"live K ({live_k / 1024:,.0f} KiB). Copying K (and V) out to all {Hq} query heads costs {G} times it; "
             f"the limit here is {limit / live_k:g} times. Each KV head must serve its {G} query heads without "
             f"being copied (kv_repeat).")


def run_bad_attention(be, label: str):
    """Wrong q shapes and counts in ``gqa_attention`` raise a ValueError naming the argument."""
    B, Hkv, d, max_len = 2, 2, 4, 8
    setup = f"{label} (cache B={B}, Hkv={Hkv}, d={d}, lens=[2, 1])"
    with case(setup):
        cache = be.cache(B, Hkv, max_len, d)
        cache.append(be.array(np.ones((B, Hkv, 2, d))), be.array(np.ones((B, Hkv, 2, d))), be.counts([2, 1]))
    qnames = ["q", "Hq", "head"]
    cases = [
        ("q with Hq=3 heads, not a multiple of Hkv=2", np.ones((B, 3, 1, d)), [1, 1], qnames),
        ("q with d=5", np.ones((B, 4, 1, 5)), [1, 1], qnames),
        ("q for 3 rows", np.ones((3, 4, 1, d)), [1, 1], qnames),
        ("n_new of length 1 for 2 rows", np.ones((B, 4, 1, d)), [1], ["n_new"]),
        ("n_new=[2, 1] with T=1 slot", np.ones((B, 4, 1, d)), [2, 1], ["n_new"]),
        ("n_new=[1, 2] while row 1 holds only lens[1]=1 token", np.ones((B, 4, 2, d)), [1, 2], ["n_new", "lens"]),
    ]
    for what, q, n_new, names in cases:
        expect_error(lambda: be.attention(be.array(q), cache, be.counts(n_new)),
                     f"{setup}: gqa_attention with {what} (q {list(q.shape)}, n_new={fmt(n_new)})", names)


# --------------------------------------------------------------------------- steps 3-4: which keys a query sees

def position_values(B: int, Hkv: int, T: int, d: int, starts, n_new):
    """V ``[B, Hkv, T, d]``: real slot t of row b codes its absolute position p = starts[b] + t as [p, p**2, 1, ...].

    Padding slots hold 1000 (never a position), so a stored padding slot shows.
    """
    v = np.full((B, Hkv, T, d), 1000.0)
    for b in range(B):
        for t in range(n_new[b]):
            p = starts[b] + t
            v[b, :, t, 0], v[b, :, t, 1], v[b, :, t, 2:] = p, p * p, 1.0
    return v


def decode_window(o):
    """Which keys a zero query saw, from its output over position-coded values.

    Returns ``(lo, hi)`` for keys ``lo..hi``, ``"none"`` for an all-zero output,
    or a sentence describing an output no contiguous set of keys gives.
    """
    if not np.all(np.isfinite(o)):
        return f"NaN or inf ({fmt(o[0])})"
    mean, square, total = float(o[0]), float(o[1]), float(o[2])
    if abs(mean) < 1e-9 and abs(square) < 1e-9 and abs(total) < 1e-9:
        return "none"
    if abs(total - 1) > 1e-3:
        return f"weights that sum to {total:.4g}, not 1"
    var = max(square - mean * mean, 0.0)
    count = math.sqrt(12 * var + 1)
    lo, hi = mean - (count - 1) / 2, mean + (count - 1) / 2
    if abs(count - round(count)) > 2e-2 or abs(lo - round(lo)) > 2e-2:
        return (f"a blend that is no contiguous run of keys with equal weights (mean position {mean:.3g}); "
                f"with an all-zero query every visible key should get the same weight")
    return round(lo), round(hi)


def explain_window(got, pos, t, L, n, T, S) -> str:
    """Name the mistake (if a known one) behind a query that saw keys ``got`` instead of ``0..pos``.

    ``got`` is what ``decode_window`` read; ``L`` the row's length after the call, ``n`` its new tokens,
    ``T`` the call's slots, ``S`` the longest row's length. A mistake is named when the keys seen are the
    window the catalogue's mask rule gives it (``catalogue/rules.py``, ``MASKS``); "" when nothing is known.
    """
    if got == "none":
        if pos >= 0:
            return "it saw no key at all (its output is all zeros), but every real query sees at least itself."
        return ""
    if isinstance(got, str):
        return ""
    lo, hi = got
    if lo != 0:
        return f"keys before {lo} were left out."
    rules = catalogue_module("rules")
    if rules is None:  # the exercises copied away from the kit's catalogue: nothing to name a window by
        return ""
    right = rules.seen_window("right", L, n, t, T, S)

    def shows(pattern: str) -> bool:
        """The keys seen (0..hi) are the window of ``pattern``, and it is not the right one there."""
        window = rules.seen_window(pattern, L, n, t, T, S)
        return window == (0, hi + 1) and window != right

    if shows("chunk_local_mask/at_decode_too"):
        return ("the mask is aligned to the chunk, not to the cache end (chunk_local_mask)." if T > 1 else
                "the mask is aligned to the top left, as if the decode query were the first token (is_causal=True "
                "does that when T != S): it sees keys 0..t of the call, not 0..its position (chunk_local_mask).")
    if L < S and hi > pos:
        past = f"keys past the row's length lens={L} were attended" if hi >= L else "it sees keys after its own position"
        if shows("ragged_keys_unmasked"):
            return (f"{past}: its position was counted from the longest row's length S={S} instead of this row's "
                    f"own lens={L} (ragged_keys_unmasked).")
        if shows("ragged_keys_unmasked/batch_mask"):
            return (f"{past}: one mask was built for the whole batch from the longest row (S={S}) instead of one "
                    f"per row (ragged_keys_unmasked).")
        if hi >= L:
            return f"{past} (ragged_keys_unmasked)."
    if hi >= L:
        return f"keys at or past the row's length lens={L} were attended."
    if shows("off_by_one_mask"):
        return "it sees one key too many, the one after its own position (off_by_one_mask)."
    if shows("off_by_one_mask/too_few"):
        return "it sees one key too few: not its own (off_by_one_mask)."
    if hi > pos:
        return "it sees keys after its own position: the causal mask is missing or misplaced."
    return ""


def run_windows(be, label: str, Hkv: int, G: int, calls, d: int = 4, max_len: int | None = None,
                check=None, poison: bool = False, dtype=None, seed: int = 0):
    """Feed position-coded K/V call by call; after each checked call, a zero query must see keys 0..its position.

    ``calls`` is a list of ``(n_new, T)`` (per-row counts and slot count).
    ``check`` is the set of 0-based call indices to run attention on (all by
    default). ``poison`` writes position codes straight into the buffers past
    each row's length, so a query that reads past ``lens[b]`` shows it. Padded
    slots (``t >= n_new[b]``) must come back exactly 0.
    """
    rng = np.random.default_rng(seed)
    B = len(calls[0][0])
    Hq = Hkv * G
    total = [sum(n[b] for n, _ in calls) for b in range(B)]
    max_len = max_len or max(total) + 2
    head = f"{label} (B={B}, Hkv={Hkv}, G={G}, d={d}, max_len={max_len})"
    with case(f"{head}: KVCache({B}, {Hkv}, {max_len}, {d})"):
        cache = be.cache(B, Hkv, max_len, d, dtype)
    lens = [0] * B
    history = []
    for i, (n_new, T) in enumerate(calls):
        starts = list(lens)
        lens = [lens[b] + n_new[b] for b in range(B)]
        history.append(f"n_new={fmt(n_new)}" + (f" (T={T})" if T != max(n_new) or B > 1 else ""))
        k_new = rng.standard_normal((B, Hkv, T, d))
        v_new = position_values(B, Hkv, T, d, starts, n_new)
        with case(f"{head}: append #{i + 1} ({history[-1]}) after lens={fmt(starts)}"):
            cache.append(be.array(k_new, dtype), be.array(v_new, dtype), be.counts(n_new))
        if check is not None and i not in check:
            continue
        if poison:
            room = int(be.shape_of(cache.v)[2])  # the buffers' length (max_len, if they were allocated right)
            for b in range(B):
                if room > lens[b]:
                    tail = position_values(1, Hkv, room - lens[b], d, [lens[b]], [room - lens[b]])[0]
                    be.write(cache.v, b, lens[b], room, be.array(tail, dtype))
                    be.write(cache.k, b, lens[b], room, be.array(np.zeros_like(tail), dtype))
        S = max(lens) if B else 0
        if len(set(n_new)) > 1 or len(set(starts)) > 1:
            kind = "ragged call"
        else:
            kind = "decode" if T == 1 else ("full prefill" if starts[0] == 0 else "chunked prefill")
        setup = (f"{head}, {kind}: call {i + 1} of [{', '.join(history)}], T={T}, n_new={fmt(n_new)}, "
                 f"lens after it={fmt(lens)}")
        q = np.zeros((B, Hq, T, d))
        for b in range(B):
            q[b, :, n_new[b]:] = rng.standard_normal((Hq, T - n_new[b], d))  # junk in padded slots
        with case(setup):
            out = be.attention(be.array(q, dtype), cache, be.counts(n_new))
        check_output_type(be, setup, out, (B, Hq, T, d), be.f64 if dtype is None else dtype)
        got = be.numpy(out)
        for b in range(B):
            for t in range(T):
                row = f" of row {b}" if B > 1 else ""
                if t >= n_new[b]:
                    pad = got[b, :, t]
                    if not np.all(pad == 0):
                        bad = "NaN" if np.isnan(pad).any() else ("inf" if np.isinf(pad).any() else "non-zero values")
                        what = (f"row {b} received no tokens in this call (n_new[{b}]=0), so all its slots are padding"
                                if n_new[b] == 0 else f"slot {t}{row} is padding (n_new[{b}]={n_new[b]} <= {t})")
                        fail(f"{setup}: {what}, and its output should be exactly 0; got {bad} "
                             f"(e.g. {fmt(pad[0][:3])})." + (" A fully masked query's softmax is 0/0 (nan_padding)."
                                                            if bad in ("NaN", "inf") else ""))
                    continue
                pos = starts[b] + t
                for h in range(Hq):
                    seen = decode_window(got[b, h, t])
                    if seen == (0, pos):
                        continue
                    who = "the decode query" if T == 1 else (
                        f"query {t} of the prefill" if kind == "full prefill" else f"query {t} of the chunk")
                    head_text = f", query head {h}" if h else ""
                    seen_text = "no key" if seen == "none" else (
                        f"keys {seen[0]}..{seen[1]}" if isinstance(seen, tuple) else seen)
                    why = explain_window(seen, pos, t, lens[b], n_new[b], T, S)
                    picture = mask_picture(got, b, h, starts[b], n_new[b], lens[b])
                    fail(f"{setup}: {who}{row}{head_text} (absolute position {pos}) saw {seen_text} but should see "
                         f"keys 0..{pos}" + (f": {why}" if why else ".") + picture)
    return cache


def catalogue_module(name: str):
    """The kit's ``catalogue/<name>.py`` (``rules``, ``structure``), loaded by path as ``_kvkit_<name>``;
    None when it cannot be found.

    Looked for in the starter bundle's ``catalogue/`` (beside ``tests/``), in the kit's ``catalogue/``
    beside the exercises directory, then as the installed kit's ``catalogue.<name>``. Loaded by path, not
    imported, so that the bundle needs no package on ``sys.path``; ``structure.py`` finds ``rules.py``
    beside it under the same name.
    """
    import importlib.util
    from pathlib import Path

    key = f"_kvkit_{name}"
    if key in sys.modules:
        return sys.modules[key]
    here = Path(__file__).resolve().parent.parent  # the exercises (or the starter bundle's) folder
    path = next((p for p in (here / "catalogue" / f"{name}.py", here.parent / "catalogue" / f"{name}.py")
                 if p.is_file()), None)
    if path is None:  # the installed kit's
        try:
            spec = importlib.util.find_spec(f"catalogue.{name}")
        except (ImportError, ValueError):
            spec = None
        path = Path(spec.origin) if spec is not None and spec.origin else None
    if path is None:
        return None
    found = importlib.util.spec_from_file_location(key, path)
    sys.modules[key] = importlib.util.module_from_spec(found)  # registered first: its dataclasses look it up there
    try:
        found.loader.exec_module(sys.modules[key])
    except BaseException:
        del sys.modules[key]
        raise
    return sys.modules[key]


def mask_picture(got, b: int, h: int, start: int, n: int, live: int) -> str:
    """Every query of row ``b``, head ``h`` in this call: the keys it saw beside the keys it should see,
    drawn by the catalogue's ``structure.grid`` (``#`` seen, ``.`` not); "" when the catalogue is absent."""
    structure = catalogue_module("rules") and catalogue_module("structure")  # the mask rule first: structure reads it
    if structure is None:
        return ""
    yours = []
    for t in range(n):
        seen = decode_window(got[b, h, t])
        yours.append(set(range(seen[0], seen[1] + 1)) if isinstance(seen, tuple) else set())
    right = [set(range(start + t + 1)) for t in range(n)]
    lines = structure.grid(yours, right, live)
    return "\n\nkeys seen by each query of this call (row %d, query head %d):\n%s" % (b, h, "\n".join(lines))


def run_padding_random(be, label: str, dtype=None, seed: int = 3):
    """Random queries with padded slots and an idle row: padding is exactly 0 and everything is finite."""
    rng = np.random.default_rng(seed)
    B, Hkv, G, d, T = 3, 2, 2, 8, 4
    Hq = Hkv * G
    head = f"{label} (B={B}, Hkv={Hkv}, G={G}, d={d}, random q, k, v)"
    with case(head):
        cache = be.cache(B, Hkv, 12, d, dtype)
    lens = [0] * B
    for i, n_new in enumerate(([4, 2, 0], [1, 0, 3], [0, 0, 0])):
        lens = [lens[b] + n_new[b] for b in range(B)]
        setup = f"{head}: call {i + 1}, T={T}, n_new={fmt(n_new)}, lens after it={fmt(lens)}"
        with case(setup):
            cache.append(be.array(rng.standard_normal((B, Hkv, T, d)), dtype),
                         be.array(rng.standard_normal((B, Hkv, T, d)), dtype), be.counts(n_new))
            out = be.attention(be.array(rng.standard_normal((B, Hq, T, d)) * 3, dtype), cache, be.counts(n_new))
        check_output_type(be, setup, out, (B, Hq, T, d), be.f64 if dtype is None else dtype)
        got = be.numpy(out)
        if not np.all(np.isfinite(got)):
            b, h, t, _ = np.argwhere(~np.isfinite(got))[0].tolist()
            kind = "a padding slot" if t >= n_new[b] else "a real query"
            fail(f"{setup}: the output holds NaN or inf at row {b}, query head {h}, slot {t} ({kind})"
                 + (": a fully masked query's softmax is 0/0 (nan_padding)." if t >= n_new[b] else "."))
        for b in range(B):
            if np.any(got[b, :, n_new[b]:] != 0):
                t = n_new[b] + int(np.argwhere(got[b, :, n_new[b]:] != 0)[0][1])
                fail(f"{setup}: slot {t} of row {b} is padding (n_new[{b}]={n_new[b]}) and its output should be "
                     f"exactly 0; got {fmt(got[b, 0, t, :3])}.")


def run_empty(be, label: str, dtype=None):
    """B = 0, an all-empty cache and T = 0 return zeros of shape [B, Hq, T, d]."""
    d = 3
    for text, B, lens_calls, T in (("an empty batch (B=0)", 0, [], 2),
                                   ("an all-empty cache (every n_new is 0)", 2, [], 2),
                                   ("T=0 slots", 2, [[2, 1]], 0)):
        setup = f"{label}, {text} (B={B}, Hkv=2, G=2, d={d}, T={T})"
        with case(setup):
            cache = be.cache(B, 2, 4, d, dtype)
            for n in lens_calls:
                cache.append(be.array(np.ones((B, 2, max(n), d)), dtype),
                             be.array(np.ones((B, 2, max(n), d)), dtype), be.counts(n))
            out = be.attention(be.array(np.ones((B, 4, T, d)), dtype), cache, be.counts([0] * B))
        check_output_type(be, setup, out, (B, 4, T, d), be.f64 if dtype is None else dtype)
        got = be.numpy(out)
        if got.size and not np.all(got == 0):
            fail(f"{setup}: nothing is attended, so the output should be all zeros; got {fmt(got.reshape(-1)[:3])}...")
