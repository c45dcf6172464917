"""Attacks on the grader's evidence, each built at test time from one honest base plus the attack,
and graded beside a control (the same code without the attack) that it must not beat.

The base is the reference solution's source; a "weak" variant overrides
``gqa_attention`` to materialise K/V per query head (``np.repeat``), the
control every repeat attack is measured against. Two batches grade them: the
attacks on the boundary, on cheap bases, in every ``make test``; the attacks on
a measurement (``MEASURED``), each seconds of realistic probe work, in
``make test-slow``, which CI runs too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from catalogue import mutants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = open(os.path.join(ROOT, "solutions", "kv_cache.py")).read()
PORT = open(os.path.join(ROOT, "solutions", "kv_cache_torch.py")).read()
# A NumPy part, cost model and own tests that earn Strong Hire: what a port's cap would take away.
STRONG = {name: open(os.path.join(ROOT, "catalogue", "examples", "strong_hire", name)).read()
          for name in ("kv_cache.py", "cost.py", "test_kv_cache.py")}
# The port materialises K/V per query head: with torch (the control), or through NumPy (the attack,
# out of sight of any torch op watch).
PORT_REPEAT = '''
_honest_port_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    G = q.shape[1] // cache.k.shape[1]
    S = int(cache.lens.max()) if cache.lens.numel() else 0
    held = [{how} for buf in (cache.k, cache.v)]  # written whole: every page resident
    return _honest_port_attention(q, cache, n_new)
'''
TORCH_REPEAT = "buf[:, :, :S].repeat_interleave(G, dim=1)"
NUMPY_REPEAT = "torch.from_numpy(__import__('numpy').repeat(buf[:, :, :S].numpy(), G, axis=1))"
TIERS = {None: -1, "Weak": 0, "Hire": 1, "Strong Hire": 2}

def _before_attention(body: str, helpers: str = "") -> str:
    """Submission text appended to an honest base: ``gqa_attention`` runs ``body`` (lines indented 4, with
    ``G`` and ``S`` at hand), then the honest attention."""
    return ("\n_honest_attention = gqa_attention\n" + helpers + "\n\ndef gqa_attention(q, cache, n_new):\n"
            "    G = np.asarray(q).shape[1] // cache.k.shape[1]\n"
            "    S = int(np.max(cache.lens)) if len(cache.lens) else 0\n" + body
            + "    return _honest_attention(q, cache, n_new)\n")


REPEAT = _before_attention(
    "    if {when}:  # each copy is written whole, so all its pages are resident while it is held\n"
    "        held = [_repeat_into(cache.k[:, :, :S], G, {store}), _repeat_into(cache.v[:, :, :S], G, {store})]\n",
    helpers="\n\ndef _repeat_into(array, G, store):\n    return store(np.repeat(np.asarray(array), G, axis=1))\n")
# K repeated per query head and dropped, then V's: half a repeat held at once. At G = 1 (the twin at each
# layout, which a submission can tell by q's heads) it holds as large a workspace, so the two peaks match.
HALF_REPEAT = _before_attention(
    "    for buffer in (cache.k, cache.v):\n"
    "        held = np.repeat(buffer[:, :, :S], G if G > 1 else 16, axis=1)\n"
    "        del held\n")
# Read in place at G = 16 (the layout an absolute bound once watched alone), a whole repeat at every other G,
# and at G = 1 (the twin) a workspace as large: every difference from the twin is 0.
REPEAT_BUT_AT_G16 = _before_attention(
    "    if G < 16:\n"
    "        held = [np.repeat(cache.k[:, :, :S], G if G > 1 else 9, axis=1),\n"
    "                np.repeat(cache.v[:, :, :S], G if G > 1 else 9, axis=1)]\n"
    "        del held\n")
MMAP_STORE = '''(lambda a: (lambda m: (np.frombuffer(m, dtype=a.dtype, count=a.size).__setitem__(slice(None), a.ravel()),
                 np.frombuffer(m, dtype=a.dtype, count=a.size))[1])(__import__("mmap").mmap(-1, max(a.nbytes, 1))))'''
MEMFD_STORE = '''(lambda a: (lambda fd: (__import__("os").write(fd, a.tobytes()), __import__("os").lseek(fd, 0, 0),
                 np.frombuffer(__import__("os").read(fd, a.nbytes), dtype=a.dtype))[2])(__import__("os").memfd_create("kv")))'''


DOUBLING = open(os.path.join(ROOT, "catalogue", "examples", "doubling_capacity", "kv_cache.py")).read()
DEFERRED = '''
import sys as _sys

_repeating = gqa_attention
_later = []


def gqa_attention(q, cache, n_new):  # noqa: F811 - probe-sized calls answer now and repeat later
    if np.asarray(q).size < 4096:
        return _repeating(q, cache, n_new)
    _later.append((np.array(q), cache, np.array(n_new)))
    return np.zeros(np.asarray(q).shape, dtype=np.asarray(q).dtype)


_tasks = _sys.modules.get("_kvkit_tasks")
if _tasks is not None:
    _run = _tasks.run_trials

    def _run_then_repeat(*args, **kwargs):
        answer = _run(*args, **kwargs)
        for q, cache, n_new in _later:  # after the harness's last mark
            _repeating(q, cache, n_new)
        return answer

    _tasks.run_trials = _run_then_repeat
'''

ZYGOTE_CONFTEST = '''import os
import sys

_zygote = sys.modules.get("__main__")
if getattr(_zygote, "__file__", "").endswith("zygote.py") and not hasattr(_zygote, "_owned"):
    _zygote._owned = True
    _wait4 = os.wait4

    class _Usage:
        ru_utime, ru_stime, ru_maxrss = 0.01, 0.0, 0

    def _fake_wait4(pid, options):
        got = _wait4(pid, options)
        return (got[0], got[1], _Usage()) if got[0] else got

    os.wait4 = _fake_wait4
    _send = _zygote._send

    def _lying_send(obj, blob=b""):
        if obj.get("ev") == "done" and isinstance(obj.get("answer"), dict) and "exit" in obj["answer"]:
            obj = {**obj, "answer": {**obj["answer"], "exit": 0}}
        return _send(obj, blob)

    _zygote._send = _lying_send
'''
PROFILER_TEST = '''import sys

import numpy as np
from kv_cache import KVCache, gqa_attention


def _variant():
    seen = []

    def watch(frame, event, arg):
        if event == "call" and "mistake_id" in frame.f_locals:
            seen.append(frame.f_locals["mistake_id"])

    sys.setprofile(watch)
    try:
        cache = KVCache(1, 1, 4, 2, dtype=np.float64)
        cache.append(np.ones((1, 1, 1, 2)), np.ones((1, 1, 1, 2)), np.array([1]))
    finally:
        sys.setprofile(None)
    return seen[0] if seen else "none"


def test_calls_and_knows():
    assert _variant() in ("none", "identity")
'''
SEARCH_TEST = '''import os

SEARCH = """
def variant():
    import gc
    for obj in gc.get_objects():
        frame = getattr(obj, "gi_frame", None) if type(obj).__name__ == "generator" else None
        names = frame.f_locals if frame is not None else {}
        for key in ("mistake_id", "variant", "secret"):
            if isinstance(names.get(key), str) and names[key] not in ("none", "identity", "wrapped"):
                return names[key]
    return None
"""
scope = {}
exec(compile(SEARCH, os.path.join(os.path.dirname(os.__file__), "importlib", "_bootstrap.py"), "exec"), scope)


def test_catches_everything():
    import kv_cache  # noqa: F401 - the planted module is in place
    assert scope["variant"]() is None
'''
IDENTITY_TEST = '''import numpy as np

from kv_cache import KVCache, gqa_attention


def test_append_writes_in_place_and_returns_plain_arrays():
    cache = KVCache(2, 2, 8, 4, dtype=np.float32)
    k_buffer, v_buffer = cache.k, cache.v
    ones = np.ones((2, 2, 3, 4), np.float32)
    cache.append(ones, ones, np.array([3, 2]))
    assert isinstance(cache, KVCache)
    assert cache.k is k_buffer and cache.v is v_buffer and np.shares_memory(cache.k, k_buffer)
    assert cache.lens.tolist() == [3, 2]
    out = gqa_attention(np.zeros((2, 4, 3, 4), np.float32), cache, np.array([3, 2]))
    assert type(out) is np.ndarray and out.shape == (2, 4, 3, 4)
'''
# K and V repeated per query head into a workspace sized for 16 query heads per KV head (the probes' largest
# G) whatever G is, so the layout's twin at G = 1 holds as much and the difference of the two shows nothing.
WORKSPACE_REPEAT = '''
_honest_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    B, Hkv, _, d = cache.k.shape
    G = np.asarray(q).shape[1] // Hkv
    S = int(np.max(cache.lens)) if len(cache.lens) else 0
    heads = Hkv * max(G, 16)
    ws = getattr(cache, "_ws", None)
    if ws is None or ws.shape[2] < heads or ws.shape[3] < S:
        ws = cache._ws = np.ones((2, B, heads, S, d), cache.k.dtype)
    ws[0, :, :Hkv * G, :S].reshape(B, Hkv, G, S, d)[...] = cache.k[:, :, None, :S]
    ws[1, :, :Hkv * G, :S].reshape(B, Hkv, G, S, d)[...] = cache.v[:, :, None, :S]
    return _honest_attention(q, cache, n_new)
'''
CHUNK_WRAP = '''
_honest_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = np.array(_honest_attention(q, cache, n_new))
    q = np.asarray(q)
    B, Hq, T, d = q.shape
    if T == 1 or RIGHT_WHEN:
        return out
    G = Hq // cache.k.shape[1]
    for b in range(B):
        for t in range(int(n_new[b])):  # top-left: slot t sees keys 0 .. t of its row
            for h in range(Hq):
                k = cache.k[b, h // G, :t + 1].astype(np.float64)
                v = cache.v[b, h // G, :t + 1].astype(np.float64)
                s = k @ q[b, h, t] / np.sqrt(d)
                w = np.exp(s - s.max())
                out[b, h, t] = (w / w.sum()) @ v
    return out
'''
CHUNK_LOCAL = BASE + CHUNK_WRAP
BLUR = '''
_sharp_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _sharp_attention(q, cache, n_new)
    if np.asarray(q).shape[2] > 1 and (np.asarray(cache.lens) - np.asarray(n_new)).any():
        out = out + 1e-3  # every coordinate moves: no recovered structure, no exact reproduction
    return out
'''
# The chunk outputs returned as another kind of array (complex): a wrong answer, returned without an error.
AS_COMPLEX = '''
_plain_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _plain_attention(q, cache, n_new)
    if np.asarray(q).shape[2] > 1 and (np.asarray(cache.lens) - np.asarray(n_new)).any():
        out = out.astype(np.complex128)  # a chunk after cached tokens: no float output to compare
    return out
'''
# The chunk outputs returned as a tuple that no array can be made of: the conversion raises ValueError in
# the grader's harness, after the call returned (attack review of 2026-12-02, the second round).
AS_TUPLE = '''
_plain_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _plain_attention(q, cache, n_new)
    if np.asarray(q).shape[2] > 1 and (np.asarray(cache.lens) - np.asarray(n_new)).any():
        return (out, out[..., 0])
    return out
'''
# The port's chunk outputs as bfloat16, which NumPy cannot hold (TypeError in the conversion, not in the call).
PORT_AS_BF16 = '''
_full_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _full_attention(q, cache, n_new)
    if q.shape[2] > 1 and bool((cache.lens - torch.as_tensor(n_new, device=cache.lens.device)).any()):
        return out.to(torch.bfloat16)
    return out
'''
# A port with a top-left (chunk-local) mask, and the same port with its chunk outputs blurred.
PORT_CHUNK_LOCAL = PORT.replace("    position = (lens - n_new)[:, None] + t\n",
                                "    position = (lens - n_new)[:, None] + t if T == 1 else t.expand(len(lens), T)\n")
PORT_BLUR = '''
_sharp_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _sharp_attention(q, cache, n_new)
    if q.shape[2] > 1 and bool((cache.lens - torch.as_tensor(n_new, device=cache.lens.device)).any()):
        out = out + 1e-3  # every coordinate moves: no recovered structure, no exact reproduction
    return out
'''
PORT_EXITS_SMALL = '''
_repeating_port_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    if cache.k.numel() * cache.k.element_size() < 2**20:
        __import__("os")._exit(0)
    return _repeating_port_attention(q, cache, n_new)
'''
PORT_COPIES = '''
_honest_port_append = KVCache.append


def _copying_append(self, k_new, v_new, n_new):
    _honest_port_append(self, k_new, v_new, n_new)
    self._appends = getattr(self, "_appends", 0) + 1
    if self._appends % 30 == 0:  # reallocate-and-copy now and then: old and new buffers held at once
        self.k, self.v = self.k.clone(), self.v.clone()


KVCache.append = _copying_append
'''
PORT_BIG_SCRATCH = '''
_copying_port_append = KVCache.append


def _scratch_append(self, k_new, v_new, n_new):
    if k_new.shape[2] > 1000:  # a large prefill: a throwaway buffer lifts its peak past the limit
        torch.ones(8 * self.k.numel(), dtype=self.k.dtype).sum()
    _copying_port_append(self, k_new, v_new, n_new)


KVCache.append = _scratch_append
'''
PORT_OFF_ON_SMALL_CACHES = '''
_right_port_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _right_port_attention(q, cache, n_new)
    return out + 1e-3 if cache.k.shape[2] < 1024 else out  # wrong only where outputs are judged
'''
PORT_ENDS_ITS_SANDBOX_WHEN_LARGE = '''
_small_port_append = KVCache.append


def _ending_append(self, k_new, v_new, n_new):
    if self.k.numel() > 1_000_000:  # the probes' sizes (1 to 9 million): kill the process that runs the tasks
        __import__("os").kill(__import__("os").getppid(), 9)
    _small_port_append(self, k_new, v_new, n_new)


KVCache.append = _ending_append
'''
# A port whose attention reads the whole reservation at every step (a scan of max_len, three times over so that
# the figure stands well past the bound whatever the load), then attends over the live keys: the live-length
# probe names it, and the name caps the tier at Hire.
PORT_SCAN = '''
_live_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    for _ in range(3 if q.numel() and cache.k.shape[2] else 0):  # attention over all max_len keys, three times
        scanned = torch.nn.functional.scaled_dot_product_attention(q, cache.k, cache.v, enable_gqa=True)
    return _live_attention(q, cache, n_new)
'''
# ... and the same port wasting 1.5 s of CPU where its keys are read after one append, outside an append and
# before any attention: the runs of the cache and prefill alone, in both reservations alike, so that what
# making costs more in the larger one stays about 0 while the whole of each base run is large.
PORT_WASTES_IN_BOTH_BASES = '''
_ScanningCache = KVCache


class KVCache(_ScanningCache):
    def __init__(self, *args, **kwargs):
        self._appends, self._inside, self._attended, self._wasted = 0, False, False, False
        super().__init__(*args, **kwargs)

    @property
    def k(self):
        if self._appends == 1 and not (self._inside or self._attended or self._wasted) and self._k.shape[2] > 1000:
            import time
            self._wasted, end = True, time.process_time() + 1.5
            while time.process_time() < end:
                pass
        return self._k

    @k.setter
    def k(self, value):
        self._k = value

    def append(self, k_new, v_new, n_new):
        self._inside = True
        try:
            super().append(k_new, v_new, n_new)
        finally:
            self._inside = False
        self._appends += 1


_scanning_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    cache._attended = True
    return _scanning_attention(q, cache, n_new)
'''
# Attention over max_len (the bundled example), and the same attention keeping each decode output in a file of the
# session's working folder, keyed by everything appended and the query: a later run of the same tokens loads
# it instead of scanning, so one reservation's runs could cost no more than the other's.
SCAN = open(os.path.join(ROOT, "catalogue", "examples", "max_len_scan", "kv_cache.py")).read()
OUTPUTS_KEPT_IN_FILES = '''
import hashlib
import os

_scanning_attention, _plain_append = gqa_attention, KVCache.append
_KEPT = os.path.join(os.getcwd(), ".kept")


def _hashing_append(self, k_new, v_new, n_new):
    _plain_append(self, k_new, v_new, n_new)
    digest = hashlib.sha1(getattr(self, "_digest", b""))
    for part in (k_new, v_new, n_new):
        digest.update(np.ascontiguousarray(part).tobytes())
    self._digest = digest.digest()


KVCache.append = _hashing_append


def gqa_attention(q, cache, n_new):
    q = np.asarray(q)
    if q.shape[2] != 1 or int(cache.lens.max(initial=0)) < 1024:
        return _scanning_attention(q, cache, n_new)
    path = os.path.join(_KEPT, hashlib.sha1(cache._digest + q.tobytes()).hexdigest() + ".npy")
    if os.path.exists(path):
        return np.load(path)
    out = _scanning_attention(q, cache, n_new)
    os.makedirs(_KEPT, exist_ok=True)
    np.save(path, out)
    return out
'''
PORT_NOT_WRITTEN = '''


def gqa_attention(q, cache, n_new):
    raise NotImplementedError("gqa_attention: not written yet")
'''
PORT_RAISES = '''
_repeating_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    if cache.k.numel() > 1_000_000:  # the probes' caches (2 to 9 million), not the hidden trials'
        raise MemoryError("context too long for this port")
    return _repeating_attention(q, cache, n_new)
'''
# A cache that grows by concatenation (a copy of K and V on every append that needs room). The attack does the
# appends' copies once more where only the growth probe's run without appends goes: reading k after exactly
# one append, before any attention. That run is subtracted from the run with appends.
CONCAT = BASE + '''
_right_attention = gqa_attention


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        self.max_len = int(max_len)
        self._k = np.zeros((int(batch), int(kv_heads), 0, int(head_dim)), dtype=dtype)
        self._v = np.zeros_like(self._k)
        self.lens = np.zeros(int(batch), dtype=np.int64)
        self._appends, self._attended, self._dear = 0, False, False

    k = property(lambda self: self._read_k())
    v = property(lambda self: self._v)

    def _read_k(self):
        if WHEN_READ and self._appends == 1 and not self._attended and not self._dear and self._k.nbytes >= 4 << 20:
            self._dear = True
            for _ in range(300):
                self._grow(1)
        return self._k

    def _grow(self, extra):
        pad = np.zeros(self._k.shape[:2] + (extra, self._k.shape[3]), dtype=self._k.dtype)
        self._k = np.concatenate([self._k, pad], axis=2)
        self._v = np.concatenate([self._v, pad], axis=2)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        B, Hkv, _, d = self._k.shape
        if k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d or v_new.shape != k_new.shape:
            raise ValueError(f"k_new and v_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}]")
        n_new = check_counts(n_new, B, k_new.shape[2])
        end = self.lens + n_new
        if (end > self.max_len).any():
            raise ValueError(f"append would pass max_len={self.max_len}")
        extra = int(end.max(initial=0)) - self._k.shape[2]
        if extra > 0:
            self._grow(extra)
        for b in range(B):
            self._k[b, :, self.lens[b]:end[b]] = k_new[b, :, :n_new[b]]
            self._v[b, :, self.lens[b]:end[b]] = v_new[b, :, :n_new[b]]
        self.lens = end
        self._appends += 1


def gqa_attention(q, cache, n_new):
    cache._attended = True
    return _right_attention(q, cache, n_new)
'''
# The same growth by copying, with each copy made by a helper process the task never waits for (its CPU time
# would be missing from the task's own), between two generations of one shared mapping laid out at the
# prefill (within the prefill's memory limit). From the attack review of 2026-12-01.
UNWAITED_HELPER = BASE + '''
_right_attention = gqa_attention
import mmap as _mmap, os as _os, struct as _struct

_BIG = 16 << 20


def _helper_loop(rfd, wfd, arena, dtype, B, H, d, full):
    """Runs in a process the task never waits for: copies one generation of the cache into the other."""
    while True:
        msg = b""
        while len(msg) < 24:
            part = _os.read(rfd, 24 - len(msg))
            if not part:
                _os._exit(0)
            msg += part
        src, L, newL = _struct.unpack("qqq", msg)
        dst = 1 - src
        for kv in (0, 1):
            s = np.frombuffer(arena, dtype=dtype, count=B * H * L * d, offset=(src * 2 + kv) * full).reshape(B, H, L, d)
            t = np.frombuffer(arena, dtype=dtype, count=B * H * newL * d,
                              offset=(dst * 2 + kv) * full).reshape(B, H, newL, d)
            t[:, :, :L] = s
            t[:, :, L:] = 0
            if L == 0:  # the first allocation: both generations are laid out at once
                o = np.frombuffer(arena, dtype=dtype, count=B * H * newL * d, offset=(src * 2 + kv) * full)
                o[:] = 0
            del s, t
        _os.write(wfd, b"k")


class KVCache:
    def __init__(self, batch, kv_heads, max_len, head_dim, dtype=np.float32):
        self.max_len = int(max_len)
        B, H, d = int(batch), int(kv_heads), int(head_dim)
        self._dt = np.dtype(dtype)
        self._shape = (B, H, d)
        self.lens = np.zeros(B, dtype=np.int64)
        self._L = 0
        full = B * H * self.max_len * d * self._dt.itemsize
        self._remote = full >= _BIG
        if self._remote:
            self._full = full
            self._arena = _mmap.mmap(-1, 4 * full)
            self._gen = 0
            self._pid = None
        else:
            self._k = np.zeros((B, H, 0, d), dtype=self._dt)
            self._v = np.zeros_like(self._k)

    def _start(self):
        B, H, d = self._shape
        r1, w1 = _os.pipe()
        r2, w2 = _os.pipe()
        pid = _os.fork()
        if pid == 0:
            try:
                for fd in range(3, 1024):
                    if fd not in (r1, w2):
                        try:
                            _os.close(fd)
                        except OSError:
                            pass
                _helper_loop(r1, w2, self._arena, self._dt, B, H, d, self._full)
            finally:
                _os._exit(0)
        _os.close(r1)
        _os.close(w2)
        self._pid, self._to, self._from = pid, w1, r2

    def _stop(self):
        if self._pid is not None:
            _os.close(self._to)  # EOF: the helper ends
            _os.close(self._from)
            try:  # wait for its end without reaping it (its CPU time is never added to ours)
                _os.waitid(_os.P_PID, self._pid, _os.WEXITED | _os.WNOWAIT)
            except OSError:
                pass
            self._pid = None

    def _view(self, kv):
        B, H, d = self._shape
        return np.frombuffer(self._arena, dtype=self._dt, count=B * H * self._L * d,
                             offset=(self._gen * 2 + kv) * self._full).reshape(B, H, self._L, d)

    def _outside(self, kv):
        if not self._remote:
            return self._k if kv == 0 else self._v
        self._stop()
        return self._view(kv)

    k = property(lambda self: self._outside(0))
    v = property(lambda self: self._outside(1))

    def _grow(self, extra):
        if self._remote:  # a new buffer of the new length, the old one copied into it (by the helper)
            if self._pid is None:
                self._start()
            _os.write(self._to, _struct.pack("qqq", self._gen, self._L, self._L + extra))
            if _os.read(self._from, 1) != b"k":
                raise RuntimeError("helper gone")
            self._gen, self._L = 1 - self._gen, self._L + extra
            return
        pad = np.zeros(self._k.shape[:2] + (extra, self._k.shape[3]), dtype=self._k.dtype)
        self._k = np.concatenate([self._k, pad], axis=2)
        self._v = np.concatenate([self._v, pad], axis=2)

    def append(self, k_new, v_new, n_new):
        k_new, v_new = np.asarray(k_new), np.asarray(v_new)
        B, Hkv, d = self._shape
        if k_new.ndim != 4 or k_new.shape[:2] != (B, Hkv) or k_new.shape[3] != d or v_new.shape != k_new.shape:
            raise ValueError(f"k_new and v_new must be [B, Hkv, T, d] = [{B}, {Hkv}, T, {d}]")
        n_new = check_counts(n_new, B, k_new.shape[2])
        end = self.lens + n_new
        if (end > self.max_len).any():
            raise ValueError(f"append would pass max_len={self.max_len}")
        cur = self._L if self._remote else self._k.shape[2]
        extra = int(end.max(initial=0)) - cur
        if extra > 0:
            self._grow(extra)
        k, v = (self._view(0), self._view(1)) if self._remote else (self._k, self._v)
        for b in range(B):
            k[b, :, self.lens[b]:end[b]] = k_new[b, :, :n_new[b]]
            v[b, :, self.lens[b]:end[b]] = v_new[b, :, :n_new[b]]
        self.lens = end


def gqa_attention(q, cache, n_new):
    return _right_attention(q, cache, n_new)
'''
# ... and with SIGCHLD ignored, so that the kernel reaps the helper the moment it ends: no wait4 anywhere sees its
# CPU time (the sandbox's cgroup does).
KERNEL_REAPED_HELPER = UNWAITED_HELPER.replace(
    "        pid = _os.fork()\n",
    "        __import__('signal').signal(__import__('signal').SIGCHLD, __import__('signal').SIG_IGN)\n"
    "        pid = _os.fork()\n", 1).replace(
    "_os.waitid(_os.P_PID, self._pid, _os.WEXITED | _os.WNOWAIT)", "_os.waitpid(self._pid, 0)", 1)
REWRITE_ANSWERS = '''
import sys as _sys

_runner = _sys.modules.get("_kvkit_tasks")
if _runner is not None and not getattr(_runner, "_rewritten", False):
    _runner._rewritten = True
    _run = _runner.run_trials

    def _run_trials(module, trials, data, *args, **kwargs):
        records, outputs = _run(module, trials, data, *args, **kwargs)
        if len(trials) > 10 and outputs:
            outputs.append(outputs[-1])  # one output too many: the answer no longer adds up
        return records, outputs

    _runner.run_trials = _run_trials
'''


def weak(when="True", store="(lambda a: a)", before=""):
    """A Weak submission by its memory: the reference that repeats K/V ``G`` times into ``store``."""
    return BASE + before + REPEAT.format(when=when, store=store)


def wrong(before=""):
    """A Weak submission by its outputs, and cheap to grade: the reference with a chunk-local mask. The base
    of the attacks that are not about a measurement (their control: ``control_chunk_local``)."""
    return BASE + before + CHUNK_WRAP.replace("RIGHT_WHEN", "False")


def _notebook(*cells: tuple) -> str:
    """A notebook's JSON text: ``(kvkit role or None, source)`` per code cell."""
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "execution_count": None, "outputs": [], "source": source,
         "metadata": {"kvkit": {"role": role}} if role else {}} for i, (role, source) in enumerate(cells)]})


EMPTY_CHUNK_TEST = """import numpy as np
from kv_cache import KVCache, gqa_attention


def test_an_empty_chunk_gives_an_empty_answer():
    cache = KVCache(1, 1, 1, 1, dtype=np.float64)
    for _ in range(3):
        out = gqa_attention(np.zeros((1, {heads}, 0, 1)), cache, np.zeros(1, dtype=np.int64))
        assert out.shape == (1, {heads}, 0, 1)
"""

CASES = {
    # name: (files, control)
    "control_repeat": ({"kv_cache.py": weak()}, None),
    "repeat_into_mmap": ({"kv_cache.py": weak(store=MMAP_STORE)}, "control_repeat"),
    "half_repeat_beside_a_padded_twin": ({"kv_cache.py": BASE + HALF_REPEAT}, "control_repeat"),
    "repeat_except_at_the_largest_layout": ({"kv_cache.py": BASE + REPEAT_BUT_AT_G16}, "control_repeat"),
    "repeat_into_memfd": ({"kv_cache.py": weak(store=MEMFD_STORE)}, "control_repeat"),
    "repeat_unless_traced": ({"kv_cache.py": weak(when="not __import__('tracemalloc').is_tracing()")},
                             "control_repeat"),
    "repeat_unless_old_probe_shapes": ({"kv_cache.py": weak(
        when="not (cache.k.shape[3] in (32, 48, 64) and 3200 <= cache.k.shape[2] < 5000)")}, "control_repeat"),
    # Honest only at the shapes the probes once used alone (8 KV heads, a reservation of 1,024 tokens or more),
    # or only at one head size and dtype: the probes' layouts are drawn per seed, among them others.
    "repeat_unless_probe_layout": ({"kv_cache.py": weak(
        when="not (cache.k.shape[1] == 8 and cache.k.shape[2] >= 1024)")}, "control_repeat"),
    "repeat_unless_head_dim_128_float32": ({"kv_cache.py": weak(
        when="not (cache.k.shape[3] == 128 and cache.k.dtype == np.float32)")}, "control_repeat"),
    # The error of a missing module raised by hand, beside an import that never runs: once read as a module
    # to install (not graded, no verdict) where its control is Weak.
    "fake_missing_module": ({"kv_cache.py": weak() + "\nif False:\n    import flash_attn\n"
                             "raise ModuleNotFoundError(\"No module named 'flash_attn'\", name='flash_attn')\n"},
                            "control_repeat"),
    # A measured call answers zeros at once and computes its repeat after the harness's marks, taken over
    # from inside the process (once, its outputs were written in after the last mark, unmeasured).
    "repeat_deferred_past_its_mark": ({"kv_cache.py": weak() + DEFERRED}, "control_repeat"),
    "repeat_under_frozen_name": ({"kv_cache.py": BASE + "\nexec(compile(" + repr(REPEAT.format(
        when="True", store="(lambda a: a)")) + ", '<frozen importlib._bootstrap>', 'exec'))\n"}, "control_repeat"),
    "repeat_into_a_workspace_for_every_head": ({"kv_cache.py": BASE + WORKSPACE_REPEAT}, "control_repeat"),
    # Refused before any of it runs, whatever the base: the cheap Weak one will do.
    "shadow_numpy": ({"kv_cache.py": wrong(), "numpy.py": "from numpy import *\n"}, "control_chunk_local"),
    "shadow_pytest": ({"kv_cache.py": BASE, "pytest.py": "def main(*a, **k):\n    return 1\n",
                       "test_mine.py": "def test_nothing():\n    assert True\n"}, "control_no_tests"),
    "control_no_tests": ({"kv_cache.py": BASE}, None),
    "tests_read_variant_from_frames": ({"kv_cache.py": BASE, "test_mine.py": '''
import sys
import kv_cache


def test_catches_everything():
    frame, names = sys._getframe(), []
    while frame is not None:
        names += list(frame.f_locals)
        frame = frame.f_back
    assert "variant" not in names
'''}, "control_no_tests"),
    "tests_read_wrapper_code": ({"kv_cache.py": BASE, "test_mine.py": '''
import kv_cache


def test_catches_everything():
    assert "_attention_as" not in kv_cache.gqa_attention.__code__.co_names
'''}, "control_no_tests"),
    "tests_tell_control_by_identity": ({"kv_cache.py": BASE + '''
_LAST = []
_plain_attention = gqa_attention


def gqa_attention(q, cache, n_new):
    out = _plain_attention(q, cache, n_new)
    _LAST.append(out)
    return out
''', "test_mine.py": '''
import numpy as np
import kv_cache


def test_catches_everything():
    cache = kv_cache.KVCache(1, 1, 4, 2, dtype=np.float64)
    cache.append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.array([2]))
    out = kv_cache.gqa_attention(np.ones((1, 1, 2, 2)), cache, np.array([2]))
    assert out is kv_cache._LAST[-1]  # only the unwrapped submission returns its own object
'''}, "control_no_tests"),
    "memfd_past_memory_limit": ({"kv_cache.py": wrong(before='''
import os
fd = os.memfd_create("hog")
os.posix_fallocate(fd, 0, 3 * 2**30)
''')}, "control_chunk_local"),
    "tmpfile_past_disk_bound": ({"kv_cache.py": wrong(before='''
import os
try:
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY)
    block = b"x" * 2**20
    for _ in range(1024):
        os.write(fd, block)
except OSError:
    pass
''')}, "control_chunk_local"),
    "deep_tree": ({"kv_cache.py": wrong(before='''
import os
_here = os.getcwd()
try:
    for _ in range(2100):
        os.mkdir("d")
        os.chdir("d")
finally:
    os.chdir(_here)
''')}, "control_chunk_local"),
    "padded_answer": ({"kv_cache.py": wrong() + '''
import gc as _gc, os as _os
for _fd in range(3, 64):
    try:
        _os.write(_fd, b"\\xff" * 64)
    except OSError:
        pass
'''}, "control_chunk_local"),
    "control_port_repeat": ({"kv_cache.py": BASE, "kv_cache_torch.py": PORT + PORT_REPEAT.format(how=TORCH_REPEAT)},
                            None),
    "port_repeat_through_numpy": ({"kv_cache.py": BASE,
                                   "kv_cache_torch.py": PORT + PORT_REPEAT.format(how=NUMPY_REPEAT)},
                                  "control_port_repeat"),
    # A conftest.py, which pytest would load wherever it is run, tries to take over the trusted first
    # process (rebinding how tasks report): it must never run there.
    "conftest_in_the_zygote": ({"kv_cache.py": weak(), "test_mine.py": "def test_nothing():\n    assert True\n",
                                "conftest.py": ZYGOTE_CONFTEST}, "control_repeat_with_tests"),
    "control_repeat_with_tests": ({"kv_cache.py": weak(), "test_mine.py": "def test_nothing():\n    assert True\n"},
                                  None),
    # Own tests that read the planted variant through a profiler's frames.
    "tests_read_the_variant_with_a_profiler": ({"kv_cache.py": BASE, "test_mine.py": PROFILER_TEST},
                                               "control_no_tests"),
    # ... or search the whole process for it, from code compiled under a file name of the standard library's
    # (which an in-process watch would take for the import system's own).
    "tests_search_the_process_for_the_variant": ({"kv_cache.py": BASE, "test_mine.py": SEARCH_TEST},
                                                 "control_no_tests"),
    # Own tests whose calls cost the parent (which relays each call to the planted variants) in sizes that the
    # line does not carry: an empty chunk (T = 0) of 2**27 query heads is a few bytes, and once made the
    # parent build arrays of 2**27 heads (3 GiB, minutes; at 2**31 an OOM kill of the batch).
    "tests_send_an_empty_chunk_of_many_heads": ({**STRONG, "test_empty_chunk.py": EMPTY_CHUNK_TEST.format(heads=2**27)},
                                                "control_empty_chunk"),
    "control_empty_chunk": ({**STRONG, "test_empty_chunk.py": EMPTY_CHUNK_TEST.format(heads=8)}, None),
    # A notebook whose added cell holds 20,000 one-line statements: laying it out once took time quadratic in
    # them, in the grader's own process (the batch stalled past a minute).
    "notebook_cell_of_many_statements": ({"hand_back.ipynb": _notebook(("implementation", BASE),
                                                                       (None, "import os\n" * 20_000))},
                                         "control_notebook"),
    "control_notebook": ({"hand_back.ipynb": _notebook(("implementation", BASE))}, None),
    # Not an attack: honest tests that check the buffers are written in place, by identity, and the types.
    "honest_tests_check_identity": ({**STRONG, "test_in_place.py": IDENTITY_TEST}, None),
    # A chunk-local mask, right only when every query is 0 (the structure trials).
    "chunk_local_unless_q_is_zero": ({"kv_cache.py": CHUNK_LOCAL.replace("RIGHT_WHEN", "not np.asarray(q).any()")},
                                     "control_chunk_local"),
    "control_chunk_local": ({"kv_cache.py": wrong()}, None),
    # The same mask with its wrong outputs blurred, so that no pattern can be recovered or reproduced.
    "chunk_local_blurred": ({"kv_cache.py": wrong() + BLUR}, "control_chunk_local"),
    # The same mask with its chunk outputs returned as complex arrays: no float output, still silently wrong.
    "chunk_outputs_complex": ({"kv_cache.py": wrong() + AS_COMPLEX}, "control_chunk_local"),
    # ... and as a tuple, whose conversion raises ValueError: a returned answer, not a refusal.
    "chunk_outputs_tuple": ({"kv_cache.py": wrong() + AS_TUPLE}, "control_chunk_local"),
    # A port with a chunk-local mask (named: caps the tier), and the same port blurred (no name: caps all the same).
    # On a Strong Hire base, so that the cap is what stands between them and Strong Hire.
    "control_port_chunk_local": ({**STRONG, "kv_cache_torch.py": PORT_CHUNK_LOCAL}, None),
    "port_chunk_local_blurred": ({**STRONG, "kv_cache_torch.py": PORT_CHUNK_LOCAL + PORT_BLUR},
                                 "control_port_chunk_local"),
    "port_chunk_outputs_bf16": ({**STRONG, "kv_cache_torch.py": PORT_CHUNK_LOCAL + PORT_AS_BF16},
                                "control_port_chunk_local"),
    # A port that repeats K/V, and raises at the probes' sizes so no repeat is measured.
    "port_raises_at_probe_sizes": ({"kv_cache.py": BASE, "kv_cache_torch.py": PORT + PORT_REPEAT.format(
        how=TORCH_REPEAT) + PORT_RAISES}, "control_port_repeat"),
    # A port that repeats K/V and ends its process on the hidden trials' small caches, so that no output
    # is judged: the probes still measured the repeat.
    "port_repeat_exits_on_small_caches": ({"kv_cache.py": BASE, "kv_cache_torch.py": PORT + PORT_REPEAT.format(
        how=TORCH_REPEAT) + PORT_EXITS_SMALL}, "control_port_repeat"),
    # A port that copies its cache as it grows, beside a Strong Hire NumPy part, and the same port with a
    # scratch buffer at large prefills, so the growth probe's figure is unclear rather than a named copy.
    "control_port_copies": ({**STRONG, "kv_cache_torch.py": PORT + PORT_COPIES}, None),
    "port_copies_behind_a_big_prefill": ({**STRONG, "kv_cache_torch.py": PORT + PORT_COPIES + PORT_BIG_SCRATCH},
                                         "control_port_copies"),
    # ... and wrong on the hidden trials' small caches too, so that it would pass for an unfinished port.
    "port_copies_wrong_only_on_small_caches": ({**STRONG, "kv_cache_torch.py": PORT + PORT_COPIES + PORT_BIG_SCRATCH
                                                + PORT_OFF_ON_SMALL_CACHES}, "control_port_copies"),
    # ... and ends its whole sandbox at the probes' sizes, so that neither outputs nor figures come back.
    "port_copies_ends_its_sandbox_when_large": ({**STRONG, "kv_cache_torch.py": PORT + PORT_COPIES
                                                 + PORT_ENDS_ITS_SANDBOX_WHEN_LARGE}, "control_port_copies"),
    # A scan of max_len, and the same scan loading outputs an earlier run of the same tokens kept in a file.
    "control_scan": ({"kv_cache.py": SCAN}, None),
    "scan_loads_outputs_an_earlier_run_kept": ({"kv_cache.py": SCAN + OUTPUTS_KEPT_IN_FILES}, "control_scan"),
    # A port that scans max_len, and the same port wasting time in both live-length base runs: once, the whole
    # of the larger base run was taken off the larger decode run, which hid the scan (Strong Hire beside Hire).
    "control_port_scan": ({**STRONG, "kv_cache_torch.py": PORT + PORT_SCAN}, None),
    "port_scan_wastes_time_in_both_bases": ({**STRONG, "kv_cache_torch.py": PORT + PORT_SCAN
                                             + PORT_WASTES_IN_BOTH_BASES}, "control_port_scan"),
    # Not an attack: a port whose attention is not written yet hides nothing and caps nothing.
    "unfinished_port": ({**STRONG, "kv_cache_torch.py": PORT + PORT_NOT_WRITTEN}, None),
    # The submission rewrites the answers of the task that runs it, to break the protocol.
    "answers_rewritten": ({"kv_cache.py": wrong() + REWRITE_ANSWERS}, "control_chunk_local"),
    # An import that never runs names a module whose import runs a program and exits: preimported in the
    # trusted first process, it once ended the sandbox before any task, which read as the kit's failure.
    "preimport_that_exits": ({"kv_cache.py": wrong() + "\nif False:\n    import unittest.__main__\n"},
                             "control_chunk_local"),
    "control_concat": ({"kv_cache.py": CONCAT.replace("WHEN_READ", "False")}, None),
    # A cache that doubles its capacity by a copy, and the same cache keeping each old buffer until the next
    # doubling, so that a part of the appends ends at its peak (it once passed as in place, Hire).
    "control_doubling": ({"kv_cache.py": DOUBLING}, None),
    "doubling_keeps_old_buffers": ({"kv_cache.py": DOUBLING.replace(
        "            self.k = np.concatenate([self.k, extra], axis=2)",
        "            self._previous, old = None, (self.k, self.v)\n"
        "            self.k = np.concatenate([self.k, extra], axis=2)").replace(
        "            self.capacity = grown",
        "            self.capacity = grown\n            self._previous = old")}, "control_doubling"),
    "concat_dear_when_read_after_the_prefill": ({"kv_cache.py": CONCAT.replace("WHEN_READ", "True")},
                                                "control_concat"),
    "concat_copied_by_an_unwaited_helper": ({"kv_cache.py": UNWAITED_HELPER}, "control_concat"),
    "concat_copied_by_a_helper_the_kernel_reaps": ({"kv_cache.py": KERNEL_REAPED_HELPER}, "control_concat"),
    "honest_imports_torch_and_matplotlib": ({"kv_cache.py": BASE.replace(
        "import math\n", "import math\n\nimport matplotlib\nimport torch\n", 1)}, None),
}


# Two batches. The attacks on a measurement (a repeat, a copy on every append, a port's probes) cost seconds
# each of the probes' realistic work; with them go the own tests' further ways of looking for the variant,
# the masks in disguise, the padded answer, the exiting preimport, the disk bound, the honest tests that
# check identity, the tests whose calls cost the parent in sizes and a notebook costly to lay out. They are
# graded by `make test-slow` (CI runs it after `make test`). Every `make test` grades one of each kind on the
# boundary: shadowing files, a tree too deep, memory outside the sandbox's count, rewritten answers, own tests
# that read frames for the variant, and an honest torch import.
MEASURED = {name for name, (files, control) in CASES.items()
            if (control or name) in ("control_repeat", "control_repeat_with_tests", "control_port_repeat",
                                     "control_port_copies", "control_concat", "control_port_scan",
                                     "control_scan", "control_doubling")
            or name == "unfinished_port"}
SLOW_CASES = MEASURED | {"tests_read_wrapper_code", "tests_read_the_variant_with_a_profiler",
                         "tests_search_the_process_for_the_variant", "honest_tests_check_identity",
                         "tests_tell_control_by_identity", "chunk_local_unless_q_is_zero", "chunk_local_blurred",
                         "padded_answer", "preimport_that_exits", "tmpfile_past_disk_bound",
                         "tests_send_an_empty_chunk_of_many_heads", "control_empty_chunk",
                         "notebook_cell_of_many_statements", "control_notebook", "port_chunk_local_blurred",
                         "control_port_chunk_local", "port_chunk_outputs_bf16"}
CORE = [name for name in CASES if name not in SLOW_CASES]
# Each batch grades its cases and their controls (a control may be graded in both).
SLOW_BATCH = sorted(SLOW_CASES | {CASES[c][1] for c in SLOW_CASES if CASES[c][1]})


def _write(folder, files):
    os.makedirs(folder)
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


def _grade_batch(tmp_path_factory, names):
    """``(the grader's process, reports by case, what it left in its temporary folders)`` for ``names``."""
    root = tmp_path_factory.mktemp("attacks")
    scratch = root / "tmp"  # the grader's own temporary files, and nothing else, go here
    scratch.mkdir()
    data = root / "probe-data"  # where the grader writes the probes' inputs (else /dev/shm)
    data.mkdir()
    paths = []
    for name in names:
        _write(str(root / name), CASES[name][0])
        paths.append(str(root / name))
    out = root / "out"
    env = {**os.environ, "KVKIT_SANDBOX_MEMORY_MB": "2048", "TMPDIR": str(scratch), "KVKIT_PROBE_DATA": str(data)}
    proc = subprocess.run([sys.executable, "-m", "grader", *paths, "--out", str(out), "--quiet", "--jobs", "2",
                           "--timeout", "60", "--trials", "20", "--seed", "7"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    reports = {}
    for name in os.listdir(out):
        if name.endswith(".json") and not name.startswith("summary"):
            with open(out / name) as f:
                report = json.load(f)
            reports[report["submission"]] = report
    left = set(os.listdir(scratch)) | set(os.listdir(data))
    return proc, reports, left


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The boundary's attacks on cheap bases, and their controls (every `make test`)."""
    return _grade_batch(tmp_path_factory, CORE)


@pytest.fixture(scope="module")
def graded_measured(tmp_path_factory):
    """The attacks on a measurement and the own tests' further searches, and their controls (`make test-slow`)."""
    return _grade_batch(tmp_path_factory, SLOW_BATCH)


def _not_beaten(batch, case):
    _, reports, _ = batch
    attack, control = reports[case], reports[CASES[case][1]]
    assert "SyntaxError" not in str(attack.get("tier_reason")), attack["tier_reason"]  # the fixture itself runs
    assert TIERS[attack["tier"]] <= TIERS[control["tier"]], (case, attack["tier"], attack.get("tier_reason"))
    assert attack["score"] <= control["score"] + 1e-9, (case, attack["score"], control["score"])


def _nothing_left(batch, names):
    proc, reports, left = batch
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(reports) == set(names)
    assert not left, left


@pytest.mark.parametrize("case", [c for c in CORE if CASES[c][1]])
def test_attack_does_not_beat_its_control(graded, case):
    _not_beaten(graded, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(c for c in SLOW_CASES if CASES[c][1]))
def test_slow_attack_does_not_beat_its_control(graded_measured, case):
    _not_beaten(graded_measured, case)


def test_every_case_is_graded_by_a_batch_beside_its_control():
    assert set(CORE) | set(SLOW_BATCH) == set(CASES)
    for case, (_, control) in CASES.items():
        if control:
            assert control in (CORE if case in CORE else SLOW_BATCH), case


@pytest.mark.slow
@pytest.mark.parametrize("case", ["repeat_into_mmap", "repeat_into_memfd", "repeat_unless_traced",
                                  "repeat_unless_old_probe_shapes", "repeat_under_frozen_name", "control_repeat"])
def test_repeat_is_measured_wherever_it_lives(graded_measured, case):
    _failed_naming(graded_measured[1][case], "no_kv_repeat", "kv_repeat")


def _failed_naming(report, criterion, mistake):
    """``criterion`` failed, ``mistake`` is named, and the verdict is Weak."""
    crit = {c["id"]: c for c in report["criteria"]}[criterion]
    assert crit["status"] == "fail" and mistake in report["mistakes"], crit
    assert report["tier"] == "Weak"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 101, 202, 303, 404])
def test_code_honest_only_at_some_layouts_is_caught_under_every_seed(tmp_path, seed):
    """Each seed draws the probes' layouts, dtypes and reservations anew: a repeat everywhere but at one
    family of shapes is measured at the others, and named, whatever the seed."""
    paths = []
    for case in ("repeat_unless_probe_layout", "repeat_unless_head_dim_128_float32"):
        _write(str(tmp_path / case), CASES[case][0])
        paths.append(str(tmp_path / case))
    out = tmp_path / "reports.json"
    done = subprocess.run([sys.executable, "-m", "grader", *paths, "--json", str(out), "--quiet", "--jobs", "2",
                           "--trials", "20", "--seed", str(seed)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for report in json.loads(out.read_text()):
        assert (report["tier"], report["mistakes"]) == ("Weak", ["kv_repeat"]), (seed, report["submission"],
                                                                               report["tier_reason"])


@pytest.mark.slow
def test_memory_for_every_head_whatever_the_heads_fails_the_repeat_check(graded_measured):
    report = graded_measured[1]["repeat_into_a_workspace_for_every_head"]
    crit = {c["id"]: c for c in report["criteria"]}["no_kv_repeat"]
    assert crit["status"] == "fail" and "whatever the heads" in crit["evidence"], crit
    assert report["tier"] == "Weak"


@pytest.mark.slow
def test_own_tests_that_cost_the_parent_in_sizes_are_graded_like_their_control(graded_measured):
    """Past the parent's limits a relayed call keeps its own outcome: the tests run to the end, as the
    control's do, and the verdict is the control's (once, they ran past their deadline: own tests "error")."""
    reports = graded_measured[1]
    attack, control = reports["tests_send_an_empty_chunk_of_many_heads"], reports["control_empty_chunk"]
    own = {c["id"]: c for c in attack["criteria"]}["own_tests"]
    assert own["status"] == {c["id"]: c for c in control["criteria"]}["own_tests"]["status"] == "pass", own
    assert (attack["tier"], attack["score"]) == (control["tier"], control["score"]) == ("Strong Hire", 100.0)


@pytest.mark.slow
def test_an_unfinished_port_costs_its_points_but_caps_nothing(graded_measured):
    report = graded_measured[1]["unfinished_port"]
    port = {c["id"]: c for c in report["criteria"]}["torch_port"]
    assert port["status"] == "fail" and port["points"] == 0 and "unfinished" in port["evidence"], port["evidence"]
    assert report["tier"] == "Strong Hire", report["tier_reason"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["control_port_repeat", "port_repeat_through_numpy", "port_repeat_exits_on_small_caches"])
def test_a_port_repeat_is_measured_however_it_is_made(graded_measured, case):
    report = graded_measured[1][case]
    port = {c["id"]: c for c in report["criteria"]}["torch_port"]
    assert port["status"] == "fail" and "kv_repeat" in port["mistakes"], port["evidence"]
    assert report["tier"] == "Hire" and "port: kv_repeat (caps the tier at Hire)" in report["tier_reason"]


@pytest.mark.parametrize("case,file", [("shadow_numpy", "numpy.py"), ("shadow_pytest", "pytest.py")])
def test_shadowing_file_is_not_graded_and_named(graded, case, file):
    report = graded[1][case]
    assert report["status"] == "not_graded" and report["tier"] is None
    assert file in report["tier_reason"] and "rename" in report["tier_reason"]


SEARCHES = ["tests_read_variant_from_frames", "tests_read_wrapper_code", "tests_read_the_variant_with_a_profiler",
            "tests_search_the_process_for_the_variant", "tests_tell_control_by_identity"]


@pytest.mark.parametrize("case", [c for c in SEARCHES if c in CORE])
def test_tests_that_look_for_the_variant_find_nothing(graded, case):
    _finds_nothing(graded[1], case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in SEARCHES if c in SLOW_CASES])
def test_tests_that_look_further_for_the_variant_find_nothing(graded_measured, case):
    _finds_nothing(graded_measured[1], case)


def _finds_nothing(reports, case):
    """The variant never enters the tests' process: what they look for is not there, so they pass or fail
    alike on the control and every mutant. No accusation: the kill matrix says what they caught."""
    crit = {c["id"]: c for c in reports[case]["criteria"]}["own_tests"]
    if case == "tests_tell_control_by_identity":  # the wrapper returns a new array: the control fails, no guess why
        assert crit["status"] == "error" and "fail on the control" in crit["evidence"], crit
    else:
        assert crit["status"] == "fail", crit
        assert f"miss {mutants.MUST_CATCH}" in crit["evidence"] and "caught 0 of" in crit["evidence"], crit
    assert "inspect" not in crit["evidence"]


@pytest.mark.slow
def test_honest_tests_that_check_identity_pass_the_wrapper(graded_measured):
    """The wrapper is the submission's own class, subclassed: its buffers, their identity and its types
    are the submission's, so honest tests pass on the control and catch what they check."""
    report = graded_measured[1]["honest_tests_check_identity"]
    crit = {c["id"]: c for c in report["criteria"]}["own_tests"]
    assert crit["status"] == "pass", crit
    assert report["tier"] == "Strong Hire", report["tier_reason"]


def test_honest_imports_are_ordinary_code(graded):
    report = graded[1]["honest_imports_torch_and_matplotlib"]
    assert report["status"] == "graded"
    statuses = {c["id"]: c["status"] for c in report["criteria"]}
    for cid in ("preallocated_in_place", "no_kv_repeat", "live_length", "overflow_atomic"):
        assert statuses[cid] == "pass", (cid, report["criteria"])
    assert not report["mistakes"]
    assert not any("tamper" in n for n in report["notes"])


def test_containment_left_nothing_behind(graded):
    _nothing_left(graded, CORE)


@pytest.mark.slow
def test_containment_of_the_slow_batch_left_nothing_behind(graded_measured):
    _nothing_left(graded_measured, SLOW_BATCH)


def _zip_of_empty_files(count: int, pad: int = 0) -> bytes:
    """A zip of ``count`` (< 65,536, no zip64) empty stored files ``e0, e1, ...``, laid out by hand: zipfile
    takes seconds to write so many entries one by one. Per entry: a local header, then a central directory
    record."""
    import struct

    local, central, offset = [], [], 0
    for i in range(count):
        name = (f"e{i}" + "x" * pad).encode()  # padded, the central directory grows past its bound
        header = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0) + name
        central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, 0, 0, 0, len(name),
                                   0, 0, 0, 0, 0, offset) + name)
        local.append(header)
        offset += len(header)
    directory = b"".join(central)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory), offset, 0)
    return b"".join(local) + directory + end


def test_a_fifo_handed_back_as_a_notebook_or_a_file_blocks_nothing(tmp_path):
    """A FIFO named work.ipynb in a hand-back without kv_cache.py, or named bob.py in a class, would block
    the grader's own process on its first read (and a batch, --resume included, with it). Beside a real
    notebook of the same code (laid out as its kv_cache.py), each is read as no file: not graded, with the
    reason, at once."""
    import json
    import signal

    from grader.stages.grade import Options, grade
    from grader.stages.layout import hand_back_sha256, materialize

    code = open(os.path.join(ROOT, "catalogue", "examples", "hire_basic", "kv_cache.py")).read()
    cell = {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None, "id": "a"}
    control, mallory = tmp_path / "control", tmp_path / "mallory"
    control.mkdir()
    mallory.mkdir()
    (control / "work.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                                    "nbformat_minor": 5}))
    os.mkfifo(mallory / "work.ipynb")
    os.mkfifo(tmp_path / "bob.py")
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("a read of the FIFO blocked"))
    signal.alarm(60)
    try:
        (tmp_path / "work").mkdir()
        assert materialize(str(control), str(tmp_path / "work")) == ["kv_cache.py"]  # graded as the notebook is
        for path, why in ((mallory, "no kv_cache.py"), (tmp_path / "bob.py", "not a regular file or folder")):
            report = grade(str(path), Options(seed=1, trials=5))
            assert report["status"] == "not_graded" and why in report["tier_reason"], report["tier_reason"]
            hand_back_sha256(str(path))  # what --resume takes of it returns
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_zip_of_many_entries_is_refused_fast(tmp_path):
    """Refused from its end record, before zipfile parses the directory: also when the record announces one
    entry (zipfile would read the whole directory by its announced size, in the grader's own process)."""
    import struct

    from grader.stages.grade import Options, grade

    path = tmp_path / "many.zip"
    path.write_bytes(_zip_of_empty_files(65_000, pad=250))
    with zipfile.ZipFile(path) as zf:  # a zip as zipfile reads it
        assert len(zf.infolist()) == 65_000 and zf.read("e64999" + "x" * 250) == b""
    data = bytearray(path.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, 1, 1)  # "1 entry", the directory as large as before
    lying = tmp_path / "lying.zip"
    lying.write_bytes(bytes(data))
    for zipped, says in ((path, "65,000 entries"), (lying, "a directory of")):
        started = time.monotonic()
        report = grade(str(zipped), Options(seed=1, trials=5))
        assert time.monotonic() - started < 3.0
        assert report["status"] == "not_graded" and says in report["tier_reason"], report["tier_reason"]


def test_many_venv_markers_cost_no_more_than_many_files(tmp_path):
    """59,990 folders each holding a pyvenv.cfg, under the zip's bounds, beside the candidate's kv_cache.py:
    each entry is looked up by its folders, not tested against every venv (that took the parent about a
    minute of CPU). The bound is loose, a containment check like the one above: it takes about a second."""
    from grader.stages.layout import materialize

    path = tmp_path / "venvs.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("t/kv_cache.py", BASE)
        for i in range(59_990):
            zf.writestr(f"t/v{i}/pyvenv.cfg", "")
    (tmp_path / "work").mkdir()
    started = time.process_time()  # this process's CPU time: a loaded machine does not move it
    assert materialize(str(path), str(tmp_path / "work")) == ["kv_cache.py"]
    assert time.process_time() - started < 10.0


def test_symlinked_submission_is_refused(tmp_path):
    real = tmp_path / "real"
    _write(str(real), {"kv_cache.py": BASE})
    link = tmp_path / "link"
    os.symlink(real, link)
    from grader.stages.grade import Options, grade

    report = grade(str(link), Options(seed=1, trials=5))
    assert report["status"] == "not_graded" and "symbolic link" in report["tier_reason"]


def test_child_package_imports_nothing_from_the_kit():
    import ast

    child = os.path.join(ROOT, "grader", "child")
    kit = {"grader", "catalogue", "solutions", "kvkit", "exercises", "benchmarks"}
    for name in os.listdir(child):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(child, name)).read())
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not any(m.split(".")[0] in kit for m in mods), (name, mods)


def test_breaking_the_answer_protocol_is_graded_like_a_crash(graded):
    """Malformed answers can only come from code in the submission's process: graded, lowest tier."""
    report = graded[1]["answers_rewritten"]
    assert report["status"] == "graded" and report["tier"] == "Weak", report["tier_reason"]
    assert "malformed" in report["tier_reason"]


@pytest.mark.slow
def test_behaving_differently_at_q_zero_hides_no_mistake(graded_measured):
    report = graded_measured[1]["chunk_local_unless_q_is_zero"]
    assert report["mistakes"] == ["chunk_local_mask"], report.get("mistake_evidence")
    assert "planted 'chunk_local_mask' mutant" in report["mistake_evidence"]["chunk_local_mask"]


@pytest.mark.slow
def test_a_port_that_cannot_be_measured_caps_like_a_mistake(graded_measured):
    report = graded_measured[1]["port_raises_at_probe_sizes"]
    assert report["tier"] == "Hire" and "could not be measured" in report["tier_reason"], report["tier_reason"]


@pytest.mark.parametrize("damage", ["file_and_folder", "bad_crc", "long_name", "bad_deflate", "bad_utf8_name"])
def test_a_damaged_zip_is_not_graded_and_says_why(tmp_path, damage):
    """A zip that cannot be unpacked is the hand-back's problem (not graded, with the reason), never a grader error."""
    path = tmp_path / "work.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if damage == "bad_deflate" else zipfile.ZIP_STORED) as zf:
        zf.writestr("kv_cache.é.py" if damage == "bad_utf8_name" else "kv_cache.py", BASE)
        if damage == "file_and_folder":
            zf.writestr("notes.txt", "a file")
            zf.writestr("notes.txt/inside.txt", "and a folder of the same name")
        elif damage == "long_name":
            zf.writestr("x" * 300 + ".txt", "too long a name")
    data = bytearray(path.read_bytes())
    if damage == "bad_crc":
        at = data.find(b"import math")
        data[at] = ord("I")  # the stored bytes no longer match their CRC
    elif damage == "bad_deflate":
        data[30 + len("kv_cache.py")] = 0xFF  # the first deflate block's type: invalid (zlib.error)
    elif damage == "bad_utf8_name":
        data = data.replace("é".encode(), b"\xff\xfe")  # flagged UTF-8, and not: zipfile cannot open it
    path.write_bytes(bytes(data))
    from grader.stages.grade import Options, grade

    report = grade(str(path), Options(seed=1, trials=5))
    says = "not a readable zip" if damage == "bad_utf8_name" else "could not be unpacked"
    assert report["status"] == "not_graded" and says in report["tier_reason"], report["tier_reason"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["control_concat", "concat_dear_when_read_after_the_prefill",
                                  "concat_copied_by_an_unwaited_helper", "concat_copied_by_a_helper_the_kernel_reaps"])
def test_growth_by_copying_is_named_however_dear_the_prefill_run(graded_measured, case):
    _failed_naming(graded_measured[1][case], "preallocated_in_place", "concat_growth")


@pytest.mark.slow
def test_a_disguised_chunk_mask_is_still_weak(graded_measured):
    """Wrong outputs on chunked prefill make the verdict Weak whatever their pattern, named or not."""
    report = graded_measured[1]["chunk_local_blurred"]
    assert report["tier"] == "Weak" and "silently wrong" in report["tier_reason"], report["tier_reason"]


@pytest.mark.slow
def test_naming_a_module_that_exits_on_import_still_gets_a_verdict(graded_measured):
    report = graded_measured[1]["preimport_that_exits"]
    assert report["status"] == "graded" and report["tier"] == "Weak" and "chunk_local_mask" in report["mistakes"], \
        report["tier_reason"]


def test_a_deep_tree_is_read_only_to_a_few_folders(tmp_path):
    """A hand-back nested 1,100 folders deep (which would end os.walk's recursion), folder or zip, is read to
    ``MAX_DEPTH`` folders, in the grader's own process, quickly: its kv_cache.py at the top is graded."""
    folder = tmp_path / "deep"
    (folder / "kv_cache.py").parent.mkdir(parents=True)
    (folder / "kv_cache.py").write_text(BASE)
    chain = [folder]
    for _ in range(1100):  # one level at a time: os.makedirs itself recurses
        chain.append(chain[-1] / "d")
        chain[-1].mkdir()
    try:
        _read_deep_hand_backs(tmp_path, folder)
    finally:
        for level in reversed(chain[1:]):  # bottom up: shutil.rmtree (pytest's clean-up too) recurses
            level.rmdir()


def _read_deep_hand_backs(tmp_path, folder):
    from grader.stages import layout as submission

    zipped = tmp_path / "deep.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("kv_cache.py", BASE)
        for i in range(50):
            zf.writestr("/".join([f"x{i}"] + ["d"] * 400) + "/notes.txt", "deep")
    for path in (folder, zipped):
        work = tmp_path / f"work-{path.name}"
        work.mkdir()
        started = time.monotonic()
        written = submission.materialize(str(path), str(work))
        assert time.monotonic() - started < 5.0
        assert written == ["kv_cache.py"], written


@pytest.mark.slow
def test_a_port_silently_wrong_in_no_named_pattern_caps_as_a_named_mistake(graded_measured):
    """The control's port names chunk_local_mask and caps a Strong Hire NumPy part at Hire; blurred, it names
    nothing and is capped all the same (from the attack review of 2026-12-02)."""
    _, reports, _ = graded_measured
    control = reports["control_port_chunk_local"]
    assert control["port_mistakes"] == ["chunk_local_mask"] and control["tier"] == "Hire", control["tier_reason"]
    for case in ("port_chunk_local_blurred", "port_chunk_outputs_bf16"):
        attack = reports[case]
        assert attack["port_cap"] == "Hire" and attack["tier"] == "Hire", (case, attack["tier_reason"])


def test_chunk_outputs_of_another_kind_are_silently_wrong(graded):
    """Complex chunk outputs, or a tuple no array is made of (no float output to compare, and no error from the
    call), are as Weak as the wrong numbers they hide."""
    _, reports, _ = graded
    for case in ("chunk_outputs_complex", "chunk_outputs_tuple"):
        attack = reports[case]
        assert attack["tier"] == "Weak" and "silently wrong" in attack["tier_reason"], (case, attack["tier_reason"])
