"""The rehearsal's device: what a forward creates without a device is meta, the model's real
tensors are seen as meta, what the real kernels refuse is refused (``kernel_checks.py``), and a
draw on a real device is noticed.

A rehearsal runs the forward under ``torch.device("meta")``, so ``torch.rand(shape)`` makes a
meta tensor and draws nothing. A forward may still draw on a real device, naming it
(``torch.rand(n, 1, device="cpu")``, a CPU tensor's ``uniform_()``, dropout of a CPU tensor):
that moves the generator, and a ``build`` would then allocate with other numbers than eager
construction. :class:`MetaDevice` is that same device mode, which also records such a draw,
so the rehearsal puts the generator back only then (never rewinding another thread's draws
when its own forward drew nothing). Given :class:`~.stand_ins.StandIns`, it shows the forward
each real tensor it touches as its meta stand-in (``stand_ins.py``).

>>> import torch
>>> with MetaDevice() as mode:
...     made = torch.rand(2)
>>> made.device.type, mode.drew
('meta', False)
>>> with MetaDevice() as mode:
...     _ = torch.rand(2, device="cpu")
>>> mode.drew
True
"""

from __future__ import annotations

from typing import Any

import torch

# torch.device(...) as a context is torch.utils._device.DeviceContext (private, the only way to
# add to what it does: torch keeps one DeviceContext at the bottom of the mode stack and checks
# it by isinstance). tests/ecosystem/test_torch_internals.py checks that it still fills in the
# device.
from torch.utils._device import DeviceContext
from torch.utils.flop_counter import FlopCounterMode

from .formulas import answer, flops
from .kernel_checks import refused
from .stand_ins import ATTRIBUTES, StandIns

__all__ = ["MetaDevice"]

#: the names of torch's functions and tensor methods that draw from a generator
_DRAWS = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
        "normal", "bernoulli", "multinomial", "poisson", "uniform_", "normal_", "bernoulli_",
        "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "dropout",
        "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
        "rrelu", "rrelu_", "binomial", "_standard_gamma", "_sample_dirichlet",
        "native_dropout", "feature_dropout", "feature_dropout_",
    }
)  # fmt: skip

#: what a tensor attribute's read or write reaches a function mode as (``t.shape``: the
#: descriptor's ``__get__``)
_ATTRIBUTES = frozenset({"__get__", "__set__"})
#: what reads a real tensor as the object it is (its hash is its identity; a copy of it is a
#: copy of its values, as in eager code), not through its stand-in
_AS_ITSELF = frozenset({"__hash__", "__deepcopy__", "__reduce_ex__", "__getstate__"})


def _on_a_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call draws on a real device: its ``device=`` names one, or, without it, its
    first tensor argument is not on meta."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device).type != "meta"
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return first is not None and not first.is_meta


def _count(counter: FlopCounterMode, counted: tuple[Any, int] | None) -> None:
    """Add an answered call's FLOPs to ``counter`` as its dispatch mode adds a kernel's
    (``FlopCounterMode._count_flops``: to every module running)."""
    if counted is not None:
        op, n = counted
        for parent in set(counter.mod_tracker.parents):
            counter.flop_counts[parent][op] += n


class MetaDevice(DeviceContext):
    """``torch.device("meta")`` as a context, with ``drew``: whether a call under it drew
    from a generator on a real device.

    ``fast``: with autograd off, the common functions on meta tensors are answered by
    formula (``shapes.answer``: an empty tensor of the output's shape, dtype and strides)
    instead of torch's meta kernels, many of which are Python references; ``counter``, a
    ``FlopCounterMode`` running inside, is given the FLOPs of the calls so answered;
    ``stand_ins``: the model's real tensors are seen through them (``stand_ins.py``)."""

    def __init__(
        self,
        fast: bool = False,
        counter: FlopCounterMode | None = None,
        stand_ins: StandIns | None = None,
    ) -> None:
        super().__init__("meta")
        self.drew = False
        self.fast = fast
        self.counter = counter
        self.stand_ins = stand_ins
        # (FlopCounterMode's dispatch mode is the only one a formula may pass by)
        self._modes = 0 if counter is None else 1

    def __enter__(self) -> MetaDevice:
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", None)
        seen = self.stand_ins
        kwargs = kwargs or {}
        if name in ATTRIBUTES:  # (a tensor's attribute read or set: nothing to make meta)
            if seen is not None and args and seen.needs(args[0]):  # (the model's: its stand-in)
                return seen.through(name, args, kwargs, lambda a, k: func(*a, **k))
            return func(*args, **kwargs)
        if seen is not None:
            return seen.through(
                name, args, kwargs, lambda a, k: self._call(func, types, name, a, k)
            )
        return self._call(func, types, name, args, kwargs)

    def _call(
        self, func: Any, types: Any, name: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        error = refused(func, args, kwargs)  # (what the real kernels refuse, meta may not)
        if error is not None:
            raise error
        if not self.drew and name in _DRAWS:
            self.drew = _on_a_device(args, kwargs)
        if (
            self.fast
            and not torch.is_grad_enabled()
            and torch._C._len_torch_dispatch_stack() == self._modes
        ):
            out = answer(func, args, kwargs)
            if out is not None:
                if self.counter is not None:
                    _count(self.counter, flops(func, out, args, kwargs))
                return out
        return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]
