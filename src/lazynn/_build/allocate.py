"""The allocation of a rehearsed model: each lazy layer constructed once, in construction
order, from the sizes its rehearsal learnt (:func:`allocate`), the eager layers constructed
after the first lazy one re-initialized so that the stream is an eager construction's (see
``build.py``'s module doc); on meta, recorded, each tensor keeping its init program.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .._errors import (
    InferenceError,
    LazynnError,
    first_line,
    message,
    module_path,
)
from .._layer.base import LazyLayer
from .._layer.infer import CLASS_KEY
from .._module.callers import user_stacklevel
from .._module.kept import Init
from .._module.kept import run as run_inits
from .._module.lifecycle import build_lazy_module, finish, is_lazy_module, is_unbuilt
from .._module.placeholder import relocate
from .._module.snapshot import EveryRandom, atomic
from .._module.state import BUILD_LOCK, context, find_state
from .._module.tensors import (
    byte_size,
    copy_values,
    is_placeholder,
    move_to_meta,
    own_slots,
    own_tensors,
)
from .._program.program import attach
from .._program.record import Recorder
from .._rehearsal.learnt import Rehearsal, TensorInfo
from .progress import Progress
from .queue import Entry as QueueEntry
from .queue import built_on_meta, due, ready, run_on_meta, run_ready
from .reinit_plan import Plan, plan, scratch_init, state_key

__all__ = ["allocate"]


def _retarget(module: nn.Module, device: torch.device | None, dtype: torch.dtype | None) -> None:
    """Move a lazy module's placeholders (any kind) to ``device`` / ``dtype`` before its build."""
    if device is None and dtype is None:
        return
    for store, name, tensor in own_slots(module):
        if is_placeholder(tensor):
            floating = tensor.is_floating_point()
            target = device if device is not None else tensor.device
            store[name] = relocate(tensor, target, dtype if floating else None)


class _Allocation:
    """One allocation pass over a model, in registration order (see the module doc): each
    kind of module has its step. The work the program wrote between constructions (kept
    initializations, queued functions) runs between them, in the order written: before the
    construction of the lazy layer born after it (:meth:`run_due`)."""

    def __init__(
        self,
        rehearsal: Rehearsal,
        chosen: Plan,
        device: torch.device | None,
        dtype: torch.dtype | None,
        bar: Progress,
    ) -> None:
        self.rehearsal, self.plan, self.device, self.dtype, self.bar = (
            rehearsal,
            chosen,
            device,
            dtype,
            bar,
        )
        self.on_meta = device is not None and device.type == "meta"
        #: (construction number, sizes) -> the first layer built with them (copies follow it)
        self.births: dict[tuple[Any, str], nn.Module] = {}
        #: (tensor, its old data), to put back on failure
        self.replaced: list[tuple[torch.Tensor, torch.Tensor]] = []
        #: id(real tensor) -> its meta twin, so ties hold on meta
        self.shared: dict[int, torch.Tensor] = {}
        #: ids of the tensors of the modules visited so far (a tensor seen again is a tie)
        self.earlier: set[int] = set()
        #: initializations written on the placeholders (``_module/kept.py``), with the built
        #: tensors, not run yet; and the tensor each one ran on
        self.inits: list[tuple[Init, torch.Tensor]] = []
        self.inits_done: dict[int, torch.Tensor] = {}
        #: functions queued with on_build in the model, by module, not run yet
        self.queued: list[tuple[nn.Module, QueueEntry]] = []
        #: modules whose queued work was written before an eager layer's construction but
        #: could not run before its re-initialization (the module not built by then)
        self.late: list[nn.Module] = []
        #: work written under a generator state of its own (``fork_rng``), by that state's
        #: key -> where its draws have come to
        self.forks: dict[int, torch.Tensor] = {}
        #: id(a state work was written at) -> its key (the states are held by the work)
        self.keys: dict[int, int] = {}

    def run_due(self, model: nn.Module, before: int | None) -> None:
        """Run the work written before the construction of the ``before``-th lazy layer
        (None: all that is left), in the order written; a queued function only once its
        module is built and allocated."""

        def written(after: int) -> bool:
            return before is None or after <= before

        inits = [pair for pair in self.inits if written(pair[0].after)]
        queued = [pair for pair in self.queued if written(pair[1].after) and self.due(pair[0])]
        if not inits and not queued:
            return
        self.inits = [pair for pair in self.inits if not written(pair[0].after)]
        self._run(model, inits, queued)

    def run_queued_at(self, model: nn.Module, key: int) -> None:
        """Run the work written when the generator was at the state ``key`` names, the one an
        eager layer's construction draws from (``Plan.starts``): eager code ran it before
        that layer, which the build now re-initializes."""
        at = [pair for pair in self.queued if self._key(pair[1].rng) == key]
        queued = [pair for pair in at if self.due(pair[0])]
        inits = [pair for pair in self.inits if self._key(pair[0].rng) == key]
        late = [pair for pair in at if pair not in queued]
        self.late += [module for module, _ in late if module not in self.late]
        if queued or inits:
            taken = {id(init) for init, _ in inits}  # (by identity: an Init holds tensors)
            self.inits = [pair for pair in self.inits if id(pair[0]) not in taken]
            self._run(model, inits, queued)

    def _key(self, written: torch.Tensor | None) -> int | None:
        """``state_key`` of a state work was written at, once per tensor (compared at every
        eager layer's visit)."""
        if written is None:
            return None
        found = self.keys.get(id(written))
        if found is None:
            found = self.keys[id(written)] = state_key(written)
        return found

    def due(self, module: nn.Module) -> bool:
        """Whether work queued on ``module`` can run (on meta, the initializations and the
        queued work are steps of the recording)."""
        return built_on_meta(module) if self.on_meta else ready(module)

    def _run(
        self,
        model: nn.Module,
        inits: list[tuple[Init, torch.Tensor]],
        queued: list[tuple[nn.Module, QueueEntry]],
    ) -> None:
        """Run these initializations and queued functions, in the order written."""
        self.queued = [pair for pair in self.queued if pair not in queued]
        work: list[tuple[int, Any]] = [(init.order, (init, t)) for init, t in inits]
        work += [(entry.order, (module, entry)) for module, entry in queued]
        # A function queued on a module deep-copied after (``[deepcopy(block) for ...]``) is in
        # each copy's queue, with one order: eager code ran it once, then copied the result.
        # Each copy runs it from where the first began, and the generators end where it ended.
        copied: tuple[int, EveryRandom, EveryRandom] | None = None
        for order, item in sorted(work, key=lambda pair: pair[0]):
            if isinstance(item[0], Init):
                with self._forked(item[0].rng):
                    run_inits([item], self.inits_done)
                continue
            again = copied is not None and copied[0] == order
            if copied is not None and again:
                copied[1].restore()
            start = EveryRandom()
            with self._forked(item[1].rng):
                if self.on_meta:
                    run_on_meta(model, item[0], item[1])
                else:
                    with torch.enable_grad():  # (as outside a build: the allocation: no_grad)
                        run_ready(model, only=[item[1]])
            if copied is not None and again:
                copied[2].restore()
            else:
                copied = (order, start, EveryRandom())

    @contextlib.contextmanager
    def _forked(self, written: torch.Tensor | None) -> Iterator[None]:
        """Work written under a generator state the construction's stream never had (in
        ``torch.random.fork_rng()`` after a ``manual_seed``) draws from that state, and the
        CPU generator goes back after it, as ``fork_rng`` put it back; other work, as it is."""
        key = self._key(written) if self.plan.known else None
        if written is None or key is None or key in self.plan.known:
            yield
            return
        saved = torch.get_rng_state()
        # (work written after it under the same fork continues its draws: the state the
        # construction saw did not move, its draws being kept for the build)
        torch.set_rng_state(self.forks.get(key, written))
        try:
            yield
            self.forks[key] = torch.get_rng_state()
        finally:
            torch.set_rng_state(saved)

    def visit(self, path: str, module: nn.Module, lazy: set[nn.Module]) -> None:
        if module in self.rehearsal.sizes and is_unbuilt(module):
            assert isinstance(module, LazyLayer)
            try:
                self.lazynn_layer(module)
            except LazynnError:
                raise
            except Exception as error:  # out of memory, a device or dtype the class refuses
                raise _allocation_error(
                    path,
                    module,
                    self.rehearsal.sizes[module],
                    self.rehearsal.tensors.get(path, []),
                    self.device,
                    self.dtype,
                    error,
                ) from error
        elif module in lazy:
            self.other_lazy(module)
        elif module in self.plan.replay:
            self.replayed(module)
        elif module in self.plan.tied:
            self.tied(module)
        self.earlier.update(id(t) for t in own_tensors(module))

    def lazynn_layer(self, module: LazyLayer) -> None:
        """Construct it for real (or on meta) with its inferred sizes; a copy of a layer built
        before takes that layer's values and draws nothing."""
        sizes = self.rehearsal.sizes[module]
        state = find_state(module)
        kin = (state.birth if state is not None else None, repr(sorted(sizes.items())))
        source = self.births.get(kin)
        if source is None:
            self.births[kin] = module
            pending = module._lazynn_build(sizes, device=self.device, dtype=self.dtype)
        elif self.on_meta:  # a copy, recorded: new tensors, then the values it copies
            layout = _made_again(module._lazynn_construct(_real_sizes(sizes), "meta"))
            pending = module._lazynn_build(sizes, device="meta", dtype=self.dtype, source=layout)
        else:  # a copy of a layer built before: its values, no draws
            rng = torch.get_rng_state()
            pending = module._lazynn_build(sizes, device=self.device, dtype=self.dtype)
            torch.set_rng_state(rng)
        finish(module)
        enclosing = context().rehearsal
        if enclosing is not None:  # a build the forward of a rehearsal called: what it built
            enclosing.sizes[id(module)] = dict(sizes)  # (as if that forward's call had)
        if source is not None:
            copy_values(source, module)
        self.inits += pending  # (run once every layer is built: _allocate_in_order)
        self.bar.advance(sum(t.numel() for t in module.parameters()))

    def other_lazy(self, module: nn.Module) -> None:
        """torch's lazy modules and custom mixins: their own build, from their meta inputs."""
        _retarget(module, self.device, self.dtype)
        a, k = self.rehearsal.inputs[module]
        build_lazy_module(module, a, k)
        self.bar.advance(sum(t.numel() for t in module.parameters()))

    def replayed(self, module: nn.Module) -> None:
        """An eager layer re-initialized from its eager position in the stream."""
        if self.on_meta:  # what its initializer writes goes to meta, where it is recorded
            move_to_meta(module, self.shared, names=self.plan.written.get(module))
        twin = scratch_init(module)
        for tensor, fresh in zip(own_tensors(module), own_tensors(twin), strict=True):
            self.replaced.append((tensor, tensor.data))
            tensor.data = fresh.data

    def tied(self, module: nn.Module) -> None:
        """An eager layer tied to an earlier one: its construction's draws are replayed; its
        own untied tensors (a tied head's bias) take them, unless changed since."""
        retied = module in self.plan.retied
        if self.on_meta:  # follow moved ties; a retied layer's own tensors go to meta too
            if retied:  # (its tied tensors follow their first owner, moved or not)
                tied = {name for _, name, t in own_slots(module) if id(t) in self.earlier}
                names = self.plan.written.get(module, frozenset()) - tied
                move_to_meta(module, self.shared, names=names)
            else:
                move_to_meta(module, self.shared, only_shared=True)
        if self.plan.start is not None:
            twin = scratch_init(module)  # draws what its construction drew; keeps the tie
            if retied:
                earlier = {id(t) for t in self.shared_before(module)}
                for tensor, fresh in zip(own_tensors(module), own_tensors(twin), strict=True):
                    if id(tensor) not in earlier:
                        self.replaced.append((tensor, tensor.data))
                        tensor.data = fresh.data

    def shared_before(self, module: nn.Module) -> list[torch.Tensor]:
        """The tensors of ``module`` that a module registered before it holds too."""
        return [t for t in own_tensors(module) if id(t) in self.earlier]

    def undo(self) -> None:
        for tensor, old in self.replaced:
            tensor.data = old


def allocate(
    model: nn.Module,
    rehearsal: Rehearsal,
    device: torch.device | None,
    dtype: torch.dtype | None,
    progress: bool | None,
    quiet: bool = False,
    examples: tuple[Any, ...] = (),
) -> None:
    """Allocate every lazy layer the rehearsal sized; ``quiet``: no notes on the plan (a first
    call's build, which promises no eager twin); ``examples``: the build's inputs."""
    order = list(model.named_modules())
    lazy = set(rehearsal.sizes) | {m for m in rehearsal.inputs if is_lazy_module(m)}
    total = sum(
        info.numel for path, m in order if m in lazy for info in rehearsal.tensors.get(path, [])
    )
    # (the model's size, for the bar: the eager layers' tensors too, each tie once)
    in_model = {i.ident: i.numel for infos in rehearsal.tensors.values() for i in infos}
    with BUILD_LOCK:
        chosen = plan(order, lazy, device, torch.get_rng_state(), examples)
        bar = Progress(total, "lazynn.build", progress, model_total=sum(in_model.values()))
        allocation = _Allocation(rehearsal, chosen, device, dtype, bar)
        try:
            # (inference_mode(False): parameters as a construction outside the mode makes them)
            with atomic(model, undo=allocation.undo):
                # (on meta, the allocation is recorded: each tensor keeps its init program)
                recorder = Recorder() if allocation.on_meta else None
                where = torch.device("meta") if recorder else contextlib.nullcontext()
                with torch.inference_mode(False), where, recorder or contextlib.nullcontext():
                    _allocate_in_order(model, order, rehearsal, allocation, lazy, device, dtype)
                if recorder is not None:
                    attach(model, recorder)
                run_ready(model)  # work queued with lazynn.on_build, still waiting
        finally:
            bar.close()
        if allocation.on_meta and chosen.start is not None:
            # Nothing drew on meta; leave the generator where construction began, so that
            # materialize() draws what an eager construction draws.
            torch.set_rng_state(chosen.start)
    for note in [] if quiet else [*chosen.notes, *_late_notes(model, allocation.late)]:
        warnings.warn(f"lazynn.build: {note}", stacklevel=user_stacklevel())


def _late_notes(model: nn.Module, late: list[nn.Module]) -> list[str]:
    """Why work queued on these modules is not where eager code ran it."""
    if not late:
        return []
    paths = {id(m): p for p, m in model.named_modules()}
    named = ", ".join(f"'{paths[id(m)]}'" if paths.get(id(m)) else "the model" for m in late)
    return [
        f"work queued with lazynn.on_build on {named} was written before an eager layer's "
        "construction, but runs after it (its lazy layers are built later), so the numbers "
        "from there on are not the eager model's; queue it on the lazy layer it needs, or "
        "build with the factory form, lazynn.build(Net, example), which runs it in place"
    ]


def _real_sizes(sizes: dict[str, Any]) -> dict[str, Any]:
    """A layer's inferred sizes without a rank-agnostic layer's chosen class."""
    return {k: v for k, v in sizes.items() if k != CLASS_KEY}


def _made_again(layout: nn.Module) -> nn.Module:
    """``layout`` (an unrecorded meta layer) with every tensor made again, as steps of the
    recording: empty tensors, which the values a copy takes fill."""
    for module in layout.modules():
        for store, name, tensor in own_slots(module):
            fresh = torch.empty_like(tensor)
            store[name] = (
                nn.Parameter(fresh, tensor.requires_grad)
                if isinstance(tensor, nn.Parameter)
                else fresh
            )
    return layout


def _allocate_in_order(
    model: nn.Module,
    order: list[tuple[str, nn.Module]],
    rehearsal: Rehearsal,
    allocation: _Allocation,
    lazy: set[nn.Module],
    device: torch.device | None,
    dtype: torch.dtype | None,
) -> None:
    """The allocation pass: each module in registration order, the work written before each
    lazy layer's construction run before it (see :class:`_Allocation`)."""
    with torch.no_grad():
        if allocation.plan.start is not None:
            torch.set_rng_state(allocation.plan.start)
        allocation.queued = due(model)
        for path, module in allocation.plan.walk or order:  # (construction order)
            state = find_state(module)
            if state is not None and module in rehearsal.sizes and is_unbuilt(module):
                allocation.run_due(model, before=state.birth)
            start = allocation.plan.starts.get(module)
            if start is not None and (allocation.queued or allocation.inits):
                allocation.run_queued_at(model, start)
            allocation.visit(path, module, lazy)
        allocation.run_due(model, before=None)
        if not allocation.on_meta and (device is not None or dtype is not None):
            model.to(device=device, dtype=dtype)


def _allocation_error(
    path: str,
    module: nn.Module,
    sizes: dict[str, Any],
    infos: list[TensorInfo],
    device: torch.device | None,
    dtype: torch.dtype | None,
    error: Exception,
) -> InferenceError:
    """A lazy layer whose allocation failed (out of memory; a device or dtype its class
    refuses): the sizes it was given, and what they cost where."""
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items() if k != CLASS_KEY)
    need = sum(
        i.numel * (dtype if dtype is not None and i.dtype.is_floating_point else i.dtype).itemsize
        for i in infos
    )
    where = f" on {device}" if device is not None else ""
    return InferenceError(
        message(
            module_path(module, path),
            f"to allocate {byte_size(need)}{where} for the layer's "
            f"{sum(i.numel for i in infos):,} parameters and buffers (its inputs gave "
            f"{shown})",
            f"{type(error).__name__}: {first_line(error)}",
            "check the example inputs' sizes (is one far larger than meant?), the memory free "
            "on the device, and the device and dtype asked for; or build on meta "
            "(lazynn.build(model, example, device='meta'), then lazynn.materialize)",
            outcome="the model is unchanged",
        )
    )
