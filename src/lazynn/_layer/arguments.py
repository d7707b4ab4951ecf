"""A lazy layer's constructor arguments against its eager class's signature: a half-ported
line refused.

Porting deletes the input size from a sized constructor: ``nn.Linear(768, 3072)`` becomes
``LazyLinear(3072)``. A line whose size was left in, ``LazyLinear(768, 3072)``, reads as
``out_features=768, bias=3072``, which torch accepts (a number is a truthy ``bias``): a layer of
768 outputs. Its arguments contradict the eager signature's types, so it is refused at
construction (:func:`check_arguments`, for every lazy layer: ``LazyLayer._lazynn_setup`` calls
it), with an :class:`~lazynn.ArgumentError` naming the line meant:

* a number other than 0 and 1 for a bool parameter: one that the lazy or the eager signature
  annotates ``bool`` (``Optional[bool]`` too), or that neither annotates and whose default is a
  bool. 0 and 1 (``bias=0``) and numpy's bools pass, as torch takes them: code that works with
  torch works here;
* an int of 1 or more for a fraction: a ``momentum``, or a parameter named ``eps`` or ending
  in ``_eps`` (``layer_norm_eps``), unless its annotation or default says it is no float.

The line meant is the one written, read as the eager line it was (its values in the eager
signature's positions), without the values in the inferred positions: ``LazyGroupNorm(32,
256)`` means ``nn.GroupNorm(32, 256)``, ported ``LazyGroupNorm(32)``.

A left-in size that no type contradicts (``LazyConv2d(3, 64)``: ``out_channels=3``,
``kernel_size=64``) shows at the first call, where the forward refuses the input: when the
value in an inferred position is the size the input gives, :func:`left_in_note` says so in
that error (the first call's, ``lazynn.build``'s and the summary's).

>>> import lazynn
>>> lazynn.LazyLinear(768, 3072)  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
lazynn._errors.ArgumentError: LazyLinear: expected bias to be a bool, as in nn.Linear,
received 3072. Note: an input size left in? LazyLinear(768, 3072) reads as out_features=768,
bias=3072. Fix: delete the input size, which lazynn infers: LazyLinear(3072); or pass
bias=True or bias=False
"""

from __future__ import annotations

import inspect
import numbers
import re
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from .._errors import ArgumentError, Parts

__all__ = ["check_arguments", "left_in_note"]

#: a parameter that takes a bool, one that takes a fraction below 1
_BOOL, _FRACTION = "bool", "fraction"
#: the names in an annotation that say nothing of its type ("Optional[bool]" is a bool's)
_NEUTRAL = frozenset({"None", "NoneType", "Optional", "Union", "typing", "builtins"})
#: the arguments a layer is placed with, never a size
_PLACEMENT = ("device", "dtype")
#: class -> its constructor's parameters; lazy class -> eager class -> its rules (weak: a
#: helper that calls lazynn.lazy for each layer it makes makes a class each time)
_PARAMETERS: weakref.WeakKeyDictionary[type, tuple[inspect.Parameter, ...]] = (
    weakref.WeakKeyDictionary()
)
_RULES: weakref.WeakKeyDictionary[type, dict[type, dict[str, str]]] = weakref.WeakKeyDictionary()


def check_arguments(
    kind: type[nn.Module],
    eager: type[nn.Module],
    kwargs: Mapping[str, Any],
    inferred: Collection[str],
) -> None:
    """Refuse ``kwargs``, the arguments of a lazy layer of class ``kind`` that becomes
    ``eager`` and infers the arguments ``inferred``, if one contradicts the eager signature's
    types (see the module doc)."""
    rules = _rules(kind, eager)
    for name, value in kwargs.items():
        rule = rules.get(name)
        if rule == _BOOL and _number(value) and value not in (0, 1):
            expected, instead = "a bool", f"pass {name}=True or {name}=False"
        elif rule == _FRACTION and _integer(value) and value >= 1:
            expected = "a float below 1"
            instead = f"if {name}={value!r} is meant, pass it as a float ({float(value)!r})"
        else:
            continue
        params = [p.name for p in _positional(kind)]
        port = None
        if name in params:  # (a keyword-only one is never a shifted positional value)
            port = _port(kind, eager, kwargs, inferred, params.index(name))
        fix = instead
        if port is not None:
            sizes = "sizes" if len(port.left) > 1 else "size"
            fix = f"delete the input {sizes}, which lazynn infers: {port.meant}; or {instead}"
        raise ArgumentError(
            Parts(
                kind.__name__,
                f"{name} to be {expected}, as in {_eager_name(kind, eager)}",
                repr(value),
                fix,
                notes=() if port is None else (f"{_question(port)} {port.reading}",),
            )
        )


def left_in_note(
    kind: type[nn.Module],
    eager: type[nn.Module],
    kwargs: Mapping[str, Any],
    sizes: Mapping[str, Any],
) -> str | None:
    """The note of a first call that failed when the lazy layer of class ``kind`` (becoming
    ``eager``), constructed with ``kwargs`` (its own arguments, without the inferred ones),
    read ``sizes`` from its input, if a value its line has in an inferred position (as the
    eager line) is the size read: an input size left in (``LazyConv2d(3, 64)`` on 3 channels,
    ``out_channels=3``, ``kernel_size=64``). Else None."""
    params = _positional(kind)
    last = max((i for i, p in enumerate(params) if p.default is p.empty), default=0)
    inferred = [n for n, v in sizes.items() if not isinstance(v, type)]  # (not a class chosen)
    port = _port(kind, eager, kwargs, inferred, last)
    if port is None:
        return None
    same = [f"{n}={v!r}" for n, v in port.left.items() if _integer(v) and sizes.get(n) == v]
    if not same:
        return None
    return (
        f"{_question(port)} {port.reading}, and the input gives {', '.join(same)}; a port "
        f"deletes the input {'sizes' if len(port.left) > 1 else 'size'}: {port.meant}"
    )


# --- the line meant -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Port:
    """A lazy layer's line, read as the eager line it was (see the module doc)."""

    #: the line as written, by position (``LazyLinear(768, 3072)``)
    written: str
    #: how lazynn reads it (``reads as out_features=768, bias=3072``)
    reading: str
    #: the line without its values in the inferred positions (``LazyLinear(3072)``)
    meant: str
    #: inferred name -> the value written in its position
    left: dict[str, Any]


def _question(port: _Port) -> str:
    return f"an input size left in? {port.written}"


def _port(
    kind: type[nn.Module],
    eager: type[nn.Module],
    kwargs: Mapping[str, Any],
    inferred: Collection[str],
    last: int,
) -> _Port | None:
    """The line whose arguments up to the lazy signature's positional parameter number
    ``last`` were written by position, as an eager line; None if no inferred position is among
    them (nothing was left in)."""
    lazy = _positional(kind)[: last + 1]
    if any(p.name not in kwargs for p in lazy):
        return None
    shown = [kwargs[p.name] for p in lazy]
    order = [p.name for p in _positional(eager)] or [*inferred, *(p.name for p in lazy)]
    if len(order) < len(shown):
        return None
    left = {name: v for name, v in zip(order, shown, strict=False) if name in inferred}
    if not left:
        return None
    kept = [v for name, v in zip(order, shown, strict=False) if name not in inferred]
    after = [p for p in _parameters(kind) if p.name in kwargs and p not in lazy]
    more = any(not _is_default(kwargs[p.name], p.default) for p in after)
    required = sum(1 for p in _positional(kind) if p.default is p.empty)
    written = [*map(repr, shown), *(["..."] if more else [])]
    meant = [*map(repr, kept), *(["..."] if more or len(kept) < required else [])]
    return _Port(
        written=f"{kind.__name__}({', '.join(written)})",
        reading="reads as " + ", ".join(f"{p.name}={kwargs[p.name]!r}" for p in lazy),
        meant=f"{kind.__name__}({', '.join(meant)})",
        left=left,
    )


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return bool(value == default) and type(value) is type(default)
    except Exception:  # (an argument whose == does not answer with a bool: a tensor)
        return False


# --- the signatures -------------------------------------------------------------------------


def _positional(cls: type) -> list[inspect.Parameter]:
    """The parameters of ``cls``'s constructor a call may give by position (after ``self``),
    without the device and dtype."""
    return [
        p
        for p in _parameters(cls)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _PLACEMENT
    ]


def _parameters(cls: type[object]) -> tuple[inspect.Parameter, ...]:
    """The parameters of ``cls``'s constructor after ``self`` (none if it has no signature)."""
    known = _PARAMETERS.get(cls)
    if known is None:
        try:
            signature = inspect.signature(cls.__init__)
            known = tuple(list(signature.parameters.values())[1:])
        except (TypeError, ValueError):
            known = ()
        _PARAMETERS[cls] = known
    return known


def _rules(kind: type[nn.Module], eager: type[nn.Module]) -> dict[str, str]:
    """Parameter name -> its rule (``_BOOL``, ``_FRACTION``), read off the lazy class's
    signature and the eager class's (torch's recurrent layers take ``*args``: their lazy
    classes' signatures name the parameters)."""
    by_eager = _RULES.get(kind)
    if by_eager is None:
        by_eager = _RULES[kind] = {}
    rules = by_eager.get(eager)
    if rules is None:
        rules = by_eager[eager] = _read_rules(kind, eager)
    return rules


def _read_rules(kind: type[nn.Module], eager: type[nn.Module]) -> dict[str, str]:
    annotations: dict[str, list[frozenset[str]]] = {}
    defaults: dict[str, Any] = {}
    for cls in (kind, eager):
        for p in _parameters(cls):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in _PLACEMENT:
                continue
            if p.annotation is not p.empty:
                annotations.setdefault(p.name, []).append(_type_names(p.annotation))
            if p.default is not p.empty:
                defaults.setdefault(p.name, p.default)
    rules = {}
    for name in {*annotations, *defaults}:
        said = annotations.get(name, [])
        default = defaults.get(name, inspect.Parameter.empty)
        if frozenset({"bool"}) in said or (not said and isinstance(default, bool)):
            rules[name] = _BOOL
        elif _fraction_name(name) and _may_be_float(said, default):
            rules[name] = _FRACTION
    return rules


def _type_names(annotation: Any) -> frozenset[str]:
    """The type names an annotation allows (``"float | None"`` -> ``{"float"}``), without
    ``None`` and the words of ``typing``."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    words = re.findall(r"[A-Za-z_]\w*", text)
    return frozenset(w for w in words if w not in _NEUTRAL)


def _fraction_name(name: str) -> bool:
    return name in ("eps", "momentum") or name.endswith("_eps")


def _may_be_float(said: list[frozenset[str]], default: Any) -> bool:
    """Whether the annotations (if any) allow a float, and the default is no int."""
    if said and not any("float" in names for names in said):
        return False
    return not _integer(default)


def _integer(value: Any) -> bool:
    """An int (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    """A real number (numpy's too), not a bool (numpy's bool is no ``numbers.Real``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _eager_name(kind: type[nn.Module], eager: type[nn.Module]) -> str:
    """``nn.Linear`` for torch.nn's classes, the class's name for others; ``nn.MaxPool1d/2d/3d``
    for a rank-agnostic layer (laid out as its 1d class, not a subclass of it)."""
    name = eager.__name__
    if not issubclass(kind, eager) and name.endswith("1d"):
        name = f"{name}/2d/3d"
    return f"nn.{name}" if getattr(nn, eager.__name__, None) is eager else name
