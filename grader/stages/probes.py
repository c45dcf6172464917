"""The structural probes: calls at realistic sizes whose cost the kernel measures from outside the submission.

Each probe is a trial like the hidden ones, run in a process of its own, with
*marks* between its calls (``grader.child.tasks.mark``): at each mark the parent
takes the kernel's figures (CPU seconds, memory in use, the highest use since
the mark before) and starts a new peak period, so every figure is about one
part of the run. The first mark follows the import: nothing the submission's
module runs at import counts. A measured attention gets its query only at the
mark before it (``"q": "go"``) and must send its output with the mark after
it, so its work lies between the two whatever the process does.

The layouts are drawn per seed from real checkpoints (``CHECKPOINTS``), with
dtypes, lengths and reservations drawn too, each layout beside its twin at
G = 1 where a repeat is judged, so that no test on the shapes a cache is handed
tells a measured call from another realistic one. What was drawn goes into the
report (``describe``). Three purposes:

* ``memory``: per layout, one row filled to a few thousand tokens, a decode
  step and a chunk of a few tokens (chunked prefill); each attention call is a
  part of its own, so a repeat shows in whichever path makes it
  (``criteria.no_repeat``);
* ``grow``: a prefill of half the tokens, then one-token appends to the end
  (their order given at the prefill's mark), a mark every 1/32 of the tokens,
  and one decode at G = 1 that reads them all: a stretch in which the cache is
  reallocated and copied holds the old and the new buffer at once, and a copy
  on every append costs a copy's CPU time (``criteria.in_place``);
* ``scan``: the same decode steps in a reservation a little above the live
  length and in one 8 to 11 times larger, each twice; the steps from the
  second on are one part, so what making the cache costs (a ``max_len``^2 mask
  table) counts in neither (``criteria.live_length``).

The bounds these figures are judged by are in ``catalogue.rules`` (``BOUNDS``); how they were
measured is in docs/measurement.md.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

MIB = 2**20

# (name, Hq, Hkv, head_dim): the attention layouts of released checkpoints, from each model's config.json
# (num_attention_heads, num_key_value_heads, hidden_size / num_attention_heads). G = Hq / Hkv runs from 4 to 16.
CHECKPOINTS = [
    ("Llama 3.1 8B", 32, 8, 128), ("Llama 3.1 70B", 64, 8, 128), ("Llama 3.1 405B", 128, 8, 128),
    ("Llama 3.2 3B", 24, 8, 128), ("Llama 3.2 1B", 32, 8, 64), ("Falcon 40B", 128, 8, 64),
    ("Qwen2.5 7B", 28, 4, 128), ("TinyLlama 1.1B", 32, 4, 64),
    ("Qwen2.5 3B", 16, 2, 128), ("Qwen2.5 1.5B", 12, 2, 128), ("Qwen2.5 0.5B", 14, 2, 64),
    ("SantaCoder 1.1B", 16, 1, 128),
]
DTYPES = ("float32", "float64")
ITEM = {"float32": 4, "float64": 8}


@dataclass
class Probe:
    """One probe task: its configuration (what the child gets, less the queries) and what the parent keeps.

    ``config`` holds ``purpose``, ``layout`` (a checkpoint's name, or its twin's), ``Hkv``, ``G``, ``d``,
    ``dtype``, ``seed`` and the purpose's sizes; ``live_bytes`` is the K/V the measured row holds at its
    measured calls (bytes).
    """

    name: str
    purpose: str  # "memory", "grow", "scan"
    config: dict
    live_bytes: int
    twin_of: str = ""  # a memory probe at G = 1: the name of the layout it stands beside

    @property
    def input_bytes(self) -> int:
        """Bytes of the mapped inputs of the measured row (a peak-RSS figure counts them; a cgroup's does not)."""
        return self.live_bytes


@dataclass
class Built:
    """A probe laid out: its trials for the child, what its marks hand over, the outputs they must send.

    Marks are counted as the task makes them: 0 follows the import, 1 .. len(marks) are the trials' own
    (``marks[i - 1]`` is what mark i's go carries), the last follows the last call. ``expect`` maps a mark's
    number to the output (float64, flat) it must send: the measured calls' since the mark before.
    """

    trials: list
    marks: list = field(default_factory=list)
    expect: dict = field(default_factory=dict)


def _tokens(target_bytes: float, Hkv: int, d: int, dtype: str, low: int, high: int) -> int:
    return int(min(max(target_bytes / (2 * Hkv * d * ITEM[dtype]), low), high))


def probes(seed: int) -> list[Probe]:
    """The probe tasks of ``seed``: layouts, dtypes, lengths and reservations drawn from ``CHECKPOINTS``."""
    rng = np.random.default_rng([seed, 21])
    out = []
    # Memory: three layouts of three different KV-head counts, each beside its twin at G = 1; among them both
    # dtypes and both head sizes, so that code honest at one dtype or head size only is measured elsewhere too.
    counts = sorted({hkv for _, _, hkv, _ in CHECKPOINTS})
    drawn = [CHECKPOINTS[int(rng.choice([i for i, c in enumerate(CHECKPOINTS) if c[2] == Hkv]))]
             for Hkv in rng.choice(counts, size=3, replace=False)]
    if all(d == 128 for *_, d in drawn):  # one of them at d = 64, of the same KV-head count
        j = next(j for j, c in enumerate(drawn) if any(o[2] == c[2] and o[3] == 64 for o in CHECKPOINTS))
        drawn[j] = next(o for o in CHECKPOINTS if o[2] == drawn[j][2] and o[3] == 64)
    dtypes = [DTYPES[0], DTYPES[1], DTYPES[int(rng.integers(2))]]
    rng.shuffle(dtypes)
    for (name, Hq, Hkv, d), dtype in zip(drawn, dtypes):
        live = _tokens(rng.uniform(8, 16) * MIB, Hkv, d, dtype, 1024, 4096)
        chunk = max(2, d // 32)  # few queries beside d: their scores stay small beside the K/V they read
        max_len = int((live + chunk) * rng.uniform(1.02, 1.5)) + 8
        base = {"purpose": "memory", "Hkv": int(Hkv), "d": d, "dtype": dtype, "live": live, "chunk": chunk,
                "max_len": max_len, "seed": int(rng.integers(2**31))}
        live_bytes = 2 * Hkv * live * d * ITEM[dtype]
        out.append(Probe(f"memory-{Hq}-{Hkv}", "memory", {**base, "G": Hq // Hkv, "layout": name}, live_bytes))
        out.append(Probe(f"memory-{Hkv}-{Hkv}", "memory", {**base, "G": 1, "layout": f"{name}, G = 1"}, live_bytes,
                         twin_of=f"memory-{Hq}-{Hkv}"))
    # Growth: one layout, a prefill of half the tokens, one-token appends to the end.
    name, Hq, Hkv, d = CHECKPOINTS[int(rng.integers(len(CHECKPOINTS)))]
    dtype = DTYPES[int(rng.integers(2))]
    # Half the tokens in the prefill: one of K or V then holds 2 MiB or more when the appends start, well above
    # what the kernel charges a cgroup ahead of use, and the half appended holds one doubling whatever the
    # capacity a doubling cache started from.
    total = _tokens(rng.uniform(12, 24) * MIB, Hkv, d, dtype, 2048, 8192)
    # The appends at the layout's KV heads; the one attention that closes them at G = 1, so that its own
    # memory (scores) stays small beside the cache's whatever the layout.
    cfg = {"purpose": "grow", "layout": f"{name}, G = 1", "Hkv": Hkv, "G": 1, "d": d, "dtype": dtype, "total": total,
           "prefill": total // 2, "every": max(total // 32, 1), "max_len": total + int(rng.integers(8, 64)),
           "seed": int(rng.integers(2**31))}
    out.append(Probe("grow", "grow", cfg, 2 * Hkv * total * d * ITEM[dtype]))
    # Live length: one layout, the same decode steps in a small and a large reservation, twice each.
    name, Hq, Hkv, d = CHECKPOINTS[int(rng.integers(len(CHECKPOINTS)))]
    dtype = DTYPES[int(rng.integers(2))]
    live = _tokens(rng.uniform(2, 4) * MIB, Hkv, d, dtype, 768, 1536)
    decodes = int(rng.integers(32, 49))
    small = int((live + decodes) * rng.uniform(1.02, 1.2)) + 8
    # 8 to 11 times larger: a scan reads the never-written part as the kernel's zero page, cheaply, so it costs
    # about 0.65 times the ratio (measured); at most 18,000 tokens, where a float64 mask table of max_len^2
    # entries (nanoGPT's) is 2.6 GB, inside the sandbox.
    large = min(int(small * rng.uniform(8, 11)), 18_000)
    seed_kv = int(rng.integers(2**31))
    for label, max_len in (("small", small), ("large", large)):
        for run in (1, 2):
            cfg = {"purpose": "scan", "layout": name, "Hkv": Hkv, "G": Hq // Hkv, "d": d, "dtype": dtype,
                   "live": live, "decodes": decodes, "max_len": max_len, "seed": seed_kv,
                   "reservation": label, "run": run}
            out.append(Probe(f"scan-{label}" + ("" if run == 1 else f"-{run}"), "scan", cfg,
                             2 * Hkv * (live + decodes) * d * ITEM[dtype]))
    return out


def describe(plan_probes: list[Probe]) -> list[dict]:
    """What was drawn, for the report: per probe its purpose, layout, Hq/Hkv, head_dim, dtype and sizes."""
    keep = ("layout", "dtype", "d", "live", "total", "max_len", "chunk", "decodes")
    return [{"probe": p.name, "purpose": p.purpose, "Hq": p.config["Hkv"] * p.config["G"], "Hkv": p.config["Hkv"],
             **{k: p.config[k] for k in keep if k in p.config}} for p in plan_probes]


# ---------------------------------------------------------------- inputs, queries and expected outputs

def _normal(seed, *key, shape, dtype: str) -> np.ndarray:
    return np.random.default_rng([seed, *key]).standard_normal(shape).astype(dtype)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Attention of ``q`` ``[B, Hq, T, d]`` over all of ``k``, ``v`` ``[B, Hkv, S, d]`` with the
    bottom-right causal mask (query t sees keys ``0 .. S - T + t``), float64, query head h reading
    KV head ``h // G``: the probes' expected outputs (every row full, no padding)."""
    B, Hq, T, d = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qg = q.astype(np.float64).reshape(B, Hkv, G, T, d)
    scores = np.einsum("bhgtd,bhsd->bhgts", qg, k.astype(np.float64)) / np.sqrt(d)
    visible = np.arange(S)[None, :] <= (S - T + np.arange(T))[:, None]
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhgts,bhsd->bhgtd", weights, v.astype(np.float64)).reshape(B, Hq, T, d)


def _step(flat, k, v, n_new, dtype, **more) -> dict:
    return {"k": flat.ref(k, dtype), "v": flat.ref(v, dtype), "n_new": list(n_new), **more}


def build(probe: Probe, flat, memo: dict | None = None) -> Built:
    """``probe`` as trials whose inputs lie in ``flat`` (a ``grader.stages.jobs.Flat``), with what its marks hand
    over (queries, digest weights, tokens) and the outputs they must send back. ``memo`` shares the K/V of
    probes that have the same cache (a layout and its twin; the runs of one live length)."""
    c, memo = probe.config, {} if memo is None else memo
    Hkv, G, d, dtype, seed = c["Hkv"], c["G"], c["d"], c["dtype"], c["seed"]
    Hq = Hkv * G
    trial = lambda B, max_len, steps, **more: {"name": "t", "B": B, "Hkv": Hkv, "G": G, "d": d,  # noqa: E731
                                               "max_len": max_len, "dtype": dtype, "steps": steps, **more}
    tag = zlib.crc32(probe.name.encode())  # each probe's queries its own, twins and runs included
    secret = lambda *key, shape: _normal(seed, 9, tag, *key, shape=shape, dtype="float32").astype(dtype)  # noqa: E731
    asked = lambda q: {"q": "go", "q_shape": list(q.shape)}  # noqa: E731 - a step attending to the given query
    if c["purpose"] == "memory":
        key = ("memory", seed, Hkv, d, dtype)
        if key not in memo:
            S = c["live"] + c["chunk"]
            memo[key] = {"k": _normal(seed, 3, shape=(1, Hkv, S, d), dtype=dtype),
                         "v": _normal(seed, 4, shape=(1, Hkv, S, d), dtype=dtype)}
            live, chunk, kv = c["live"], c["chunk"], memo[key]
            kv["refs"] = {  # the twin reads the same inputs
                "prefill": _step(flat, kv["k"][:, :, :live - 1], kv["v"][:, :, :live - 1], [live - 1], dtype),
                "decode": _step(flat, kv["k"][:, :, live - 1:live], kv["v"][:, :, live - 1:live], [1], dtype),
                "chunk": _step(flat, kv["k"][:, :, live:], kv["v"][:, :, live:], [chunk], dtype)}
        kv, live = memo[key], c["live"]
        refs = kv["refs"]
        q = {"decode": secret(2, shape=(1, Hq, 1, d)), "chunk": secret(3, shape=(1, Hq, c["chunk"], d))}
        trials = [trial(1, c["max_len"], [{**refs["prefill"], "attend": False},
                                          {**refs["decode"], **asked(q["decode"]), "mark": True, "mark_after": True,
                                           "given": [["q", list(q["decode"].shape)]]},
                                          {**refs["chunk"], **asked(q["chunk"]), "mark": True,
                                           "given": [["q", list(q["chunk"].shape)]]}])]
        # Marks: 1 before the decode (its query), 2 after it (its output), 3 before the chunk (its query), 4 after
        # it (its output).
        marks = [q["decode"].tobytes(), b"", q["chunk"].tobytes()]
        expect = {2: reference(q["decode"], kv["k"][:, :, :live], kv["v"][:, :, :live]),
                  4: reference(q["chunk"], kv["k"], kv["v"])}
        return Built(trials, marks, {i: e.ravel() for i, e in expect.items()})
    if c["purpose"] == "grow":
        total, prefill, every = c["total"], c["prefill"], c["every"]
        k = _normal(seed, 5, shape=(1, Hkv, total + 1, d), dtype=dtype)
        v = _normal(seed, 6, shape=(1, Hkv, total + 1, d), dtype=dtype)
        # The appended tokens lie in a pool, in an order handed over at the prefill's mark: no append can be
        # made before it. The last token's attention (G = 1: its own memory small) reads everything appended,
        # so no append can be left until after the last mark either.
        count = total - prefill
        perm = np.random.default_rng([seed, 11, tag]).permutation(count).astype(np.int32)
        order = np.argsort(perm)  # pool row perm[i] is appended i-th: the pool holds the tokens so that this
        pool = [flat.ref(np.ascontiguousarray(x[0, :, prefill:total].transpose(1, 0, 2)[order]), dtype)
                for x in (k, v)]  # ... gives back the sequence's order
        steps = [{**_step(flat, k[:, :, :prefill], v[:, :, :prefill], [prefill], dtype), "attend": False,
                  "mark": True, "given": [["perm", [count]]]}]
        for i in range(count):
            steps.append({"pick": i, "pool": pool, "n_new": [1], "attend": False,
                          **({"mark": True} if (i + 1) % every == 0 and i + 1 < count else {})})
        q = secret(1, shape=(1, Hkv, 1, d))
        last = _step(flat, k[:, :, total:], v[:, :, total:], [1], dtype)
        steps.append({**last, **asked(q), "mark": True, "given": [["q", list(q.shape)]]})
        marks = [perm.tobytes()] + [b""] * sum(1 for s in steps[1:-1] if s.get("mark")) + [q.tobytes()]
        return Built([trial(1, c["max_len"] + 1, steps)], marks,
                     {len(marks) + 1: reference(q, k, v).ravel()})
    # scan
    live, decodes = c["live"], c["decodes"]
    key = ("scan", seed, Hkv, d, dtype, live, decodes)
    if key not in memo:
        S = live + decodes
        k = _normal(seed, 7, shape=(1, Hkv, S, d), dtype=dtype)
        v = _normal(seed, 8, shape=(1, Hkv, S, d), dtype=dtype)
        memo[key] = {"k": k, "v": v, "prefill": _step(flat, k[:, :, :live], v[:, :, :live], [live], dtype),
                     "steps": [_step(flat, k[:, :, s:s + 1], v[:, :, s:s + 1], [1], dtype) for s in range(live, S)]}
    kv = memo[key]
    first, second = secret(1, shape=(1, Hq, 1, d)), secret(2, shape=(1, Hq, 1, d))
    steps = [{**kv["prefill"], "attend": False}]
    for i, step in enumerate(kv["steps"]):
        # The first two steps mark, each handing over a query: the steps from the second on are the figure,
        # and their output (the last step's) depends on a query given only at its start.
        steps.append({**step, **asked(first), **({"mark": True, "given": [["q", list(first.shape)]]} if i < 2 else {})})
    S1, S = live + 1, live + decodes
    expect = {2: reference(first, kv["k"][:, :, :S1], kv["v"][:, :, :S1]).ravel(),
              3: reference(second, kv["k"][:, :, :S], kv["v"][:, :, :S]).ravel()}
    return Built([trial(1, c["max_len"], steps)], [first.tobytes(), second.tobytes()], expect)
