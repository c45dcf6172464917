"""kvkit: teach and grade grouped-query attention over a preallocated KV cache.

The command line lives in ``kvkit.cli``; the parts it drives are top-level
packages: ``grader`` (hidden checks, sandbox, reports), ``catalogue`` (the
mistakes), ``solutions`` (the reference), ``exercises`` (the learner's stubs
and steps) and ``benchmarks``.
"""
