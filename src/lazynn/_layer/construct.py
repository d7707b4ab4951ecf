"""Eager construction on a chosen device and dtype, and the meta layouts lazy layers keep.

A lazy layer constructs its eager class three ways: on meta with probe sizes (its layout:
every attribute, submodule and tensor name, no memory, no random numbers), on meta with real
sizes (shapes to check a checkpoint or an input against), and for real (the build, drawing
the random numbers ``cls(...)`` draws). :func:`new` does all three, for torch.nn classes
(which take ``device`` and ``dtype``) and for classes that do not.

>>> layer = new(torch.nn.Linear, {"in_features": 3, "out_features": 2}, "meta", None)
>>> layer.weight.shape, layer.weight.device
(torch.Size([2, 3]), device(type='meta'))
>>> {key_text(k): tuple(t.shape) for k, t in slots(layer).items()}
{'weight': (2, 3), 'bias': (2,)}
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .._module.tensors import map_tensors, meta_like, own_slots, raw
from .._program.record import unrecorded
from .infer import unknown_parts

__all__ = [
    "MODULE_KEYS",
    "Slot",
    "allocate_empty",
    "by_path",
    "construct",
    "differs",
    "forward_names",
    "hide_probes",
    "key_text",
    "match_dtypes",
    "new",
    "of_torch",
    "parameter_device",
    "short_repr",
    "slots",
]

#: the attributes every nn.Module has (not a layer's own settings)
MODULE_KEYS = frozenset(nn.Module().__dict__)

#: (submodule path, tensor name): where a parameter or buffer sits in a layer
Slot = tuple[str, str]

#: nn.Module.register_parameter as torch defines it
_REGISTER_PARAMETER = nn.Module.register_parameter


def parameter_device(default: torch.device) -> torch.device:
    """Where a parameter registered now lands: ``default``, unless a tool has replaced
    ``nn.Module.register_parameter`` to move parameters as they are registered (accelerate's
    ``init_empty_weights``/``init_on_device``). Then the placeholders of a layer constructed
    without ``device=`` go where that tool sends an eager layer's parameters.

    A lazy layer sets its placeholders in its parameter dict directly (they must keep their
    identity), past any such replacement; this asks the replacement with a throwaway module.
    """
    if nn.Module.register_parameter is _REGISTER_PARAMETER:  # the usual case: one check
        return default
    probe = nn.Module()
    nn.Module.register_parameter(probe, "probe", nn.Parameter(torch.empty(0, device=default)))
    placed = probe._parameters["probe"]
    return placed.device if placed is not None else default


_T = TypeVar("_T")


def _per_class(fn: Callable[[type[nn.Module]], _T]) -> Callable[[type[nn.Module]], _T]:
    """``functools.cache`` for a function of a module class. (The cast: a class is hashable,
    but mypy does not see ``type[nn.Module]`` as ``Hashable``, which the cache's own
    ``__call__`` asks of its arguments.)"""
    return cast(Callable[[type[nn.Module]], _T], functools.cache(fn))


@_per_class
def _takes_factory_kwargs(cls: type[nn.Module]) -> bool:
    """Whether ``cls(...)`` accepts ``device=`` and ``dtype=`` (every torch.nn layer does)."""
    params = inspect.signature(cls.__init__).parameters
    if "device" in params and "dtype" in params:
        return True
    # nn.RNN/LSTM/GRU take (*args, **kwargs) and pass device/dtype on to RNNBase.
    return any(p.kind is p.VAR_KEYWORD for p in params.values()) and cls.__module__.startswith(
        "torch.nn"
    )


def new(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    device: torch.device | str,
    dtype: torch.dtype | None,
    into: nn.Module | None = None,
) -> nn.Module:
    """``cls(**kwargs)`` on ``device`` with floating dtype ``dtype``; or, with ``into``, its
    ``__init__`` run on that (lazy) instance.

    A class without ``device``/``dtype`` arguments is constructed under the
    ``torch.device(device)`` context and its floating tensors cast to ``dtype`` after.
    """
    if str(device) == "meta":
        with unrecorded():  # (a layout for its shapes: no init program of the model's)
            return _on_meta(cls, kwargs, dtype, into)
    return construct(cls, kwargs, device, dtype, into)


def _on_meta(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    dtype: torch.dtype | None,
    into: nn.Module | None,
) -> nn.Module:
    """:func:`new` on meta: a remembered layout's copy where the class allows it."""
    key = _layout_key(cls, kwargs, dtype)
    if key is not None:
        template: _Layout | None = _LAYOUTS.get(key, _UNSEEN)
        if template is _UNSEEN:
            try:
                template = _template(_meta(cls, kwargs, dtype, None))
            except Exception:  # refused: raised below, by the instance (its class's name)
                template = None
            else:
                if len(_LAYOUTS) >= _MAX_LAYOUTS:
                    _LAYOUTS.clear()
                _LAYOUTS[key] = template
        if template is not None:
            return template.copy(into)
    return _meta(cls, kwargs, dtype, into)


def _meta(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    dtype: torch.dtype | None,
    into: nn.Module | None,
) -> nn.Module:
    # Tensor arguments (LinearCrossEntropyLoss's class weights) go to meta with the layer.
    kwargs = {k: map_tensors(meta_like, v) for k, v in kwargs.items()}
    # (under the meta device too: what the user's code the construction calls makes without a
    # device, torch's global registration hooks, is meta and draws nothing, as a layout must)
    with _NoEmptyInits(), torch.device("meta"):
        return construct(cls, kwargs, "meta", dtype, into)


#: initializers that warn on a zero-element tensor ("Initializing zero-element tensors is a
#: no-op"); those that take torch functions' overrides (kaiming_normal_ does not, in 2.13)
_WARN_ON_EMPTY = frozenset({nn.init.kaiming_uniform_, nn.init.kaiming_normal_})


class _NoEmptyInits(TorchFunctionMode):
    """A meta construction without the one warning its probe sizes cause where real sizes
    would not: an initializer of a zero-element tensor (AdaptiveLogSoftmaxWithLoss's tail of
    ``in_features // div_value``, laid out with ``in_features=1``), which only warns that it
    does nothing, is not called. Warnings are not silenced otherwise: their filters are the
    process's, and ``warnings.catch_warnings`` in two threads at once can leave one's
    "ignore" behind (the real construction, at the build, warns as eager does)."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _WARN_ON_EMPTY:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.numel() == 0:
                return tensor
        return func(*args, **kwargs)


# --- remembered meta layouts -----------------------------------------------------------------
# Constructing a torch.nn layer on meta runs its initializers through torch's meta kernels,
# 40-100 microseconds a layer; a model repeats a few layer configurations many times (a
# ResNet's convolutions, a transformer's blocks). So the meta construction of a torch.nn
# class whose arguments are plain values is done once per (class, arguments, dtype), and each
# later one copies it: its settings, fresh containers, and new meta tensors of its shapes.
# Only layers that hold no submodules, no hooks and nothing but plain values qualify; anything
# else (a user's class, whose __init__ may have side effects) is constructed every time.

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)
_MAX_LAYOUTS = 4096
_UNSEEN: Any = object()
#: (class, frozen arguments, dtype) -> a meta layer to copy, or None: construct every time
_LAYOUTS: dict[Any, _Layout | None] = {}


def _freeze(value: Any) -> Any:
    """A hashable, type-exact key for a plain value (``1`` and ``True`` differ); or raise."""
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_freeze(v) for v in value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    raise TypeError


def of_torch(cls: type[nn.Module]) -> bool:
    """Whether ``cls`` is one of torch.nn's classes (whose ``__init__`` makes every tensor
    where its ``device=`` says, and has no other effect)."""
    return cls.__module__.startswith("torch.nn.")


def _layout_key(cls: type[nn.Module], kwargs: Mapping[str, Any], dtype: Any) -> Any:
    if not of_torch(cls):
        return None
    try:
        frozen = tuple(sorted((k, _freeze(v)) for k, v in kwargs.items()))
    except TypeError:  # a tensor, a module, a callable... or unorderable: not remembered
        return None
    return (cls, frozen, dtype if dtype is not None else torch.get_default_dtype())


def _is_plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _template(module: nn.Module) -> _Layout | None:
    """``module`` as a layout later constructions may copy, or None."""
    mutable = []
    for key, value in module.__dict__.items():
        if key in MODULE_KEYS:
            empty_ok = key in ("_parameters", "_buffers", "_non_persistent_buffers_set")
            if isinstance(value, (dict, set)) and value and not empty_ok:
                return None  # submodules or hooks (bound to this instance)
        elif not _is_plain(value):
            return None
        if isinstance(value, (dict, set, list)) and key not in ("_parameters", "_buffers"):
            mutable.append(key)
    return _Layout(module, tuple(mutable))


@dataclass(frozen=True)
class _Layout:
    """A meta layer to copy, and the keys of its dict that hold containers."""

    module: nn.Module
    mutable: tuple[str, ...]

    def copy(self, into: nn.Module | None) -> nn.Module:
        """A copy (in ``into``'s dict if given: its tensors are about to be replaced by
        placeholders, so they are shared; otherwise new meta tensors of the same shapes,
        dtypes and ``requires_grad``), with its own containers."""
        template = self.module
        module = into if into is not None else type(template).__new__(type(template))
        attrs = module.__dict__
        attrs.update(template.__dict__)
        for key in self.mutable:
            attrs[key] = attrs[key].copy()  # (an OrderedDict's copy is an OrderedDict)
        for key in ("_parameters", "_buffers"):
            store = attrs[key] = attrs[key].copy()
            if into is None:
                for name, tensor in store.items():
                    if tensor is not None:
                        fresh = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
                        if isinstance(tensor, nn.Parameter):
                            fresh = nn.Parameter(fresh, tensor.requires_grad)
                        store[name] = fresh
        return module


def construct(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    device: torch.device | str,
    dtype: torch.dtype | None,
    into: nn.Module | None,
) -> nn.Module:
    """``cls(**kwargs)`` constructed for real on ``device`` (no layout kept), or its
    ``__init__`` run on ``into``."""
    init: Any = cls.__init__
    if _takes_factory_kwargs(cls):
        full = {**kwargs, "device": device, "dtype": dtype}
        if into is not None:
            init(into, **full)
            return into
        return cls(**full)
    with torch.device(device):
        module = into if into is not None else cls.__new__(cls)
        init(module, **kwargs)
    if dtype is not None and dtype != torch.get_default_dtype() and into is None:
        module.to(dtype)
    return module


#: the second probe of hide_probes, as a multiple of the first
_FAR = 1024


def hide_probes(
    layer: nn.Module,
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    probes: Mapping[str, Any],
    dtype: torch.dtype | None,
) -> None:
    """Show ``?`` for every attribute of ``layer``'s submodules that the probe sizes decided.

    ``layer`` is laid out as ``cls(**kwargs, **probes)``. (``linear1.in_features`` of a
    transformer layer is ``d_model``.) A second meta layout with every probe multiplied tells
    them apart; the build copies the real values back.
    """
    # (A large multiple, not double: a floor division by a constant, such as
    # AdaptiveLogSoftmaxWithLoss's in_features // div_value**k, must tell them apart too.)
    far = {
        name: tuple(_FAR * v for v in probe) if isinstance(probe, tuple) else _FAR * probe
        for name, probe in probes.items()
    }
    other = new(cls, {**kwargs, **far}, "meta", dtype)
    theirs = dict(other.named_modules())
    for path, module in layer.named_modules():
        if not path or path not in theirs:
            continue
        for key, value in list(module.__dict__.items()):
            if key in MODULE_KEYS or key not in theirs[path].__dict__:
                continue
            other_value = theirs[path].__dict__[key]
            if differs(value, other_value):
                module.__dict__[key] = unknown_parts(value, other_value)


def slots(module: nn.Module) -> dict[Slot, torch.Tensor]:
    """Every parameter and buffer below ``module``, by (submodule path, name)."""
    return {
        (path, name): tensor
        for path, sub in by_path(module).items()
        for _, name, tensor in own_slots(sub)
    }


def by_path(module: nn.Module) -> dict[str, nn.Module]:
    """``module`` and every module below it, by path (``dict(module.named_modules())``;
    a layer without submodules, the common case, needs no walk)."""
    return dict(module.named_modules()) if module._modules else {"": module}


def key_text(key: Slot) -> str:
    """A slot as a state_dict key: ``"linear1.weight"``."""
    path, name = key
    return f"{path}.{name}" if path else name


@_per_class
def forward_names(cls: type[nn.Module]) -> list[str]:
    """The names of ``cls.forward``'s arguments, without ``self``."""
    return list(inspect.signature(cls.forward).parameters)[1:]


def differs(a: Any, b: Any) -> bool:
    """Whether two attribute values differ (plain values only; anything else: no)."""
    plain = (int, float, bool, str, tuple, type(None))
    if isinstance(a, plain) and isinstance(b, plain):
        return bool(a != b)
    return False


def short_repr(module: nn.Module) -> str:
    """``Conv2d(3, 8, kernel_size=(3, 3))``; for a module with children, its name only."""
    if module._modules:
        return f"{type(module).__name__}({module.extra_repr()})".replace("()", "")
    return repr(module)


def match_dtypes(shadow: nn.Module, placeholders: Iterable[tuple[Slot, torch.Tensor]]) -> None:
    """Give a meta shadow the dtypes the placeholders were moved to (``.double()``...)."""
    modules = dict(shadow.named_modules())
    for (prefix, name), placeholder in placeholders:
        module = modules[prefix]
        tensor = getattr(module, name)
        dtype = raw(placeholder).dtype
        if tensor is not None and tensor.dtype != dtype:
            if name in module._parameters:
                module._parameters[name] = nn.Parameter(tensor.to(dtype), tensor.requires_grad)
            else:
                module._buffers[name] = tensor.to(dtype)


def allocate_empty(shadow: nn.Module, device: torch.device | str) -> nn.Module:
    """``shadow`` (a module on meta) with every tensor given uninitialized memory on
    ``device``, in place; no random number is drawn. (``torch.empty``, not ``to_empty``:
    ``empty_like`` of a meta tensor runs torch's Python reference, which imports sympy.)"""
    with torch.inference_mode(False):  # ordinary tensors, even inside the mode
        for module in shadow.modules():
            for store, name, t in own_slots(module):
                empty = torch.empty(t.shape, dtype=t.dtype, device=device)
                is_param = isinstance(t, nn.Parameter)
                store[name] = nn.Parameter(empty, t.requires_grad) if is_param else empty
    return shadow
