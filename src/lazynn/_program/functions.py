"""The Python half of a recording: what a construction on meta does through torch's Python
functions rather than aten operations.

* ``torch.tensor(...)`` and its kin make their value on the CPU first, then copy it to meta (an
  aten copy from a real tensor, which the aten half records): a constant written in code keeps
  its value on meta;
* ``.tolist()``, ``.numpy()`` read values without an aten op: they are computed for real;
* ``nn.init.trunc_normal_`` does nothing to a meta tensor (its helper asks ``is_meta`` first,
  and its rejection rounds read values): it is a step of its own, read from the helper's frame;
  ``orthogonal_``, ``sparse_`` and ``dirac_``, which also ask, are told their tensor is not on
  meta, and run their aten steps on it.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode

from .._errors import frame_locals

__all__ = ["Functions", "Records"]

#: torch.nn.init functions that return at once for a meta tensor (they ask ``is_meta``):
#: trunc_normal_'s helper is a step of its own (its rejection rounds read values); the others
#: are told their tensor is not on meta, and run their aten steps on it (orthogonal_'s QR,
#: sparse_'s randperm, which draws from the default generator, dirac_'s index writes)
_TRUNC_NORMAL = ("torch.nn.init.trunc_normal_", ("tensor", "mean", "std", "a", "b", "generator"))
_RUN_ON_META = frozenset({"orthogonal_", "sparse_", "dirac_"})
_INIT_FILE = os.path.join("torch", "nn", "init.py")
#: functions that make a tensor from Python data, which meta would drop
_FROM_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor})
#: tensor methods that read values without an aten op on the way
_READS = frozenset(
    {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}
)  # fmt: skip


class Records(Protocol):
    """What :class:`Functions` asks of the recorder it serves."""

    paused: int
    named: torch.Generator | None

    def record(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        written: set[int | str],
        random: bool,
    ) -> Any: ...

    def evaluate(self, tensor: torch.Tensor) -> torch.Tensor: ...


class Functions(TorchFunctionMode):
    """The Python half of a recorder (see the module doc)."""

    def __init__(self, recorder: Records) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self.recorder.paused:
            return func(*args, **kwargs)
        named = kwargs.get("generator")
        if isinstance(named, torch.Generator) and self.recorder.named is None:
            # (the dispatcher hands each op a new Python object for a generator: the ops of
            # this call are told the user's object, so that one generator is one on the tape)
            self.recorder.named = named
            try:
                return self._function(func, args, kwargs)
            finally:
                self.recorder.named = None
        return self._function(func, args, kwargs)

    def _function(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func in _FROM_DATA and _default_meta(kwargs, args, func):
            made = func(*args, **{**kwargs, "device": "cpu"})
            return made.to("meta")  # (an aten copy from a real tensor: the value is a step)
        if func in _READS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return func(self.recorder.evaluate(args[0]), *args[1:], **kwargs)
        owner = getattr(func, "__self__", None)
        if (
            getattr(func, "__name__", "") == "__get__"
            and getattr(owner, "__name__", "") == "is_meta"
        ):
            frame = sys._getframe(1)
            while frame.f_back is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back  # (the caller that asked, past this mode's own frames)
            if _in_init(frame) and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                if frame.f_code.co_name in _RUN_ON_META:
                    return False
                called = _trunc_normal(frame)
                if called is not None:
                    self.recorder.record(*called, None, {0}, True)
                    return True
        return func(*args, **kwargs)


def _default_meta(kwargs: dict[str, Any], args: tuple[Any, ...], func: Any) -> bool:
    """Whether a tensor made from data here would land on meta."""
    device = kwargs.get("device")
    if device is None and func is torch.Tensor.new_tensor and args:
        return bool(args[0].is_meta)
    if device is None:
        return torch.get_default_device().type == "meta"
    return torch.device(device).type == "meta"


def _in_init(frame: FrameType) -> bool:
    return frame.f_code.co_filename.endswith(_INIT_FILE)


def _trunc_normal(frame: FrameType) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
    """``nn.init.trunc_normal_`` as a step (name, tensor and bounds, generator), read from the
    frame of its helper that asked ``is_meta``; or None for another frame."""
    if frame.f_code.co_name != "_no_grad_trunc_normal_":
        return None
    op, names = _TRUNC_NORMAL
    values = frame_locals(frame, names)
    if len(values) != len(names):
        return None
    generator = values.pop("generator")
    return op, tuple(values[n] for n in names[:-1]), {"generator": generator}
