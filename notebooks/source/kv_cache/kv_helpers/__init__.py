"""The kit's helpers that the notebook's cells import, released with it (no answer in them).

    from kv_helpers.mutants import plant      # plant one known mistake around your KVCache and gqa_attention
    from kv_helpers.opwatch import OpWatch    # record the PyTorch ops a block of code runs

``mutants`` is the kit's catalogue/mutants.py, ``opwatch`` the op recorder of the
learner's step 6 (exercises/tests/opwatch.py): the same files, copied here when the
assignment is released.
"""
