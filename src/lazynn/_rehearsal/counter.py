"""The rehearsal's FLOP counter: torch's ``FlopCounterMode``, without importing the compiler.

torch wraps every Python dispatch mode's ``__torch_dispatch__`` in a dynamo "disable", which
imports ``torch._dynamo`` (1-2 s) at the first op it sees: a ``summary``, which counts FLOPs,
would pay it in every fresh process. :class:`FlopCounter` is ``FlopCounterMode`` (the same
formulas, the same counts) whose dispatch mode is the same code, unwrapped: a rehearsal never
runs under ``torch.compile``. Nor does it track modules: ``FlopCounterMode``'s module tracker
hooks every module call (a global hook, a walk of each module's children) to count per
module, where the rehearsal wants the total (its own hooks count per module); every count
goes to ``"Global"``, as the tracker's outermost parent. And an op with no FLOPs of its own
and no decomposition (a view, an element-wise op: ``FlopCounterMode`` would try to decompose
it, then run it and count nothing) runs at once: the dispatch mode sees every op of a
rehearsal, tens of thousands in a large model's.

>>> import torch
>>> with FlopCounter(display=False) as counter:
...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
>>> counter.get_total_flops()
48
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# FlopCounterMode's dispatch mode, _FlopCounterMode: private, the only way to count as it
# counts (tests/ecosystem/test_torch_internals.py checks that it is still there)
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

__all__ = ["FlopCounter"]

_wrapped = _FlopCounterMode.__torch_dispatch__
#: torch's, unwrapped (typed here: torch's is not annotated)
_dispatch: Callable[..., Any] = getattr(_wrapped, "__wrapped__", _wrapped)


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
#: op -> whether it runs at once: no FLOPs of its own, nothing to decompose into ops that have
#: some (as ``OpOverload.decompose`` finds it), not a size query torch's counter passes on
_AT_ONCE: dict[Any, bool] = {}


def _at_once(func: Any, registry: Any) -> bool:
    found = _AT_ONCE.get(func)
    if found is None:
        found = (
            isinstance(func, torch._ops.OpOverload)
            and func._overloadpacket not in registry
            and _COMPOSITE not in func.py_kernels
            and not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)
            and not func.name().startswith(("aten::sym_", "aten::is_", "aten::size", "prim::"))
            and func.name() not in _QUERIES
        )
        _AT_ONCE[func] = found
    return found


#: the size and layout queries FlopCounterMode passes on (``NotImplemented``), by name
_QUERIES = frozenset({"aten::stride", "aten::storage_offset", "aten::numel", "aten::dim"})


class _Counting(_FlopCounterMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # (torch's would count nothing; and only with no other dispatch mode below this one:
        # fake tensors take their own path)
        if not torch._C._len_torch_dispatch_stack() and _at_once(func, self.counter.flop_registry):
            return func(*args, **(kwargs or {}))
        return _dispatch(self, func, types, args, kwargs)


class _Total:
    """``FlopCounterMode``'s module tracker as the total needs it: no module is ever entered,
    so every count goes to ``"Global"`` (the attribute is public but undocumented:
    tests/ecosystem/test_torch_internals.py checks it is still what the counter reads)."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _Total:
        return self

    def __exit__(self, *args: object) -> None:
        return None


class FlopCounter(FlopCounterMode):
    """``FlopCounterMode`` whose first op imports no compiler, counting the total only (see
    the module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mod_tracker = _Total()  # type: ignore[assignment]

    def __enter__(self) -> FlopCounter:
        super().__enter__()  # type: ignore[no-untyped-call]  # (its dispatch mode: replaced)
        assert self.mode is not None
        self.mode.__exit__(None, None, None)
        self.mode = _Counting(self)
        self.mode.__enter__()  # type: ignore[no-untyped-call]
        return self
