"""Recording a construction that runs on meta: the tape of every operation on its tensors.

:class:`Recorder` is a context manager (for this thread only, as torch's modes are). While it
is active, every aten operation is written on a :class:`~lazynn._program.tape.Tape` in program
order, with each random one's generator, and:

* a value the code reads (``.item()``, ``.tolist()``, ``float(t)``, ``if t.any():``) is
  computed for real at that point of the program, on the CPU, from the steps recorded so far
  (such tensors are small: ``torch.linspace(0, rate, depth)``), so data-dependent code runs
  as eager code does;
* a random draw into a real tensor (``torch.randn(4, device="cpu")``) draws the numbers eager
  code draws at that point, on a private generator; no generator of the process moves (a
  ``torch.manual_seed`` in the code is a step of the tape, and put back on exit);
* lazynn's own reads of a placeholder, and what runs inside :func:`unrecorded` (a layout's
  meta construction, for its shapes), are not the program's: no step is written;
* what runs through torch's Python functions (constants from data, ``nn.init.trunc_normal_``)
  is the other half's (``functions.py``).

Nothing is allocated for meta tensors; the tape keeps no model tensor (steps name storages).
:meth:`Recorder.view_of` gives a tensor's place on the tape, for a replay.

>>> import torch
>>> with torch.device("meta"), Recorder() as recorder:
...     steps = torch.linspace(0, 0.1, 3)
...     rates = [round(x.item(), 2) for x in steps]   # computed for real
...     weight = torch.empty(2, 3).normal_()
>>> rates, [s.op for s in recorder.tape.steps if s.random]
([0.0, 0.05, 0.1], ['aten::normal_.default'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

# TorchDispatchMode lives in a private module, but it is the documented way to write a mode
# ("Extending PyTorch"); tests/program/test_recording.py exercises it.
from torch.utils._python_dispatch import TorchDispatchMode

from .._errors import meta_limitation
from .._module.tensors import is_placeholder
from .draws import call_drawing
from .functions import Functions
from .marks import Marks
from .replay import Replay
from .tape import (
    LIKE_OPS,
    Const,
    GeneratorRef,
    Like,
    Step,
    Tape,
    View,
    resolve,
    with_generator,
)

__all__ = ["Recorder", "recording", "unrecorded"]

_UNINITIALIZED = frozenset(
    {"aten::empty.memory_format", "aten::empty_strided.default", "aten::empty_like.default",
     "aten::new_empty.default", "aten::new_empty_strided.default"}
)  # fmt: skip

#: the recorders active on each thread, innermost last
_LOCAL = threading.local()


def recording() -> Recorder | None:
    """The recorder active on this thread, or None."""
    found: list[Recorder] | None = getattr(_LOCAL, "active", None)
    return found[-1] if found else None


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """What runs inside is not the program's (lazynn's own constructions on meta, for a
    layout's shapes): no step is written for it."""
    recorder = recording()
    if recorder is None:
        yield
        return
    recorder.paused += 1
    try:
        yield
    finally:
        recorder.paused -= 1


class Recorder:
    """Records what runs inside it on a tape (see the module doc)."""

    def __init__(
        self, tape: Tape | None = None, generators: Iterable[torch.Generator] = ()
    ) -> None:
        self.tape = tape if tape is not None else Tape()
        #: generators the code may set before it draws from them (passed to a factory): followed
        #: from the start, so that the recording puts back what the code did to them
        self._given = list(generators)
        #: storage -> its number on the tape
        self._storages: dict[StorageWeakRef, int] = {}
        #: one tensor per storage, by number: no storage is freed (and its key reused)
        self._alive: list[torch.Tensor] = []
        #: id(generator) -> its number on the tape
        self._generators: dict[int, int] = {}
        self._generator_objects: list[torch.Generator] = []
        #: the generator the running Python call names (``functions.py``): the one the
        #: dispatcher's new object for it stands for
        self.named: torch.Generator | None = None
        #: the default CPU generator's state at the start
        self.start = torch.get_rng_state()
        #: what the code does to the generators it draws from (``marks.py``)
        self.marks: Marks | None = None
        #: real tensors a step read, by id, with their version then: (const, version)
        self._consts: dict[int, tuple[Const, int, torch.Tensor]] = {}
        self._ops = _Ops(self)
        self._functions = Functions(self)
        #: a replay kept in step with the tape, for draws into real tensors
        self._live: Replay | None = None
        self._modes = contextlib.ExitStack()
        #: how many ``unrecorded()`` blocks are open (what runs there is not recorded)
        self.paused = 0

    @property
    def function_mode(self) -> Functions:
        """The recorder's Python half (``_functions``): a function mode while it records."""
        return self._functions

    def __enter__(self) -> Recorder:
        active = getattr(_LOCAL, "active", None)
        if active is None:
            active = _LOCAL.active = []
        active.append(self)
        self.marks = Marks(self.tape, self._const)
        for generator in self._given:
            self.generator(generator)
        self._modes = contextlib.ExitStack()
        self._modes.enter_context(self._functions)
        self._modes.enter_context(self._ops)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self._modes.__exit__(kind, error, trace)
        finally:
            _LOCAL.active.pop()
        assert self.marks is not None
        self.marks.check_all()  # (what the code did last: a step of the program)
        # (each generator as it was: the code's own settings were steps; another thread's
        # draws from the default one stay, unless the code set it: then it goes back whole)
        self.marks.release()

    # --- the tape's names for tensors ------------------------------------------------------
    def view_of(self, tensor: torch.Tensor) -> View:
        """Where ``tensor`` is on the tape (its storage and geometry)."""
        key = StorageWeakRef(tensor.untyped_storage())
        storage = self._storages.get(key)
        if storage is None:
            storage = self._new_storage(tensor)
            self.tape.external[storage] = (
                "made before the recording began" if tensor.is_meta else "a real tensor"
            )
        return View(
            storage,
            tuple(tensor.shape),
            tuple(tensor.stride()),
            int(tensor.storage_offset()),
            tensor.dtype,
        )

    def knows(self, tensor: torch.Tensor) -> bool:
        """Whether the tape made ``tensor``'s storage."""
        storage = self._storages.get(StorageWeakRef(tensor.untyped_storage()))
        return storage is not None and storage not in self.tape.external

    def _new_storage(self, tensor: torch.Tensor) -> int:
        storage = self.tape.storages
        self.tape.storages += 1
        self._storages[StorageWeakRef(tensor.untyped_storage())] = storage
        self._alive.append(tensor)
        return storage

    def _const(self, tensor: torch.Tensor) -> Const:
        """A real tensor a step reads, as its value now (copied once per version)."""
        found = self._consts.get(id(tensor))
        if found is not None and found[1] == tensor._version and found[2] is tensor:
            return found[0]
        const = Const(len(self.tape.consts))
        self.tape.consts.append(tensor.detach().clone())
        self._consts[id(tensor)] = (const, tensor._version, tensor)
        return const

    def generator(self, generator: torch.Generator) -> GeneratorRef:
        """A generator a step names, by number (its state now kept as its start)."""
        named = self.named
        if named is not None and named.device == generator.device:
            generator = named  # (the user's object, not the dispatcher's stand-in for it)
        index = self._generators.get(id(generator))
        if index is None:
            index = self._generators[id(generator)] = len(self.tape.generators)
            self.tape.generators.append(generator.get_state())
            self._generator_objects.append(generator)
            self.tape.owners.append(weakref.ref(generator))
            if self.marks is not None:
                self.marks.follow(index, generator)
        return GeneratorRef(index)

    # --- steps -----------------------------------------------------------------------------
    def _arg(self, value: Any, written: bool) -> Any:
        if isinstance(value, torch.Tensor):
            if value.is_meta or written:
                return self.view_of(value)
            return self._const(value)
        if isinstance(value, torch.Generator):
            return self.generator(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self._arg(v, written) for v in value)
        return value

    def record(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        written: set[int | str],
        random: bool,
    ) -> Step:
        """Write a step: ``op`` with its arguments (``written``: the positions it writes) and
        its result."""
        if random and self.marks is not None:
            which = self._arg(kwargs.get("generator"), False)
            self.marks.check(which.index if isinstance(which, GeneratorRef) else None)
        views = tuple(
            _like(a) if i == 0 and op in LIKE_OPS else self._arg(a, i in written)
            for i, a in enumerate(args)
        )
        named = {k: self._arg(v, k in written) for k, v in kwargs.items()}
        writes = tuple(
            v.storage for i, v in enumerate(views) if i in written and isinstance(v, View)
        )
        writes += tuple(v.storage for k, v in named.items() if k in written and isinstance(v, View))
        reads = tuple(v.storage for v in _all_views((views, named)) if v.storage not in writes)
        if _is_view(op):  # (it reads nothing: its output is a view of its input)
            reads = ()
        outputs, creates = self.outputs_of(result)
        step = Step(
            op,
            views,
            named,
            tuple(outputs),
            tuple(creates),
            writes,
            reads,
            random,
            op in _UNINITIALIZED,
        )
        self.tape.steps.append(step)
        if random and self.marks is not None:  # (it moved its generator: a place to mark)
            which = named.get("generator")
            key = which.index if isinstance(which, GeneratorRef) else None
            self.marks.moved(key, len(self.tape.steps) - 1)
        return step

    def outputs_of(self, result: Any) -> tuple[tuple[View | None, ...], tuple[int, ...]]:
        """A step's outputs (a view each, None where not a tensor) and the storages they
        create."""
        outputs: list[View | None] = []
        creates: list[int] = []
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if not isinstance(value, torch.Tensor):
                outputs.append(None)
                continue
            if StorageWeakRef(value.untyped_storage()) not in self._storages:
                creates.append(self._new_storage(value))
            outputs.append(self.view_of(value))
        return tuple(outputs), tuple(creates)

    # --- values computed for real ----------------------------------------------------------
    def evaluate(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s value now, computed on the CPU from the steps so far (a real tensor is
        its own value)."""
        if not tensor.is_meta:
            return tensor
        view = self.view_of(tensor)
        replay = Replay(self.tape, "cpu", self.start)
        with unrecorded():  # (the replay's own steps, on the CPU, are not the program's)
            return replay.run({view: None}, have=self._real_storages(), draw_all=False)[view]

    def _real_storages(self) -> dict[int, torch.Tensor]:
        return {index: t for index, t in enumerate(self._alive) if not t.is_meta}

    def draw_real(
        self, step: Step, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A random step on real tensors: what eager code draws at this point, drawn on the
        live replay's generators (kept in step with the tape), into the real tensors."""
        if self._live is None:
            self._live = Replay(self.tape, "cpu", self.start)
        index = len(self.tape.steps) - 1
        with unrecorded():  # (as evaluate's)
            self._live.run({}, upto=index)
        which = step.kwargs.get("generator")
        generator = (
            self._live.private[which.index]
            if isinstance(which, GeneratorRef)
            else self._live.default
        )
        kwargs = {k: v for k, v in kwargs.items() if k != "generator"}  # (the live one's)
        result = call_drawing(resolve(step.op), args, kwargs, generator)
        self._live.done = index + 1
        return result


def _is_view(op: str) -> bool:
    """Whether an aten op's outputs are views of its inputs (``detach``, ``t``, ``select``)."""
    if "::" not in op:
        return False
    returns = resolve(op)._schema.returns
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _like(tensor: Any) -> Any:
    """A tensor an op reads the shape of only, as a :class:`Like`."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    return Like(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _all_views(value: Any) -> list[View]:
    if isinstance(value, View):
        return [value]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _all_views(item)]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _all_views(item)]
    return []


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _returns_tensors(func: Any) -> bool:
    return any("Tensor" in str(r.type) for r in func._schema.returns)


class _Ops(TorchDispatchMode):  # (a Recorder's aten half)
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # (else torch wraps __torch_dispatch__ in a dynamo "disable", which imports
        # torch._dynamo, 1-2 s, at the first op; this mode never runs under torch.compile)
        return False

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recorder = recorder

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        recorder = self.recorder
        tensors = _tensors((args, kwargs))
        if recorder.paused or any(is_placeholder(t) for t in tensors):
            return func(*args, **kwargs)  # (lazynn's own reads of a placeholder's empty data)
        meta = any(t.is_meta for t in tensors) or _meta_device(kwargs)
        if not _returns_tensors(func):
            if not any(t.is_meta for t in tensors):
                return func(*args, **kwargs)
            return func(*_real(recorder, args), **_real(recorder, kwargs))  # a value read
        random = torch.Tag.nondeterministic_seeded in func.tags
        written: set[int | str] = set()
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                written.add(index if index < len(args) else argument.name)
        if not meta and not random:
            return func(*args, **kwargs)  # real in, real out: it happens now
        name = f"{func._schema.name}.{func._overloadname}"
        if random:
            name = with_generator(name)  # (so that a replay draws from its own generators)
        if not meta:  # a draw into real tensors: the eager numbers, drawn now
            step = recorder.record(name, args, kwargs, None, written, True)
            result = recorder.draw_real(step, func, args, kwargs)
            _note_outputs(recorder, step, result)
            return result
        if not random and any(
            isinstance(t, torch.Tensor) and not t.is_meta for t in _written(args, kwargs, written)
        ):
            # (a write into a real tensor from meta ones, `buffer.add_(layer.bias)`: torch does
            # nothing on meta operands; eager code writes the values: computed for real)
            return func(*_real(recorder, args), **_real(recorder, kwargs))
        try:
            result = _filled_on_meta(func, args, kwargs)
            if result is None:
                result = func(*args, **kwargs)
            if not random and any(not t.is_meta for t in _tensors(result)):
                # (a real result of meta operands, `torch.mm(cpu, meta)`: torch returns
                # uninitialized memory; eager code computes it: computed for real)
                return func(*_real(recorder, args), **_real(recorder, kwargs))
        except Exception as error:
            if not random and any(not t.is_meta for t in tensors):
                # (meta and real operands, `F.linear(real_batch, meta_weight)`, which torch
                # refuses across devices: eager code computes it: computed for real)
                try:
                    return func(*_real(recorder, args), **_real(recorder, kwargs))
                except Exception:
                    raise error from None
            if not meta_limitation(error):
                raise
            # (no meta kernel, or a shape from values: computed for real, kept on meta)
            real = func(*_real(recorder, args), **_real(recorder, kwargs))
            result = torch.utils._pytree.tree_map_only(
                torch.Tensor, lambda t: torch.empty_like(t, device="meta"), real
            )
        recorder.record(name, args, kwargs, result, written, random)
        return result


#: in-place fills whose meta kernel only checks its arguments (torch's are Python refs, which
#: import torch._dynamo and sympy the first time): aten op -> its check of them
_FILLS: dict[Any, Callable[..., bool]] = {
    torch.ops.aten.normal_.default: lambda mean=0.0, std=1.0, generator=None: std >= 0,
    torch.ops.aten.uniform_.default: lambda low=0.0, high=1.0, generator=None: low <= high,
    torch.ops.aten.fill_.Scalar: lambda value: True,
    torch.ops.aten.zero_.default: lambda: True,
}


def _filled_on_meta(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A fill of a plain meta tensor of a floating dtype (``normal_`` of an embedding on
    meta): the tensor itself, as its meta kernel returns it, without running that kernel;
    None for anything else, or arguments its kernel may refuse (its kernel then raises)."""
    check = _FILLS.get(func)
    if check is None or not args or type(args[0]) not in (torch.Tensor, nn.Parameter):
        return None
    tensor = args[0]
    if not tensor.is_meta or not tensor.dtype.is_floating_point:
        return None
    try:
        ok = check(*args[1:], **kwargs)
    except TypeError:
        return None
    return tensor if ok is True else None


def _note_outputs(recorder: Recorder, step: Step, result: Any) -> None:
    """Give a step recorded before its result existed the storages of its outputs."""
    outputs, creates = recorder.outputs_of(result)
    steps = recorder.tape.steps
    index = len(steps) - 1 - steps[::-1].index(step)
    steps[index] = dataclasses.replace(step, outputs=outputs, creates=creates)


def _written(args: tuple[Any, ...], kwargs: dict[str, Any], written: set[int | str]) -> list[Any]:
    """The arguments an op writes (``written``: their positions or keyword names)."""
    return [
        args[i] if isinstance(i, int) else kwargs.get(i)
        for i in written
        if not (isinstance(i, int) and i >= len(args))
    ]


def _meta_device(kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "meta"


def _real(recorder: Recorder, value: Any) -> Any:
    """``value`` with every meta tensor computed for real (on the CPU)."""
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: recorder.evaluate(t) if t.is_meta else t, value
    )
