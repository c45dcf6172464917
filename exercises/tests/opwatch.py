"""Watch the ops a piece of PyTorch code runs (step 6), with a TorchDispatchMode.

Every ATen op that runs inside ``with OpWatch() as w:`` is recorded with
whether it returns a view or writes in place (its schema's first return
aliases an input: ``func._schema.returns[0].alias_info is not None``), the
largest number of elements it returned, and the storages of its tensor inputs.
Composite ops arrive decomposed: ``torch.matmul`` shows up as the ``expand``,
``clone`` and ``bmm`` it is made of, which is how a hidden copy shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class Op:
    name: str            # e.g. "aten.clone.default"
    aliases: bool        # a view, or an in-place op returning its input
    numel: int           # elements of the largest tensor it returned
    inputs: set = field(default_factory=set)  # data_ptr of each tensor input's storage

    @property
    def packet(self) -> str:
        """The op without its overload: ``aten.clone``."""
        return ".".join(self.name.split(".")[:2])


def storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # tensors without storage (meta, sparse)
        return -1


class OpWatch(TorchDispatchMode):
    """Record every op; read ``ops`` afterwards."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # By default torch wraps a mode's __torch_dispatch__ so that torch.compile skips it, and the wrapper
        # imports torch._dynamo at the first op (about 1.5 s of CPU). Nothing is compiled under this watch.
        return False

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        schema_returns = func._schema.returns
        aliases = bool(schema_returns) and schema_returns[0].alias_info is not None
        outs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        ins = {storage_ptr(t) for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)}
        self.ops.append(Op(str(func), aliases, max((t.numel() for t in outs), default=0), ins))
        return result


def trail(ops: list[Op], index: int, before: int = 4) -> str:
    """The ops leading up to ``ops[index]``, as ``aten.expand -> aten.clone``."""
    start = max(0, index - before)
    return " -> ".join(f"{op.packet}{' (view)' if op.aliases else ''}" for op in ops[start:index + 1])
