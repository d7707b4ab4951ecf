"""Code written on an unbuilt placeholder: initialization kept for the build, or run on a probe.

In the instance form (``model = Net()``, then a build), a model's ``__init__`` may initialize
its lazy layers' placeholders before their sizes are known: ``nn.init.normal_(m.weight,
std=0.02)``, ``nn.init.zeros_(m.bias)``, ``m.weight.data.normal_(0, 0.02)``. These calls fill
every element by the same rule whatever the shape, so the placeholder records them (an
:class:`Init` each, numbered in the order the program wrote them) and the build runs them on
the built tensor, after the layer's own construction. Which calls are kept:

* ``torch.nn.init`` functions that reach a placeholder's ``__torch_function__`` whole:
  ``normal_``, ``uniform_``, ``constant_``, ``kaiming_uniform_`` (its fan is computed at the
  build, from the real shape);
* in-place fills: ``Tensor.normal_``, ``uniform_``, ``zero_``, ``fill_`` (so ``zeros_``,
  ``ones_``, and the same on ``.data``);
* ``nn.init.trunc_normal_``, which has no ``__torch_function__`` entry: its helper asks
  ``tensor.is_meta`` first (and returns at once for a meta tensor); asked so by that helper
  (``torch.nn.init._no_grad_trunc_normal_``, a private function:
  tests/ecosystem/test_torch_internals.py
  checks the frame), the placeholder records the call from the helper's arguments and answers
  True.

Initializers that need the shape before they fill (``xavier_*``, ``kaiming_normal_``,
``orthogonal_``, ``eye_``, ``dirac_``) ask for it first, and are refused, naming the factory
form (``lazynn.build(Net, example)``), which runs the model's own ``__init__`` with every size
known.

In a factory's first run (``lazynn.build(Net, ...)``, ``_layer/layout.py``), a placeholder carries a
*probe* (:data:`PROBE`): a meta tensor of its layer's probe shape. Any operation on it runs on
the probe (:func:`on_probes`), so the model's own ``__init__`` runs to its end on meta, drawing
nothing; the second run does it for real.

>>> import torch, lazynn
>>> layer = lazynn.LazyLinear(2)
>>> _ = torch.nn.init.constant_(layer.weight, 0.5)
>>> [init.text() for init in inits_of(layer.weight)]
['torch.nn.init.constant_(val=0.5)']
>>> _ = layer(torch.ones(1, 3))
>>> layer.weight.unique().tolist()
[0.5]
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch import nn

from .._errors import Fix, LazynnError, UnbuiltError, first_line, frame_locals, func_name, message
from .callers import find_tool, frames, is_users
from .state import constructed, context, next_order
from .tensors import is_placeholder, raw

__all__ = [
    "DATA_OF",
    "INITS",
    "PROBE",
    "SELF",
    "Init",
    "add",
    "inits_of",
    "keep",
    "on_probes",
    "probed",
    "run",
]

#: a placeholder's attribute: the :class:`Init` calls recorded on it, in order
INITS = "_lazynn_inits"
#: the attribute of a placeholder's ``.data``: the placeholder it is the data of
DATA_OF = "_lazynn_data_of"
#: a placeholder's attribute in a factory's first run (``_layer/layout.py``): the meta tensor of the
#: layer's probe shape that stands for it in the model's own ``__init__`` code
PROBE = "_lazynn_probe"


class _Self:
    """Where the placeholder stood in a recorded call's arguments."""

    def __repr__(self) -> str:
        return "<the tensor>"

    def __reduce__(self) -> str:
        return "SELF"  # (one object: a pickled Init finds it again)


SELF = _Self()

#: torch.nn.init functions that call __torch_function__ with the whole call
_FUNCTIONS: frozenset[Callable[..., Any]] = frozenset(
    {nn.init.normal_, nn.init.uniform_, nn.init.constant_, nn.init.kaiming_uniform_}
)
#: in-place methods that fill every element by one rule
_METHODS: frozenset[Callable[..., Any]] = frozenset(
    {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_}
)


@dataclass(frozen=True)
class Init:
    """One recorded initialization: ``fn(*args, **kwargs)`` with the tensor for ``SELF``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: the order the program wrote it in; copies of a placeholder keep it
    order: int = field(default_factory=next_order)
    #: how many lazy layers the program had constructed when it wrote it (``build`` runs it
    #: after constructing those, before the next)
    after: int = field(default_factory=constructed)
    #: the state of the generator it names (``generator=g``) when it was written, or None
    drawn_from: torch.Tensor | None = None
    #: the CPU generator's state when the program wrote it (in ``__init__``): the instance
    #: form's build runs it before the eager layer constructed from that state on
    rng: torch.Tensor | None = None

    def run(self, tensor: torch.Tensor) -> None:
        """Run it on ``tensor`` (without autograd, as ``nn.init`` and ``.data`` do). Drawn
        from a generator of its own that has moved since it was written, it is not the
        eager numbers: a warning says so."""
        args = tuple(tensor if a is SELF else a for a in self.args)
        kwargs = {k: tensor if v is SELF else v for k, v in self.kwargs.items()}
        generator = kwargs.get("generator")
        if isinstance(generator, torch.Generator) and self.drawn_from is not None:
            self._check(generator, self.drawn_from)
        with torch.no_grad():
            self.fn(*args, **kwargs)

    def _check(self, generator: torch.Generator, then: torch.Tensor) -> None:
        """Warn if ``generator`` drew since the initialization was written (at ``then``)."""
        if not torch.equal(generator.get_state(), then):
            warnings.warn(
                f"lazynn: the initialization {self.text()} kept on an unbuilt placeholder "
                "draws from a generator that has drawn since it was written: its numbers "
                "are not the eager program's (which drew them then). Draw from the default "
                "generator, or construct the model with lazynn.build(Net, example) (the "
                "factory form), which runs the initialization where it is written",
                stacklevel=5,
            )

    def text(self) -> str:
        """``torch.nn.init.normal_(std=0.02)``, for messages."""
        shown = [repr(a) for a in self.args if a is not SELF]
        shown += [f"{k}={v!r}" for k, v in self.kwargs.items() if v is not SELF]
        return f"{func_name(self.fn)}({', '.join(shown)})"


def _is(value: Any, placeholder: torch.Tensor) -> bool:
    return value is placeholder or (
        isinstance(value, torch.Tensor) and value.__dict__.get(DATA_OF) is placeholder
    )


def _target(value: Any) -> torch.Tensor | None:
    """The placeholder ``value`` is, or is the ``.data`` of; or None."""
    if not is_placeholder(value):
        return None
    target: torch.Tensor = value.__dict__.get(DATA_OF, value)
    return target


def _data_of(placeholder: Any) -> torch.Tensor:
    """A placeholder's ``.data`` (or ``detach()``): a placeholder that records on it (there is
    no data to detach from), and is not a Parameter, as torch's ``p.data`` is a plain tensor:
    assigned to a module it registers nothing."""
    return _alias(placeholder, placeholder._data_alias())


def _detached(placeholder: Any) -> torch.Tensor:
    """A placeholder's ``detach()``: a view of its class (``nn.Parameter(p)`` and
    ``state_dict`` detach it), recording on it."""
    return _alias(placeholder, placeholder._like(raw(placeholder), requires_grad=False))


def _alias(placeholder: Any, alias: torch.Tensor) -> torch.Tensor:
    """``alias``, a new placeholder, made to record what is written on it on ``placeholder``."""
    alias.__dict__[DATA_OF] = placeholder
    alias.__dict__.pop(INITS, None)  # (what is written on it is the placeholder's)
    return alias


def keep(
    func: Callable[..., Any],
    attr: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """What a placeholder's ``__torch_function__`` answers to initialization code written on
    it before the build: its ``.data`` (a placeholder that records on it), a fill it records
    (the placeholder is returned, as the fill returns its tensor), ``is_meta`` asked by
    ``trunc_normal_``'s helper; None for anything else (the placeholder then refuses)."""
    first = args[0] if args else kwargs.get("tensor")
    target = _target(first)
    if target is None:
        return None
    getter = getattr(func, "__name__", "") == "__get__"
    if first is target and attr == "data" and getter:
        return _data_of(first)  # (its .data: writes on it are its own)
    if first is target and func is torch.Tensor.detach:
        return _detached(first)
    if attr == "is_meta" and getter:
        # (the frame that asked: this function's caller's caller; read only here, as
        # torch.compile cannot trace sys._getframe)
        init = from_trunc_normal(sys._getframe(2), target)
        if init is None:
            return None
        add(target, init)
        return True  # (trunc_normal_ returns at once for a meta tensor: recorded instead)
    init = from_call(func, args, kwargs, target)
    if init is None:
        return None
    add(target, init)
    return first


def probed(value: Any) -> bool:
    """Whether ``value`` (or a list or tuple of values) holds a placeholder with a probe."""
    if isinstance(value, (list, tuple)):
        return any(probed(v) for v in value)
    return is_placeholder(value) and PROBE in value.__dict__


def on_probes(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` run with each placeholder that has a probe replaced by it (a factory's first
    run: on meta, nothing is computed or drawn); a probe returned stands for its placeholder."""
    swapped: dict[int, torch.Tensor] = {}

    def swap(value: Any) -> Any:
        probe = value.__dict__.get(PROBE) if is_placeholder(value) else None
        if probe is None:
            if isinstance(value, (list, tuple)):
                return type(value)(swap(v) for v in value)
            return value
        swapped[id(probe)] = value
        return probe

    try:
        result = func(*(swap(a) for a in args), **{k: swap(v) for k, v in kwargs.items()})
    except LazynnError:
        raise
    except Exception as error:  # (a step the stand-in sizes cannot take: the real cause)
        raise _stand_in_refusal(func, list(swapped.values()), error) from error
    if isinstance(result, torch.Tensor) and id(result) in swapped:
        return swapped[id(result)]
    return result


def _stand_in_refusal(
    func: Callable[..., Any], placeholders: list[torch.Tensor], error: Exception
) -> UnbuiltError:
    """The refusal of a step of a factory's ``__init__`` that failed on a lazy layer's
    stand-in (its probe): the step may need the sizes the first input decides (``weight[:,
    3]``, a ``copy_`` of a tensor of the real shape) or the tensor's values, which the
    factory's first run does not have; or it fails in eager code too (torch's words say)."""
    program = context().program
    where = getattr(program, "where", "lazynn.build(factory)")
    owners = ", ".join(
        f"{getattr(p, '_lazynn_owner', 'a lazy layer')} (standing as a tensor of shape "
        f"{tuple(p.__dict__[PROBE].shape)})"
        for p in placeholders
    )
    line = next(
        (
            f" at {f.f_code.co_filename}:{f.f_lineno}"
            for f in frames(2)
            if is_users(f.f_code.co_filename)
        ),
        "",
    )
    return UnbuiltError(
        message(
            where,
            "a factory whose __init__ steps on a lazy layer's tensors need neither their "
            "values nor the sizes the first input decides (the factory's first run, on "
            "meta, knows neither yet: each lazy tensor stands as a meta tensor whose "
            "input-decided sizes are stand-ins)",
            f"{func_name(func)} on {owners}{line}, which failed there",
            "if the step fails in eager code too, torch's words below say why; else write "
            "the sizes it needs into the layer (nn.Linear(in_features, out_features) instead "
            "of its lazy one), or queue it until the layer is built: lazynn.on_build(layer, "
            "fn) (in the factory form it runs as the layer is built, where eager code ran it)",
            detail=first_line(error),
            key=Fix.ON_BUILD,
        )
    )


def from_call(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], target: torch.Tensor
) -> Init | None:
    """The :class:`Init` of ``func(*args, **kwargs)`` on ``target`` (a placeholder, or its
    ``.data``: recorded on the placeholder), or None if the call is not one to keep."""
    if func not in _FUNCTIONS and not _in_place(func):
        return None
    first = args[0] if args else kwargs.get("tensor")
    if first is None or not _is(first, target):
        return None
    others = [v for v in (*args[1:], *kwargs.values()) if not _is(v, target)]
    if any(is_placeholder(v) for v in others):
        return None  # (an unbuilt tensor into an unbuilt one: nothing to keep; torch's no-op)
    if func not in _FUNCTIONS and func not in _METHODS:
        if _tool() is not None:
            return None  # (a tool's write, AveragedModel's update: refused, with its fix)
        if first is target and target.requires_grad and torch.is_grad_enabled():
            # (as eager code is refused it: an in-place step on a parameter autograd tracks)
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation."
            )
    generator = kwargs.get("generator")
    drawn = generator.get_state() if isinstance(generator, torch.Generator) else None
    now = torch.get_rng_state()
    if args:
        return Init(func, (SELF, *args[1:]), dict(kwargs), drawn_from=drawn, rng=now)
    return Init(func, (), {**kwargs, "tensor": SELF}, drawn_from=drawn, rng=now)


#: in-place methods that are no initialization (they change how the tensor is tracked)
_NOT_WRITES = frozenset(
    {"requires_grad_", "share_memory_", "detach_", "retain_grad", "resize_", "resize_as_"}
)
#: in-place operators, as Python names them
_OPERATORS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__"}
)


def _tool() -> Any:
    """A torch tool on the stack that writes into a model after its construction (not
    ``torch.nn.init``, whose fills are initialization), or None."""
    found = find_tool()
    return found if found is not None and found.name != "torch.nn.init" else None


def _in_place(func: Callable[..., Any]) -> bool:
    """Whether ``func`` writes its first tensor in place (``mul_``, ``erfinv_``, ``copy_``,
    ``set_``, ``p[0] = 1``, ``p *= 2``): a write kept on a placeholder, to run at the build."""
    name = getattr(func, "__name__", "")
    if name in _OPERATORS:
        return True
    return name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES


def from_trunc_normal(frame: FrameType | None, target: torch.Tensor) -> Init | None:
    """``nn.init.trunc_normal_`` on ``target``, read from the frame of torch's helper that
    asks ``is_meta`` (see the module doc), or None if ``frame`` is not that helper's."""
    if frame is None or frame.f_code.co_name != "_no_grad_trunc_normal_":
        return None
    if not frame.f_code.co_filename.endswith("init.py"):
        return None
    found = frame_locals(frame, ("tensor", "mean", "std", "a", "b", "generator"))
    if not _is(found.pop("tensor", None), target) or len(found) != 5:
        return None
    return Init(nn.init.trunc_normal_, (SELF,), found, rng=torch.get_rng_state())


def add(placeholder: torch.Tensor, init: Init) -> None:
    """Record ``init`` on ``placeholder`` (after those recorded before)."""
    placeholder.__dict__[INITS] = (*inits_of(placeholder), init)


def inits_of(tensor: torch.Tensor) -> tuple[Init, ...]:
    """The initializations recorded on a placeholder, in the order written."""
    inits: tuple[Init, ...] = tensor.__dict__.get(INITS, ())
    return inits


def run(
    pending: Iterable[tuple[Init, torch.Tensor]], done: dict[int, torch.Tensor] | None = None
) -> None:
    """Run recorded initializations on their built tensors, in the order the program wrote
    them. Copies of one placeholder (``deepcopy``) hold the same record: it runs once, and
    each copy takes its values (as eager copies share their original's). ``done``: the tensor
    each record ran on so far, for runs in several parts (``build``)."""
    done = {} if done is None else done
    for init, tensor in sorted(pending, key=lambda pair: pair[0].order):
        first = done.get(init.order)
        if first is None:
            init.run(tensor)
            done[init.order] = tensor
        elif first is not tensor:
            with torch.no_grad():
                tensor.copy_(first)
