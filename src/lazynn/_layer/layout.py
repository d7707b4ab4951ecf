"""A lazy layer's construction: its layout of placeholders, or, in a factory's run, more.

``LazyLinear(10)`` runs :func:`lay_out`, which does one of three things:

* **usually**: run the eager ``__init__`` on meta with a *probe* value for each inferred size,
  so the layer has every attribute, submodule and tensor name of the eager one, then swap each
  tensor for a placeholder (dtype, device and ``requires_grad``; no shape) and each inferred
  attribute for ``UNKNOWN``; no memory, no random number;
* in the **first run of a factory** (``lazynn.build(Net, ...)``,
  :class:`~lazynn._module.state.Drafting`, on meta): the same, but its placeholders stand for
  meta tensors of the probe sizes and the inferred attributes keep their probe values, so the
  model's own ``__init__`` (an init loop, ``fan_in = conv.in_channels * k * k``) runs on them,
  drawing nothing; the layer is numbered in construction order;
* in the **second run** (:class:`~lazynn._module.state.Constructing`): the layer *becomes* its
  eager class, constructed for real with the sizes the first run learnt, exactly as the eager
  program ``nn.Linear(in_features, 10)`` constructs it (same random numbers, same place in the
  stream). A second run that constructs other layers than the first is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from .._errors import LazynnError, message
from .._module.callers import code_site
from .._module.kept import PROBE
from .._module.lifecycle import attach, own_work
from .._module.placeholder import UninitializedBuffer, UninitializedParameter, placeholder_for
from .._module.state import Constructing, Drafting, Entry, context, lazy_state, record_construction
from .._module.tensors import is_placeholder, own_slots
from .._program.record import recording, unrecorded
from .construct import construct, forward_names, hide_probes, new, of_torch, parameter_device
from .infer import CLASS_KEY, UNKNOWN, Infer
from .inputs import ambiguous_reading, read_sizes

__all__ = ["laid_out_eager", "lay_out", "same_arguments"]


def lay_out(
    layer: nn.Module,
    cls: type[nn.Module],
    specs: Mapping[str, Infer],
    known_buffers: frozenset[str],
    kwargs: dict[str, Any],
) -> None:
    """Construct ``layer``, a lazy layer that becomes ``cls`` (see the module doc)."""
    here = context()
    program = here.program
    if isinstance(program, Constructing):
        entry = _take(program, type(layer), kwargs)
        if entry.sizes is not None:
            here.program = None  # (what the eager class constructs is not the program's)
            try:
                _become(layer, entry.sizes, kwargs)
            finally:
                here.program = program
            return
    # (a rank-agnostic layer, not of the class it becomes, has its class from the rehearsal)
    if isinstance(program, Drafting) and _laid_eager(program) and isinstance(layer, cls):
        here.program = None
        try:
            _lay_out_eager(layer, cls, specs, kwargs, program)
        finally:
            here.program = program
        return
    here.program = None  # (a layout's own constructions are not the program's)
    try:
        with unrecorded():  # (placeholders and probes are no tensor's init program)
            _placeholders(layer, cls, specs, known_buffers, kwargs, program)
        if isinstance(program, Drafting):  # (a value the code may read: num_batches_tracked)
            _record_known(layer, known_buffers)
            _record_draws(layer, cls, specs, program)
    finally:
        here.program = program


def _laid_eager(drafting: Drafting) -> bool:
    """Whether the lazy layer being constructed in a factory's first run is laid out as its
    eager class (:attr:`Drafting.eager`, :attr:`Drafting.eager_sites`); notes its site."""
    index = len(drafting.entries)
    site = code_site()
    if site is not None:
        drafting.sites[index] = site
    return index in drafting.eager or site in drafting.eager_sites


def _lay_out_eager(
    layer: nn.Module,
    cls: type[nn.Module],
    specs: Mapping[str, Infer],
    kwargs: dict[str, Any],
    drafting: Drafting,
) -> None:
    """In a factory's first run, a lazy layer whose tensors a step of ``__init__`` needs
    (``weight_norm(LazyConv1d(8, 3))``; :attr:`Drafting.eager`): its eager class on meta, with
    the sizes an earlier run learnt or stand-ins, its draws recorded where eager makes them.

    Being no longer lazy, it reads its sizes in a rehearsal through a forward of this run's
    own: where its input gives other sizes than it was laid out with, the eager class with
    those sizes, on meta, answers for it (its own tensors, which the step transformed, have
    the stand-in's), and the next run is laid out with them (``draft.drafted``)."""
    index = len(drafting.entries)
    given = dict(kwargs)
    arguments = {k: v for k, v in kwargs.items() if k not in ("device", "dtype")}
    dtype = kwargs.get("dtype")
    learnt = drafting.known.get(index, {})
    sizes = {name: learnt.get(name, spec.probe_value(arguments)) for name, spec in specs.items()}
    known = all(name in learnt for name in specs)
    drafting.entries.append(Entry(type(layer), given, dict(sizes) if known else None))
    drafting.laid[index] = layer
    names = forward_names(cls)
    layer.__dict__.clear()
    layer.__class__ = cls
    construct(cls, {**arguments, **sizes}, "meta", dtype, into=layer)
    own = cls.forward.__get__(layer)

    def forward(*args: Any, **kw: Any) -> Any:
        # (the draft's own: the rehearsal puts back what the model reaches, so what it read
        # goes out with the rehearsal's record)
        read = read_sizes(layer, specs, names, args, kw)
        rehearsal = context().rehearsal
        if rehearsal is not None:
            rehearsal.sizes[id(layer)] = read
            note = ambiguous_reading(specs, names, args, kw)  # (the build warns, as lazy)
            if note is not None:
                rehearsal.notes[id(layer)] = note
        if read == sizes:
            return own(*args, **kw)
        return construct(cls, {**arguments, **read}, "meta", dtype, None)(*args, **kw)

    layer.forward = forward


def laid_out_eager(module: nn.Module) -> bool:
    """Whether ``module`` is a lazy layer a factory's first run laid out as its eager class
    (:func:`_lay_out_eager`: it still learns its sizes from its input, as a lazy one)."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__qualname__", "").startswith(_lay_out_eager.__name__ + ".")


def _record_known(layer: nn.Module, known_buffers: frozenset[str]) -> None:
    """A draft's known buffers (real zeros, which no input sizes) made again as the draft's
    recording sees them, so that ``__init__`` code reading one (``.item()``) reads eager's
    value, as it does outside a draft."""
    for name in known_buffers:
        held = layer._buffers.get(name)
        if held is not None and not is_placeholder(held):
            layer._buffers[name] = torch.zeros(held.shape, dtype=held.dtype, device=held.device)


def _record_draws(
    layer: nn.Module, cls: type[nn.Module], specs: Mapping[str, Infer], drafting: Drafting
) -> None:
    """In a draft laid out with a layer's sizes (learnt by an earlier run), the draws its
    eager construction makes, recorded where it makes them: a value ``__init__`` draws after
    it (``torch.randint(...).item()``: a number of blocks) is then the eager program's, as it
    is in the real run. Its tensors are dropped: only the draws are the program's."""
    state = lazy_state(layer)
    learnt = drafting.known.get(state.index)
    if not learnt or recording() is None or any(name not in learnt for name in specs):
        return
    sizes = {name: learnt[name] for name in specs}
    kind = learnt.get(CLASS_KEY, cls)
    construct(kind, {**state.kwargs, **sizes}, "meta", state.dtype, None)


def _take(program: Constructing, kind: type, kwargs: dict[str, Any]) -> Entry:
    """The entry of the lazy layer being constructed, checked against the first run's."""
    number = program.position
    program.position += 1
    entry = program.entries[number] if number < len(program.entries) else None
    if (
        entry is None
        or not _same_class(entry.cls, kind)
        or not same_arguments(entry.kwargs, kwargs)
    ):
        first = (
            f"{_shown(entry.cls, entry.kwargs)} at '{entry.path}'"
            if entry is not None
            else "no lazy layer"
        )
        raise LazynnError(
            message(
                f"lazynn.build(factory): lazy layer number {number + 1} the factory constructs",
                f"the layers of the factory's run on meta, in the same order ({first})",
                f"{_shown(kind, kwargs)} in its real run",
                "make the factory construct the same model each time it is called (it runs "
                "more than once: on meta to learn the sizes, then for real)",
                outcome="nothing was built",
            )
        )
    return entry


def _same_class(a: type, b: type) -> bool:
    """Whether two lazy classes are one declaration: the same class, or two that
    ``lazynn.lazy`` made of the same eager class and sizes (a helper calling ``lazy()`` each
    time it makes a layer makes a new class each time)."""
    if a is b:
        return True
    return (
        a.__qualname__ == b.__qualname__
        and getattr(a, "cls_to_become", None) is getattr(b, "cls_to_become", None)
        and getattr(a, "inferred", None) == getattr(b, "inferred", None)
        and getattr(a, "known_buffers", None) == getattr(b, "known_buffers", None)
    )


def _shown(kind: type, kwargs: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k not in ("device", "dtype"))
    return f"{kind.__name__}({shown})"


def same_arguments(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two constructions' arguments agree (tensors by shape and dtype, modules by
    class: the first run's are on meta)."""
    if a.keys() != b.keys():
        return False
    return all(_same(a[k], b[k]) for k in a)


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (
            isinstance(x, torch.Tensor)
            and isinstance(y, torch.Tensor)
            and x.shape == y.shape
            and x.dtype == y.dtype
        )
    if isinstance(x, nn.Module) or isinstance(y, nn.Module):
        return type(x) is type(y)
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(map(_same, x, y))
    try:
        return bool(x == y)
    except Exception:  # (an argument whose == does not answer with a bool)
        return x is y


def _become(layer: nn.Module, sizes: Mapping[str, Any], kwargs: dict[str, Any]) -> None:
    """Make ``layer`` its eager class, constructed for real with ``sizes``, as ``cls(...)``."""
    arguments = dict(kwargs)
    device = arguments.pop("device", None)
    dtype = arguments.pop("dtype", None)
    real = {k: v for k, v in sizes.items() if k != CLASS_KEY}
    chosen: type[nn.Module] = sizes.get(CLASS_KEY) or type(layer).cls_to_become  # type: ignore[attr-defined]
    layer.__dict__.clear()  # (a rank-agnostic layer has noted its ranks)
    layer.__class__ = chosen
    where = torch.device(device) if device is not None else torch.get_default_device()
    construct(chosen, {**arguments, **real}, where, dtype, into=layer)


def _placeholders(
    layer: nn.Module,
    cls: type[nn.Module],
    specs: Mapping[str, Infer],
    known_buffers: frozenset[str],
    kwargs: dict[str, Any],
    program: Drafting | Constructing | None,
) -> None:
    """The usual layout (and a factory's first run's, when ``program`` is a Drafting)."""
    drafting = program if isinstance(program, Drafting) else None
    given = dict(kwargs)
    if "_parameters" not in layer.__dict__:
        # nn.Module's own state first, as torch's lazy layers have it from their
        # super().__init__ (dynamo, tracing a construction inside a compiled function,
        # reads attributes through nn.Module.__getattr__)
        nn.Module.__init__(layer)
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    target = torch.device(device) if device is not None else torch.get_default_device()
    param_target = target if device is not None else parameter_device(target)
    state = lazy_state(layer)
    probes = {name: spec.probe_value(kwargs) for name, spec in specs.items()}
    if drafting is not None:  # sizes an earlier run learnt stand in for the probes
        learnt = drafting.known.get(len(drafting.entries), {})
        probes.update({name: value for name, value in learnt.items() if name in probes})
    # (the eager class's layout, under the modes running: its construction may call the
    # user's code, torch's global registration hooks, which make tensors where they say)
    if isinstance(layer, cls):
        new(cls, {**kwargs, **probes}, "meta", dtype, into=layer)
    else:  # not a subclass of the class it becomes (rank-agnostic): copy a meta layout
        layer.__dict__.update(new(cls, {**kwargs, **probes}, "meta", dtype).__dict__)
    # (the placeholders, lazynn's own work only: out of lazynn's modes, lifecycle.own_work)
    with own_work() if of_torch(cls) else nullcontext():
        devices = (target, param_target)
        _lay_out(layer, cls, known_buffers, probes, drafting, dtype, devices)
    if drafting is None:
        for name, spec in specs.items():
            if name in layer.__dict__:  # stored by the eager class (not all store it)
                unknown = (UNKNOWN,) * spec.trailing if spec.trailing else UNKNOWN
                setattr(layer, name, unknown)
        if layer._modules:  # (layouts of the eager class again: under the modes running)
            hide_probes(layer, cls, kwargs, probes, dtype)
    else:
        state.index = len(drafting.entries)
        drafting.entries.append(Entry(type(layer), given))
        drafting.owners.update((id(p), state.index) for p in state.placeholders.values())
    state.kwargs = kwargs
    state.device = target
    state.dtype = dtype if dtype is not None else torch.get_default_dtype()
    attach(layer)
    record_construction(layer)


def _lay_out(
    layer: nn.Module,
    cls: type[nn.Module],
    known_buffers: frozenset[str],
    probes: dict[str, Any],
    drafting: Drafting | None,
    dtype: torch.dtype | None,
    devices: tuple[torch.device, torch.device],
) -> None:
    """The placeholders of :func:`_placeholders`, once the eager class is laid out on the
    layer (``devices``: the buffers', the parameters')."""
    target, param_target = devices
    state = lazy_state(layer)
    # The layout's shapes, for the checkpoint solver (which asks for the probe sizes first)
    state.shapes[(cls, repr(sorted(probes.items())))] = {
        (prefix, name): tensor.shape
        for prefix, module in layer.named_modules()
        for _, name, tensor in own_slots(module)
    }
    for prefix, module in layer.named_modules():
        for store, name, tensor in own_slots(module):
            if not prefix and name in known_buffers and store is module._buffers:
                # a shape no input decides: a real tensor, as eager (and torch's lazy
                # norms) hold it
                store[name] = torch.zeros(tensor.shape, dtype=tensor.dtype, device=target)
                continue
            buffer = store is module._buffers
            kind = UninitializedBuffer if buffer else UninitializedParameter
            where = target if buffer else param_target
            placeholder = placeholder_for(tensor, kind, where, layer, prefix, name)
            if drafting is not None:  # its own meta tensor: the model's code may change it
                probe = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
                placeholder.__dict__[PROBE] = probe
            store[name] = state.placeholders[(prefix, name)] = placeholder
