"""A model's construction as data: the steps that made and wrote each of its tensors.

A :class:`Tape` is what :class:`~lazynn._program.record.Recorder` wrote while a construction
ran on meta: every operation on a tensor, in program order, as a :class:`Step`. A tensor in a
step is a :class:`View`: a storage of the tape (by number) and where the tensor sits in it
(size, stride, offset, dtype), so that a view, an in-place write through it and a tie are
what they are in eager code, and the tape holds no tensor of the model (it copies, pickles and
moves with the model). A real tensor a step reads (a buffer the code made on the CPU, a numpy
array) is a :class:`Const`: its value when read. Random steps name their generator: the
device's own (``None``), or one of the tape's ``generators``, whose states at the start the
tape keeps. A step that sets a generator (``torch.manual_seed`` in ``__init__``) is a
:data:`RESEED` step; one that puts back a state the code saved earlier
(``torch.set_rng_state(saved)``, ``torch.random.fork_rng()``'s exit) a :data:`RESTORE` step.

>>> tape = Tape()
>>> where = View(0, (2, 3), (3, 1), 0, torch.float32)
>>> tape.steps.append(Step("aten::empty.memory_format", ([2, 3],), {}, (where,), creates=(0,)))
>>> tape.steps[0].creates, tape.storages
((0,), 0)
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "LIKE_OPS",
    "RESEED",
    "RESTORE",
    "Const",
    "GeneratorRef",
    "Like",
    "Step",
    "Tape",
    "View",
    "as_view",
    "extent",
    "is_contiguous",
    "resolve",
    "takes_generator",
    "uninitialized",
    "views_in",
    "with_generator",
]

#: the op of a step that sets a generator's state (its one argument: the state)
RESEED = "lazynn::reseed"
#: the op of a step that sets a generator back to a state it had at an earlier place of the
#: program (its arguments: the generator that had it, None for the default one; the step after
#: which it had it, -1 for the tape's start)
RESTORE = "lazynn::restore"


@dataclass(frozen=True)
class View:
    """A tensor in a step: storage number ``storage`` of the tape, seen with this geometry."""

    storage: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.size:
            n *= d
        return n


@dataclass(frozen=True)
class Like:
    """A tensor a step reads only the shape, strides and dtype of (``empty_like(t)``,
    ``t.new_zeros(...)``): no value, and no storage of the tape."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Const:
    """A real tensor a step read: its value then (``tape.consts[index]``)."""

    index: int


@dataclass(frozen=True)
class GeneratorRef:
    """A generator a random step drew from: ``tape.generators[index]``."""

    index: int


@dataclass(frozen=True)
class Step:
    """One operation: ``op`` (an aten op's name, ``aten::normal_.default``; a function's,
    ``torch.nn.init.trunc_normal_``; or :data:`RESEED`) with its arguments, its tensor
    outputs, and the storages it creates, writes and reads."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: tuple[View | None, ...] = ()
    creates: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    reads: tuple[int, ...] = ()
    #: whether it draws from a generator
    random: bool = False
    #: whether the storages it creates start uninitialized (``empty``)
    uninitialized: bool = False


@dataclass
class Tape:
    """The steps of one construction, in program order (see the module doc)."""

    steps: list[Step] = field(default_factory=list)
    #: how many storages the steps create or name
    storages: int = 0
    #: values of the real tensors steps read
    consts: list[torch.Tensor] = field(default_factory=list)
    #: the generators random steps name: their state at the start of the tape
    generators: list[torch.Tensor] = field(default_factory=list)
    #: storages made before the tape began (their number -> why they have no program)
    external: dict[int, str] = field(default_factory=dict)
    #: weak references to the generators ``generators`` are the states of (a replay leaves
    #: each where the program leaves it); not kept by a copy or a pickle
    owners: list[Any] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["owners"] = []
        # (torch.save pickles with protocol 2, where a torch.memory_format cannot be pickled:
        # `.contiguous()` in __init__ records one; kept by name)
        state["steps"] = [_named_formats(step, _FormatName.of) for step in self.steps]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.steps = [_named_formats(step, _FormatName.back) for step in self.steps]


@dataclass(frozen=True)
class _FormatName:
    """A ``torch.memory_format`` in a pickled tape: its name (``channels_last``)."""

    name: str

    @staticmethod
    def of(value: Any) -> Any:
        if isinstance(value, torch.memory_format):
            return _FormatName(str(value).removeprefix("torch."))
        return value

    @staticmethod
    def back(value: Any) -> Any:
        return getattr(torch, value.name) if isinstance(value, _FormatName) else value


def _named_formats(step: Step, convert: Any) -> Step:
    """``step`` with each argument passed through ``convert`` (in lists and tuples too)."""

    def each(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(each(v) for v in value)
        return convert(value)

    args = each(step.args)
    kwargs = {k: each(v) for k, v in step.kwargs.items()}
    if args == step.args and kwargs == step.kwargs:
        return step
    return dataclasses.replace(step, args=args, kwargs=kwargs)


#: ops whose first argument gives only a shape, strides, dtype and device
LIKE_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "empty_like.default",
        "zeros_like.default",
        "ones_like.default",
        "full_like.default",
        "rand_like.default",
        "rand_like.generator",
        "randn_like.default",
        "randn_like.generator",
        "randint_like.default",
        "randint_like.generator",
        "randint_like.low_dtype",
        "randint_like.low_generator_dtype",
        "new_empty.default",
        "new_empty_strided.default",
        "new_zeros.default",
        "new_ones.default",
        "new_full.default",
    )
)


@functools.cache
def resolve(op: str) -> Any:
    """The callable a step's ``op`` names: ``torch.ops.aten.normal_.default`` for
    ``aten::normal_.default``, ``torch.nn.init.trunc_normal_`` for its dotted name."""
    if "::" in op:
        namespace, rest = op.split("::", 1)
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, overload or "default")
    module, _, name = op.rpartition(".")
    found: Any = torch
    for part in module.split(".")[1:]:
        found = getattr(found, part)
    return getattr(found, name)


@functools.cache
def takes_generator(op: str) -> bool:
    """Whether the op a step names takes a ``generator=`` argument."""
    found = resolve(op)
    if "::" not in op:
        return True  # (torch.nn.init's functions: each takes one)
    return any(a.name == "generator" for a in found._schema.arguments)


@functools.cache
def with_generator(op: str) -> str:
    """The overload of an aten op that takes a ``generator=`` (``aten::randn.generator`` for
    ``aten::randn.default``), or ``op`` itself if it takes one or has none."""
    if "::" not in op or takes_generator(op):
        return op
    schema = resolve(op)._schema
    names = [a.name for a in schema.arguments]
    packet = resolve(op).overloadpacket
    for overload in packet.overloads():
        other = getattr(packet, overload)._schema
        others = [a.name for a in other.arguments]
        if "generator" in others and [n for n in others if n != "generator"] == names:
            return f"{schema.name}.{overload}"
    return op


#: ops that write only some elements of their tensor, whatever its view
_PARTIAL = frozenset(
    {
        "aten::index_put_.default",
        "aten::masked_fill_.Scalar",
        "aten::masked_fill_.Tensor",
        "aten::index_fill_.int_Scalar",
        "aten::scatter_.value",
        "aten::scatter_.src",
    }
)
#: in-place ops that set what they write without reading it (an ``empty`` tensor they fill
#: whole is initialized; ``mul_`` on one is not)
_OVERWRITES = (
    frozenset(
        {
            "aten::fill_.Scalar",
            "aten::fill_.Tensor",
            "aten::zero_.default",
            "aten::copy_.default",
            "aten::uniform_.default",
            "aten::normal_.default",
            "aten::bernoulli_.float",
            "aten::bernoulli_.Tensor",
            "aten::random_.default",
            "aten::random_.from",
            "aten::random_.to",
            "aten::exponential_.default",
            "aten::geometric_.default",
            "aten::cauchy_.default",
            "aten::log_normal_.default",
            "torch.nn.init.trunc_normal_",
        }
    )
    | _PARTIAL
)


#: ops that make a new storage holding what another holds (initialized as far as it is)
_COPIES = frozenset(
    {"aten::clone.default", "aten::_to_copy.default", "aten::detach_copy.default"}
)  # fmt: skip


def uninitialized(tape: Tape, storage: int, upto: int | None = None) -> bool:
    """Whether the tape (its first ``upto`` steps) leaves part of ``storage`` as uninitialized
    memory: it was made by an ``empty`` (or copied from one: ``copy.deepcopy`` is a
    ``clone``), and its later writes do not set every element (a partial write through a
    view, ``w[0].normal_()``, leaves the other rows). Elements are counted with a mask only
    when no write covers the storage whole."""
    upto = len(tape.steps) if upto is None else upto
    made_at = next((i for i, s in enumerate(tape.steps[:upto]) if storage in s.creates), None)
    if made_at is None:
        return False  # (made before the tape: a real tensor, with its values)
    made = tape.steps[made_at]
    source = made.args[0] if made.args and made.op in _COPIES else None
    if isinstance(source, View):
        empty = uninitialized(tape, source.storage, made_at)
    else:
        empty = made.uninitialized
    if not empty:
        return False
    size = max(
        (extent(v) for v in made.outputs if v is not None and v.storage == storage), default=0
    )
    covered: list[View] = []
    for step in tape.steps[made_at + 1 : upto]:
        if storage not in step.writes or step.op not in _OVERWRITES or step.op in _PARTIAL:
            continue
        view = next((a for a in step.args if isinstance(a, View) and a.storage == storage), None)
        if view is None:
            continue
        if view.offset == 0 and view.numel == size and extent(view) == size:
            return False
        covered.append(view)
    if not covered:
        return True
    mask = torch.zeros(size, dtype=torch.bool, device="cpu")
    for view in covered:
        torch.as_strided(mask, view.size, view.stride, view.offset).fill_(True)
    return not bool(mask.all())


def extent(view: View) -> int:
    """How many elements of its storage ``view`` spans (from the start)."""
    if view.numel == 0:
        return view.offset
    return view.offset + 1 + sum((n - 1) * s for n, s in zip(view.size, view.stride, strict=True))


def as_view(base: torch.Tensor, view: View) -> torch.Tensor:
    """The tensor ``view`` names in ``base``, the real tensor that holds its storage."""
    if base.dtype != view.dtype:
        base = base.view(view.dtype)
    if (
        tuple(base.shape) == view.size
        and tuple(base.stride()) == view.stride
        and base.storage_offset() == view.offset
    ):
        return base
    return torch.as_strided(base, view.size, view.stride, view.offset)


def views_in(value: Any) -> list[View]:
    """The views in ``value`` (a view, or a list or tuple holding some)."""
    if isinstance(value, View):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in views_in(item)]
    return []


def is_contiguous(view: View) -> bool:
    """Whether ``view`` is laid out row-major without gaps."""
    expected, stride = [], 1
    for size in reversed(view.size):
        expected.append(stride)
        stride *= size
    return all(
        s == e or n == 1 for s, e, n in zip(view.stride, reversed(expected), view.size, strict=True)
    )
