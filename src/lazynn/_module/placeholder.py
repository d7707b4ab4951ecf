"""Placeholders: parameters and buffers whose shape the first input decides.

A placeholder is a tensor subclass that holds no data, only what it will become: dtype,
device and ``requires_grad``. It is the object a model's ``parameters()`` returns before
the build, so an optimizer made early holds it; materializing fills it *in place* (same
Python object) and turns its class into ``nn.Parameter`` (or ``torch.Tensor`` for a buffer).

Moves (``.to``, ``.half()``, ``to_empty``...) return new placeholders with the new dtype or
device, so ``module.to(...)`` keeps a module lazy. Anything that needs data or shape is
refused with an :class:`~lazynn.UnbuiltError` that names the owning layer and parameter.

They subclass torch's own ``UninitializedParameter`` / ``UninitializedBuffer``, so the
ecosystem recognizes them: ``torch.nn.parameter.is_lazy(p)`` is True, and DDP, TorchScript,
``weight_norm`` and ``spectral_norm`` refuse them with their own errors.

>>> import torch, lazynn
>>> p = lazynn.UninitializedParameter(dtype=torch.float64)
>>> p
<UninitializedParameter(dtype=torch.float64, device=cpu, requires_grad=True)>
>>> p.materialize((2, 3))
>>> type(p).__name__, tuple(p.shape), p.dtype
('Parameter', (2, 3), torch.float64)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin as TorchLazy

from .._errors import UnbuiltError, func_name
from .answers import ALLOWED_ATTRIBUTES, ALLOWED_METHODS, CLONES, CONVERSIONS, NATIVE
from .callers import distributed, untraced
from .kept import DATA_OF, INITS, PROBE, SELF, Init, add, keep, on_probes, probed
from .refusals import refusal, wrapper_refusal
from .tensors import Placeholder, is_placeholder
from .tensors import raw as _raw

__all__ = [
    "UninitializedBuffer",
    "UninitializedParameter",
    "fill",
    "hooks_materialize",
    "is_lazy",
    "placeholder_for",
    "rebuild_placeholder",
    "relocate",
]

# Type checkers see the mixin as the placeholder tensor it is always mixed into.
if TYPE_CHECKING:
    _TensorForTyping = Placeholder
else:
    _TensorForTyping = object


class _Placeholder(_TensorForTyping):
    """Behaviour shared by both placeholders (a mixin; see the module docstring)."""

    cls_to_become: ClassVar[type[torch.Tensor]]
    #: who owns it, for error messages: "the 'weight' of LazyLinear".
    _lazynn_owner: str

    def _owner(self) -> str:
        return getattr(self, "_lazynn_owner", f"this {type(self).__name__}")

    def _wrapper_refusal(self) -> UnbuiltError | None:
        """The refusal of a torch wrapper being constructed around this placeholder's model
        (taking back what it registered), or None."""
        return wrapper_refusal(self._owner())

    def _refuse(self, what: str) -> UnbuiltError:
        """The refusal of ``what`` (a torch function's name), worded for its caller."""
        checkpoint = self.__dict__.get("_lazynn_checkpoint")
        refused = refusal(self._owner(), type(self).__name__, what, checkpoint)
        refused.placeholder = self  # (a rehearsal names the layer it belongs to)
        return refused

    # --- shape queries are refused, consistently ----------------------------------------
    # (in a factory's first run, its probe answers: see PROBE)
    @property
    def shape(self) -> torch.Size:  # type: ignore[override]
        probe: torch.Tensor | None = self.__dict__.get(PROBE)
        if probe is not None:
            return probe.shape
        raise self._refuse("Tensor.shape")

    @property
    def ndim(self) -> int:  # type: ignore[override]
        probe: torch.Tensor | None = self.__dict__.get(PROBE)
        if probe is not None:
            return probe.ndim
        raise self._refuse("Tensor.ndim")

    def size(self, dim: int | None = None) -> Any:
        probe = self.__dict__.get(PROBE)
        if probe is not None:
            return probe.size() if dim is None else probe.size(dim)
        raise self._refuse("Tensor.size()")

    def __hash__(self) -> int:
        # torch.jit.trace puts each parameter in a set (TracedModule's check_unique) before
        # its own check, whose message says to run a forward pass: refuse with lazynn's
        # recipe. Only the direct caller is looked at: hashing is frequent (parameters()).
        # (Tensor.__hash__ does not go through __torch_function__.)
        caller = sys._getframe(1).f_code
        if caller.co_name == "check_unique" and caller.co_filename.endswith("_trace.py"):
            refusal = self._wrapper_refusal()
            if refusal is not None:
                raise refusal
        return id(self)

    def share_memory_(self) -> Any:
        raise self._refuse("Tensor.share_memory_() (module.share_memory())")

    def set_(self, *args: Any, **kwargs: Any) -> Any:
        # (set_ reaches no __torch_function__: kept here, as the other in-place writes are)
        target = self.__dict__.get(DATA_OF, self)
        add(target, Init(torch.Tensor.set_, (SELF, *args), dict(kwargs)))
        return self

    # --- what a placeholder is -----------------------------------------------------------
    def materialize(
        self,
        shape: int | Sequence[int],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Become a real, uninitialized ``cls_to_become`` of ``shape``, in place.

        ``device`` and ``dtype`` default to the placeholder's own (as moved since its
        construction).
        """
        # (run by Python even inside a compiled hook: dynamo cannot read a placeholder's data)
        untraced(_materialize)(self, shape, device, dtype)

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        raw = _raw(self)
        grad = self.requires_grad
        return (
            f"<{type(self).__name__}(dtype={raw.dtype}, device={raw.device}, requires_grad={grad})>"
        )

    def _like(self, raw: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        """A new placeholder of this kind around ``raw``, keeping owner and persistence."""
        new = torch.Tensor._make_subclass(type(self), raw, requires_grad)
        for attr in ("_lazynn_owner", "_lazynn_checkpoint", "persistent", "_is_buffer", INITS):
            if attr in self.__dict__:
                setattr(new, attr, self.__dict__[attr])
        probe = self.__dict__.get(PROBE)
        if probe is not None:  # its own
            new.__dict__[PROBE] = torch.empty(probe.shape, dtype=raw.dtype, device="meta")
        return new

    def _data_alias(self) -> torch.Tensor:
        """A buffer placeholder like this one, named as it is (its ``.data``: see ``keep``)."""
        alias = torch.Tensor._make_subclass(UninitializedBuffer, _raw(self), False)
        for attr in ("_lazynn_owner", "_lazynn_checkpoint"):
            if attr in self.__dict__:
                setattr(alias, attr, self.__dict__[attr])
        return alias

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        if id(self) not in memo:
            raw = _raw(self)
            grad: bool = self.requires_grad
            memo[id(self)] = self._like(torch.empty(0, dtype=raw.dtype, device=raw.device), grad)
        copied: torch.Tensor = memo[id(self)]
        return copied

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        attr = getattr(owner, "__name__", None) if owner is not None else None
        self = args[0] if args else None
        # (a move, `module._apply`'s `param.data = moved_placeholder`, is the placeholder's own
        # even in a factory's first run: `.double()` in __init__ moves the layer)
        moving = (
            attr == "data"
            and getattr(func, "__name__", "") == "__set__"
            and len(args) == 2
            and is_placeholder(args[1])
        )
        if func not in NATIVE and not moving and any(probed(v) for v in (*args, *kwargs.values())):
            return on_probes(func, args, kwargs)
        if func is torch.Tensor.is_set_to and len(args) == 2 and not kwargs:
            # a question of storage identity, no value read: answered on the plain tensors
            # (torch's placeholder's `.data` is one: torchrl's target updaters ask it)
            return _raw(args[0]).is_set_to(_raw(args[1]))
        kept = keep(func, attr, args, kwargs)
        if kept is not None:
            return kept
        if func in CLONES and isinstance(self, _Placeholder) and DATA_OF in self.__dict__:
            # `p.data.clone()` / `p.detach().clone()` of an unbuilt p: torch's p.data is an
            # empty plain tensor, and its clone one too (torchrl's target networks take it,
            # then copy the source's values in once it is built)
            held = _raw(self)
            return torch.empty(0, dtype=held.dtype, device=held.device)
        with torch._C.DisableTorchFunctionSubclass():
            if attr in ALLOWED_ATTRIBUTES and getattr(func, "__name__", "") == "__get__":
                if attr == "requires_grad" and isinstance(self, _Placeholder) and distributed():
                    # DDP's constructor reads requires_grad first: refuse with the recipe.
                    refusal = self._wrapper_refusal()
                    if refusal is not None:
                        raise refusal
                return func(*args, **kwargs)
            if attr == "requires_grad" and getattr(func, "__name__", "") == "__set__":
                return func(*args, **kwargs)  # `p.requires_grad = False`, as torch allows
            if attr == "data" and getattr(func, "__name__", "") == "__set__":
                # `module._apply` moves a placeholder by `param.data = moved_placeholder`.
                if len(args) == 2 and is_placeholder(args[1]):
                    return func(*args, **kwargs)
            elif func in ALLOWED_METHODS:
                return func(*args, **kwargs)
            elif func in CONVERSIONS and isinstance(self, _Placeholder):
                raw = func(_raw(self), *args[1:], **kwargs)
                if raw is _raw(self) or not isinstance(raw, torch.Tensor):
                    return self if isinstance(raw, torch.Tensor) else raw  # e.g. p.type() -> str
                keep_grad = func is not torch.Tensor.detach and self.requires_grad
                return self._like(raw.detach(), keep_grad)
            elif func is torch.Tensor.requires_grad_ and isinstance(self, _Placeholder):
                return func(*args, **kwargs)
            elif func is torch.Tensor.copy_ and all(is_placeholder(a) for a in args[:2]):
                return self  # unbuilt into unbuilt: there is nothing to copy
            elif (
                func is torch.Tensor.copy_
                and len(args) >= 2
                and isinstance(args[0], torch.Tensor)
                and not is_placeholder(args[0])
                and args[0].numel() == 0
            ):
                # unbuilt into an empty tensor: torch's placeholder is an empty tensor, whose
                # copy does what torch does (nothing; or its own refusal of the shapes)
                # (torchrl's target updaters copy into their empty targets)
                return args[0].copy_(_raw(args[1]))
        values = [*args, *kwargs.values()]
        nested = [v for a in values if isinstance(a, (list, tuple)) for v in a]
        culprit = next((a for a in (*values, *nested) if isinstance(a, _Placeholder)), None)
        if culprit is None:
            raise UnbuiltError(f"an unbuilt placeholder was passed to {func_name(func)}")
        raise culprit._refuse(func_name(func))


def _materialize(
    placeholder: Placeholder,
    shape: int | Sequence[int],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> None:
    raw = _raw(placeholder)
    data = torch.empty(
        (shape,) if isinstance(shape, int) else tuple(shape),  # an int, as torch takes
        device=raw.device if device is None else device,
        dtype=raw.dtype if dtype is None else dtype,
    )
    fill(placeholder, data)


def fill(placeholder: Placeholder, data: torch.Tensor) -> None:
    """Make ``placeholder`` hold ``data`` and become a real tensor, keeping its identity."""
    with torch._C.DisableTorchFunctionSubclass():
        placeholder.data = data
    target = type(placeholder).cls_to_become
    if placeholder.__dict__.pop("_is_param", False):  # nn.Parameter(p.data): a parameter
        target = nn.Parameter
    placeholder.__class__ = target  # type: ignore[assignment]  # (a placeholder no more)
    for attr in ("_lazynn_owner", "_lazynn_checkpoint", "_is_buffer", "persistent", PROBE, INITS):
        placeholder.__dict__.pop(attr, None)


def hooks_materialize(tensor: object) -> bool:
    """Whether ``tensor`` is a placeholder whose class defines its own ``materialize()``
    (tensordict's batched placeholders add an agent dimension there): a build goes through
    it, as torch's lazy modules' builds do."""
    own = getattr(type(tensor), "materialize", None)
    return is_placeholder(tensor) and own not in _MATERIALIZES


class UninitializedParameter(_Placeholder, nn.UninitializedParameter):
    """A parameter whose shape is not known yet; becomes an ``nn.Parameter`` when built.

    Args:
        requires_grad: as ``nn.Parameter``. Default: ``True``.
        device: where it will be allocated. Default: the current default device.
        dtype: its dtype. Default: the current default dtype.

    >>> import torch, lazynn
    >>> layer = lazynn.LazyLinear(4)
    >>> type(layer.weight).__name__, isinstance(layer.weight, torch.nn.UninitializedParameter)
    ('UninitializedParameter', True)
    >>> _ = layer(torch.ones(2, 3))
    >>> type(layer.weight).__name__, layer.weight.shape
    ('Parameter', torch.Size([4, 3]))
    """

    cls_to_become = nn.Parameter

    def __new__(cls, *args: Any, **kwargs: Any) -> UninitializedParameter:
        """As torch's; or ``cls(data, **param.__dict__)``, how tools rebuild a parameter of a
        subclass (accelerate's ``init_empty_weights``): a placeholder like ``data``, with the
        attributes given."""
        if args and isinstance(args[0], torch.Tensor):
            (like,) = args
            raw = _raw(like) if is_placeholder(like) else like
            grad = bool(kwargs.pop("requires_grad", like.requires_grad))
            new = torch.Tensor._make_subclass(
                cls, torch.empty(0, device=raw.device, dtype=raw.dtype), grad
            )
            new.__dict__.update(kwargs)
            return new
        try:
            return _new_parameter(cls, *args, **kwargs)
        except TypeError as error:  # (worded as torch's constructor, not the helper)
            raise TypeError(str(error).replace("_new_parameter()", f"{cls.__name__}()")) from None

    def __reduce_ex__(self, proto: Any) -> tuple[Any, ...]:
        raw = _raw(self)
        marker = self.__dict__.get("_lazynn_checkpoint")
        inits = self.__dict__.get(INITS, ())  # (kept initializations travel with it)
        arguments = (type(self), self.requires_grad, raw.device, raw.dtype, True, marker)
        return (_rebuild, (*arguments, inits) if inits else arguments)


def _new_parameter(
    cls: type[UninitializedParameter],
    requires_grad: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> UninitializedParameter:
    data = torch.empty(0, device=device, dtype=dtype)
    return torch.Tensor._make_subclass(cls, data, requires_grad)


# torch's signature, for help() and the API reference (cls(tensor, **attrs) is for tools)
UninitializedParameter.__new__.__signature__ = inspect.signature(_new_parameter)  # type: ignore[attr-defined]


class UninitializedBuffer(_Placeholder, nn.UninitializedBuffer):
    """A buffer whose shape is not known yet; becomes a plain ``torch.Tensor`` when built.

    Args:
        requires_grad: Default: ``False``.
        device: where it will be allocated. Default: the current default device.
        dtype: its dtype. Default: the current default dtype.
        persistent: whether it is part of the ``state_dict`` when assigned as an attribute.

    >>> import torch, lazynn
    >>> norm = lazynn.LazyBatchNorm1d()
    >>> buffer = norm.running_mean
    >>> type(buffer).__name__, isinstance(buffer, torch.nn.UninitializedBuffer)
    ('UninitializedBuffer', True)
    >>> _ = norm(torch.randn(4, 3))
    >>> type(norm.running_mean).__name__, norm.running_mean.shape
    ('Tensor', torch.Size([3]))
    """

    cls_to_become = torch.Tensor
    #: what torch's ``nn.Buffer`` instance check reads
    _is_buffer: bool

    def __new__(
        cls,
        requires_grad: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        persistent: bool = True,
    ) -> UninitializedBuffer:
        """As torch's, with ``persistent``."""
        data = torch.empty(0, device=device, dtype=dtype)
        new = torch.Tensor._make_subclass(cls, data, requires_grad)
        new.persistent = persistent
        new._is_buffer = True
        return new

    def __reduce_ex__(self, proto: Any) -> tuple[Any, ...]:
        raw = _raw(self)
        persistent = self.__dict__.get("persistent", True)
        marker = self.__dict__.get("_lazynn_checkpoint")
        inits = self.__dict__.get(INITS, ())  # (kept initializations travel with it)
        arguments = (type(self), self.requires_grad, raw.device, raw.dtype, persistent, marker)
        return (_rebuild, (*arguments, inits) if inits else arguments)


def _rebuild(
    cls: type[torch.Tensor],
    requires_grad: bool,
    device: torch.device,
    dtype: torch.dtype,
    persistent: bool,
    checkpoint: str | None,
    inits: tuple[Any, ...] = (),
) -> torch.Tensor:
    """Unpickle a placeholder (registered as a safe global for ``torch.load``), with the
    initializations kept on it."""
    new: torch.Tensor
    if cls is UninitializedBuffer:
        new = UninitializedBuffer(requires_grad, device, dtype, persistent)
    elif cls is UninitializedParameter:
        new = UninitializedParameter(requires_grad, device, dtype)
    else:
        raise TypeError(f"not a lazynn placeholder class: {cls!r}")
    if checkpoint is not None:
        new._lazynn_checkpoint = checkpoint
    if inits:
        new.__dict__[INITS] = tuple(inits)
    return new


def relocate(
    placeholder: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A new placeholder like ``placeholder`` (lazynn's or torch's) on ``device`` / ``dtype``.

    torch's own placeholders cannot be moved (their ``.to`` returns a plain empty tensor),
    so a fresh one of the same class is made.
    """
    if isinstance(placeholder, _Placeholder):
        raw = _raw(placeholder)
        new = torch.empty(0, dtype=dtype or raw.dtype, device=device)
        return placeholder._like(new, placeholder.requires_grad)
    kind: Any = type(placeholder)  # (torch's placeholder classes: untyped constructors)
    moved: torch.Tensor = kind(
        requires_grad=placeholder.requires_grad, device=device, dtype=dtype or placeholder.dtype
    )
    return moved


def is_lazy(obj: object) -> bool:
    """Whether ``obj`` still waits for its sizes.

    For a tensor: is it a placeholder (as ``torch.nn.parameter.is_lazy``)? For a module: is
    it, or any module below it, not built yet?

    >>> import lazynn
    >>> model = lazynn.LazyLinear(4)
    >>> lazynn.is_lazy(model), lazynn.is_lazy(model.weight)
    (True, True)
    """
    if isinstance(obj, nn.Module):
        return (
            # (an unbuilt lazy module still has its build hook; a built one that kept its
            # class, cls_to_become = None, has not)
            any(isinstance(m, TorchLazy) and hasattr(m, "_initialize_hook") for m in obj.modules())
            or any(is_placeholder(t) for t in obj.parameters())
            or any(is_placeholder(t) for t in obj.buffers())
        )
    return is_placeholder(obj)


def placeholder_for(
    tensor: torch.Tensor,
    kind: type[UninitializedParameter] | type[UninitializedBuffer],
    device: torch.device,
    owner: nn.Module,
    prefix: str,
    name: str,
) -> torch.Tensor:
    """A placeholder of ``kind`` standing for ``tensor`` (its dtype and ``requires_grad``) on
    ``device``, named in errors as the ``prefix.name`` of ``owner``."""
    placeholder = kind(requires_grad=tensor.requires_grad, device=device, dtype=tensor.dtype)
    label = f"{prefix}.{name}" if prefix else name
    placeholder._lazynn_owner = f"the '{label}' of {type(owner).__name__}"
    if kind is UninitializedBuffer:
        del placeholder.__dict__["_is_buffer"], placeholder.__dict__["persistent"]
    return placeholder


#: how a pickled placeholder is rebuilt (registered with torch.load's safe globals)
rebuild_placeholder = _rebuild

#: the ``materialize`` of lazynn's and torch's own placeholder classes
_MATERIALIZES = frozenset({_Placeholder.materialize, Placeholder.materialize})
