"""Step 6: the PyTorch port (kv_cache_torch.py), on CUDA when there is one, else on the CPU.

The same checks as steps 1-4 over torch tensors, plus a watch on the ops your
code runs (a TorchDispatchMode): ``append`` must not grow or rebuild the
buffers (no aten.cat/aten.stack, no new tensor the size of the cache), and
``gqa_attention`` must not copy K or V out to the query heads (no op returning
G times the live K, no repeat/repeat_interleave of them).
"""
import numpy as np
import pytest

import adapters
import stepkit as kit
from stepkit import case, fail, fmt

STEP = 6


def torch_module():
    try:
        import torch
    except ImportError:
        fail("torch is not installed, and the PyTorch port needs it (pip install torch). "
             "In a take-home the port is optional: hand in without kv_cache_torch.py if you skip it.")
    return torch


def device():
    torch = torch_module()
    return "cuda" if torch.cuda.is_available() else "cpu"


class TorchBackend(kit.Backend):
    """Torch tensors on ``device`` in and out, float64 unless a test says otherwise."""

    def __init__(self, module, dev):
        import torch
        super().__init__(module)
        self.torch, self.device = torch, dev
        self.f32, self.f64 = torch.float32, torch.float64
        self.name = f"PyTorch on {dev}"

    def cache(self, B, Hkv, max_len, d, dtype=None):
        return self.mod.KVCache(B, Hkv, max_len, d, dtype=self.f64 if dtype is None else dtype, device=self.device)

    def array(self, a, dtype=None):
        return self.torch.as_tensor(np.asarray(a), dtype=self.f64 if dtype is None else dtype, device=self.device)

    def counts(self, n):
        return self.torch.as_tensor(np.asarray(n, dtype=np.int64), device=self.device)

    def numpy(self, x):
        if isinstance(x, self.torch.Tensor):
            return x.detach().to("cpu", self.torch.float64).numpy()
        return np.asarray(x, dtype=np.float64)

    def lens(self, cache):
        return [int(x) for x in self.torch.as_tensor(cache.lens).reshape(-1).tolist()]

    def is_array(self, x):
        return isinstance(x, self.torch.Tensor)

    def write(self, buf, b, lo, hi, values):
        buf[b, :, lo:hi] = values

    def snapshot(self, buf):
        return buf.detach().clone()

    def same_buffer(self, before, after):
        return after is before and after.data_ptr() == before.data_ptr()


def backend():
    torch_module()
    return TorchBackend(adapters.kv_cache_torch(STEP), device())


def watch_append(be, cache_numel):
    """A context-manager factory for run_appends: fail on cat/stack or a cache-sized new tensor."""
    import contextlib

    from opwatch import OpWatch, trail

    @contextlib.contextmanager
    def watching(setup):
        with OpWatch() as w:
            yield
        for i, op in enumerate(w.ops):
            if op.packet in ("aten.cat", "aten.stack"):
                fail(f"{setup}: append ran {op.name}, which builds a new tensor of {op.numel:,} elements: the cache "
                     f"grew by concatenation instead of being written in place (concat_growth). "
                     f"Ops: {trail(w.ops, i)}.")
            if not op.aliases and op.numel >= cache_numel:
                fail(f"{setup}: append ran {op.name}, which returned a new tensor of {op.numel:,} elements, as big "
                     f"as the whole K buffer ({cache_numel:,}): append rebuilds or copies the cache instead of "
                     f"writing the new tokens into it (concat_growth). Ops: {trail(w.ops, i)}.")

    return watching


def test_cache_lives_on_the_device():
    be = backend()
    torch = be.torch
    for args, dtype in (((2, 3, 8, 4), None), ((1, 1, 5, 2), torch.float64)):
        B, Hkv, max_len, d = args
        call = f"KVCache({', '.join(map(str, args))}{'' if dtype is None else ', dtype=torch.float64'}, device={be.device!r})"
        with case(call):
            cache = be.mod.KVCache(*args, device=be.device) if dtype is None else be.mod.KVCache(
                *args, dtype=dtype, device=be.device)
        want = torch.float32 if dtype is None else dtype
        for name in ("k", "v"):
            buf = getattr(cache, name, None)
            if not isinstance(buf, torch.Tensor):
                fail(f"{call}: cache.{name} is {type(buf).__name__}; it should be a torch tensor.")
            if tuple(buf.shape) != (B, Hkv, max_len, d) or buf.dtype != want or buf.device.type != be.device:
                fail(f"{call}: cache.{name} is a tensor of shape {list(buf.shape)}, dtype {buf.dtype}, on "
                     f"{buf.device}; it should be {[B, Hkv, max_len, d]}, {want}, on {be.device}.")
        lens = getattr(cache, "lens", None)
        if not isinstance(lens, torch.Tensor) or lens.dtype != torch.int64 or tuple(lens.shape) != (B,) \
                or lens.device.type != be.device:
            got = type(lens).__name__ + (f" of dtype {lens.dtype}, shape {list(lens.shape)}, on {lens.device}"
                                         if isinstance(lens, torch.Tensor) else "")
            fail(f"{call}: cache.lens is {got}; it should be an int64 tensor of shape [B]=({B},) on {be.device}.")
        if bool((lens != 0).any()):
            fail(f"{call}: cache.lens is {fmt(lens)}; a new cache holds no tokens.")
    with case("KVCache(1, 1, 4, 2) with no device"):
        cache = be.mod.KVCache(1, 1, 4, 2)
    if cache.k.device.type != "cpu":
        fail(f"KVCache(1, 1, 4, 2) with no device put cache.k on {cache.k.device}; the default is the CPU.")


def test_append_writes_in_place():
    be = backend()
    B, Hkv, max_len, d = 2, 2, 8, 3
    kit.run_appends(be, f"appends ({be.name})", B=B, Hkv=Hkv, d=d, max_len=max_len,
                    calls=[([3, 1], 3), ([1, 2], 2), ([0, 3], 4), ([0, 0], 2)],
                    watch=watch_append(be, B * Hkv * max_len * d))


def test_overflow_raises_and_changes_nothing():
    be = backend()
    kit.run_overflow(be, f"overflow ({be.name})")


def test_bad_input_is_refused_with_a_clear_error():
    be = backend()
    kit.run_bad_appends(be, f"bad input to append ({be.name})")
    kit.run_bad_attention(be, f"bad input to gqa_attention ({be.name})")


@pytest.mark.parametrize("Hkv,G", [(1, 4), (4, 1), (2, 4), (8, 4)])
def test_query_head_h_reads_kv_head_h_div_g(Hkv, G):
    be = backend()
    kit.run_heads(be, f"head mapping ({be.name})", Hkv=Hkv, G=G, T=3, d=4)
    kit.run_heads(be, f"head mapping in float32 ({be.name})", Hkv=Hkv, G=G, T=3, d=4, dtype=be.f32)


def test_scores_are_scaled_by_one_over_sqrt_d():
    be = backend()
    kit.run_scale(be, f"the score scale ({be.name})")
    kit.run_large_scores(be, f"large scores ({be.name})", be.f32)


def test_bottom_right_causal_mask():
    be = backend()
    kit.run_windows(be, f"decode ({be.name})", Hkv=1, G=2, calls=[([5], 5), ([1], 1), ([1], 1)], check={1, 2})
    kit.run_windows(be, f"full prefill ({be.name})", Hkv=1, G=2, calls=[([6], 6)])
    kit.run_windows(be, f"chunked prefill ({be.name})", Hkv=2, G=3, calls=[([4], 4), ([3], 3), ([2], 2)],
                    check={1, 2})


def test_ragged_rows_and_padding():
    be = backend()
    kit.run_windows(be, f"ragged rows with padding ({be.name})", Hkv=2, G=2,
                    calls=[([2, 5, 0], 5), ([3, 1, 2], 3), ([0, 1, 1], 2)], poison=True)
    kit.run_padding_random(be, f"random inputs with padding ({be.name})")
    kit.run_empty(be, f"nothing to attend ({be.name})")


@pytest.mark.parametrize("T,n_new", [(1, [1, 1]), (3, [3, 2])], ids=["decode", "chunk"])
def test_attention_never_copies_k_or_v_per_query_head(T, n_new):
    from opwatch import OpWatch, trail

    be = backend()
    torch = be.torch
    B, Hkv, G, d = 2, 2, 4, 16
    Hq = Hkv * G
    rng = np.random.default_rng(11)
    with case("setting up"):
        cache = be.cache(B, Hkv, 64, d, be.f32)
        prefill = [20 - n_new[0], 13 - n_new[1]]
        kv = rng.standard_normal((B, Hkv, 20, d))
        cache.append(be.array(kv, be.f32), be.array(kv, be.f32), be.counts(prefill))
        cache.append(be.array(kv[:, :, :T], be.f32), be.array(kv[:, :, :T], be.f32), be.counts(n_new))
    lens = be.lens(cache)
    S = max(lens)
    live_k = B * Hkv * S * d
    setup = (f"gqa_attention watched op by op ({be.name}, float32, B={B}, Hkv={Hkv}, G={G}, Hq={Hq}, d={d}, "
             f"T={T}, n_new={fmt(n_new)}, lens={fmt(lens)}, max_len=64; live K = B*Hkv*S*d = {live_k:,} elements)")
    q = be.array(rng.standard_normal((B, Hq, T, d)), be.f32)
    buffers = {cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr()}
    with case(setup):
        with OpWatch() as w:
            out = be.attention(q, cache, be.counts(n_new))
    kit.check_output_type(be, setup, out, (B, Hq, T, d), be.f32)
    for i, op in enumerate(w.ops):
        if op.packet in ("aten.repeat", "aten.repeat_interleave") and op.inputs & buffers:
            fail(f"{setup}: it ran {op.name} on K or V: each KV head was copied out to its query heads (kv_repeat). "
                 f"Ops: {trail(w.ops, i)}.")
        if op.packet in ("aten.cat", "aten.stack") and op.numel >= live_k:
            fail(f"{setup}: it ran {op.name} returning {op.numel:,} elements, as big as the live K: K or V was "
                 f"copied. Ops: {trail(w.ops, i)}.")
        if not op.aliases and op.numel >= G * live_k:
            fail(f"{setup}: it ran {op.name}, which returned a new tensor of {op.numel:,} elements, G={G} times "
                 f"the live K or more: K or V was copied out to every query head (kv_repeat), here by the ops "
                 f"{trail(w.ops, i)}. A broadcast that torch.matmul cannot do by strides becomes an expand and a "
                 f"copy; so do repeat, repeat_interleave and expand(...).contiguous().")
