"""materialize() of meta tensors that keep no program: each module's ``reset_parameters()``.

A model made on meta without lazynn (``with torch.device("meta"): Net()``), or a module a user
moved to meta, has no init program (``install.py`` runs those). Its modules are walked in
construction order (registration order) into explicit steps (:func:`plan_steps`), decided
before anything changes, then each step runs:

* :class:`Allocate`: a module's own meta tensors get real, uninitialized memory (tied weights
  stay tied);
* :class:`Initialize`: its initializer runs (``reset_parameters()``; ``nn.MultiheadAttention``
  and ``nn.Transformer``'s private ``_reset_parameters()``, after their submodules, as their
  constructors do), on FSDP2 shards as if unsharded (``sharded.py``); a tensor tied to an
  earlier module keeps that module's values.

An initializer is no eager ``__init__``: what it does not write would be uninitialized memory,
and is refused, naming it (``writes.py`` watches every write).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import LazynnError, message
from .._module.tensors import own_slots, own_tensors
from .progress import Progress
from .queue import Entry as QueueEntry
from .queue import due, run_ready
from .sharded import ShardedInit, init_mode, sharded_failure
from .writes import Writes

__all__ = ["Allocate", "Initialize", "plan_steps", "run_steps"]


@dataclass(frozen=True)
class Allocate:
    """Give ``module``'s own meta tensors real memory."""

    path: str
    module: nn.Module


@dataclass(frozen=True)
class Initialize:
    """Run ``module``'s initializer."""

    path: str
    module: nn.Module
    init: Callable[[], Any]


Step = Allocate | Initialize


def _meta_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    return (t for t in own_tensors(module) if t.is_meta)


def _meta_numel(modules: Iterator[nn.Module]) -> int:
    return sum(t.numel() for m in modules for t in _meta_tensors(m))


def _initializer(module: nn.Module) -> tuple[Callable[[], Any], bool] | None:
    """(the function that initializes ``module``'s own tensors, whether it runs after its
    submodules are initialized), or None."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        return reset, False
    private = getattr(module, "_reset_parameters", None)
    if callable(private) and type(module).__module__.startswith("torch.nn"):
        # nn.MultiheadAttention and nn.Transformer initialize in a private _reset_parameters
        # that their constructors call after constructing their submodules (it sets
        # out_proj.bias; Transformer's redraws every matrix below it). Private torch API:
        # tests/building/test_build.py materializes both and compares with eager construction.
        return private, True
    return None


class _Walk:
    """The walk of :func:`plan_steps` (one concern a method)."""

    def __init__(self, model: nn.Module, covered: set[tuple[int, str]]) -> None:
        #: (id(module), tensor name) of the tensors whose program gives their value
        self.covered = covered
        self.steps: list[Step] = []
        #: modules with meta tensors and no initializer
        self.blind: list[str] = []
        self.seen: set[int] = set()

    def walk(self, path: str, module: nn.Module) -> None:
        self.seen.add(id(module))
        found = _initializer(module)
        if any(True for _ in self.own_meta(module)):
            self.steps.append(Allocate(path, module))
            if found is None:
                self.blind.append(path)
            elif not found[1]:
                self.steps.append(Initialize(path, module, found[0]))
        for name, child in module._modules.items():
            if child is not None and id(child) not in self.seen:
                self.walk(f"{path}.{name}" if path else name, child)
        if found is not None and found[1] and any(self.own_meta(m) for m in module.modules()):
            self.steps.append(Initialize(path, module, found[0]))

    def own_meta(self, module: nn.Module) -> list[str]:
        """The names of ``module``'s own meta tensors that keep no program."""
        return [
            name
            for _, name, tensor in own_slots(module)
            if tensor.is_meta and (id(module), name) not in self.covered
        ]


def plan_steps(
    model: nn.Module, covered: set[tuple[int, str]] | None = None
) -> tuple[list[Step], list[str]]:
    """The steps that allocate and initialize ``model``'s meta tensors that keep no program
    (``covered``: (id(module), name) of those that do) in the order an eager construction
    initializes, and the paths of modules with such tensors but no initializer."""
    walk = _Walk(model, covered or set())
    walk.walk("", model)
    return walk.steps, walk.blind


def _allocate_own(
    module: nn.Module, device: torch.device, allocated: dict[int, torch.Tensor]
) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """Give the module's own meta tensors real memory on ``device``, one per meta tensor (so
    tied weights stay tied); returns the tensors another module owns first, to keep, and the
    (name, tensor) of each one allocated just now."""
    keep, made = [], []
    for store, name, tensor in own_slots(module):
        if not tensor.is_meta:
            keep.append(tensor)
            continue
        if id(tensor) in allocated:
            keep.append(allocated[id(tensor)])
        else:
            real = torch.empty_like(tensor, device=device)
            allocated[id(tensor)] = (
                nn.Parameter(real, tensor.requires_grad)
                if isinstance(tensor, nn.Parameter)
                else real
            )
            made.append((name, allocated[id(tensor)]))
        store[name] = allocated[id(tensor)]
    return keep, made


class _Run:
    """Runs the steps on ``target``; ``kept``: values of tied tensors to put back after the
    module's initializer."""

    def __init__(self, target: torch.device, bar: Progress) -> None:
        self.target, self.bar = target, bar
        self.allocated: dict[int, torch.Tensor] = {}
        self.kept: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: (module path, name, tensor) of each tensor an Allocate step gave new memory: its
        #: initializer must write it (``writes.py``)
        self.fresh: list[tuple[str, str, torch.Tensor]] = []

    def unwritten(self, writes: Writes) -> list[str]:
        """The tensors given memory that nothing wrote: they would hold garbage."""
        return [
            f"{p}.{n}" if p else n
            for p, n, t in self.fresh
            if getattr(t, "_local_tensor", t).numel() and not writes.wrote(t)  # (an empty shard
        ]  # holds nothing)

    def run(self, step: Step) -> None:
        if isinstance(step, Allocate):
            count = _meta_numel(iter([step.module]))
            keep, made = _allocate_own(step.module, self.target, self.allocated)
            self.fresh += [(step.path, name, t) for name, t in made]
            self.kept[id(step.module)] = [(t, t.detach().clone()) for t in keep]
            self.bar.advance(count)
        else:
            mode = init_mode(step.module, step.path)  # sharded: as if unsharded
            try:
                with mode:
                    step.init()
            except LazynnError:
                raise
            except Exception as error:
                if isinstance(mode, ShardedInit):
                    raise sharded_failure(step.path, error) from error
                raise
            for tensor, value in self.kept.pop(id(step.module), []):
                tensor.copy_(value)  # a tied tensor keeps its first owner's values


def _unwritten_error(left: list[str]) -> LazynnError:
    return LazynnError(
        message(
            "lazynn.materialize",
            "initializers (reset_parameters()) that write every element of every meta tensor "
            "they are given",
            "tensors no initializer writes whole: "
            + ", ".join(f"'{t}'" for t in left[:8])
            + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            + " (made in __init__: a mask or rotary buffer, a gain; or written in part, "
            "w[0].normal_()), which would hold uninitialized memory",
            "construct the model with lazynn.build(Net, example, device='meta') (its tensors "
            "keep their init programs: materialize runs your __init__'s code), or set these "
            "tensors whole in the module's reset_parameters()",
            outcome="the model is unchanged, on meta",
        )
    )


def _last_steps(model: nn.Module, steps: list[Step]) -> dict[int, list[QueueEntry]]:
    """The functions queued in ``model`` (``on_build``), by the index of the last step that
    allocates a tensor of their module (after it, the module is ready)."""
    found: dict[int, list[QueueEntry]] = {}
    for module, entry in due(model):
        inside = {id(m) for m in module.modules()}
        last = max((i for i, s in enumerate(steps) if id(s.module) in inside), default=None)
        if last is not None:
            found.setdefault(last, []).append(entry)
    return found


def run_steps(model: nn.Module, steps: list[Step], target: torch.device, bar: Progress) -> None:
    """Run the steps in order; a module with queued work runs it once it is allocated, as its
    eager construction would at the end of its ``__init__``. Refuses tensors given memory that
    no initializer wrote."""
    run = _Run(target, bar)
    queued = _last_steps(model, steps)
    # (inference_mode(False): parameters as a construction outside the mode makes them)
    with torch.inference_mode(False), torch.no_grad(), Writes() as writes:
        for index, step in enumerate(steps):
            run.run(step)
            if index in queued:
                with torch.enable_grad():
                    run_ready(model, only=queued[index])
    left = run.unwritten(writes)
    if left:
        raise _unwritten_error(left)
