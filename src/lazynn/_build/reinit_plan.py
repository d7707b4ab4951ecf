"""The re-initialization plan: how ``build`` reproduces an eager model's random stream.

An eager model draws every layer's numbers at construction, in construction order. A mixed
model's eager layers drew theirs while the lazy ones drew nothing, so from the first lazy
layer on they hold numbers from the wrong place in the stream. If nothing drew random
numbers between the model's construction and the build (the generator is exactly where
replaying the mixed construction from the first lazy layer's recorded state ends), the build
replays: generator set back to that state, every layer initialized in construction order. An
eager layer is re-initialized only if it still holds its constructed values and has a
``reset_parameters()``; from the first one that cannot be replayed on, later eager layers keep
their values (with a warning).

:func:`plan` decides all this before anything changes, and returns a frozen :class:`Plan`.

>>> import torch, lazynn
>>> model = torch.nn.Sequential(lazynn.LazyLinear(2), torch.nn.Linear(2, 2))
>>> chosen = plan(list(model.named_modules()), {model[0]}, None, torch.get_rng_state())
>>> chosen.start is not None, chosen.replay == frozenset({model[1]}), chosen.notes
(True, True, ())
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._module.state import find_state
from .._module.tensors import is_placeholder, own_slots, own_tensors
from .writes import Writes

__all__ = ["LOOKAHEAD", "Plan", "plan", "reset_of", "scratch_init"]

#: how many layers past the next one the replay tries when the next one's values are not
#: what it would draw (layers constructed in another order than registered)
LOOKAHEAD = 16


def reset_of(module: nn.Module) -> Any:
    """The module's ``reset_parameters``, or None."""
    reset = getattr(module, "reset_parameters", None)
    return reset if callable(reset) else None


def scratch_init(module: nn.Module, writes: Writes | None = None) -> nn.Module:
    """A copy of ``module`` re-initialized by its ``reset_parameters()`` (draws its numbers);
    ``writes`` records what the initializer writes."""
    twin = copy.deepcopy(module)
    own: Any = twin  # (reset_parameters: its class's own, not nn.Module's)
    with writes if writes is not None else contextlib.nullcontext():
        own.reset_parameters()
    return twin


def _written(twin: nn.Module, writes: Writes) -> frozenset[str]:
    """The names of ``twin``'s own tensors its initializer wrote."""
    return frozenset(name for _, name, t in own_slots(twin) if writes.wrote(t))


@dataclass(frozen=True)
class Plan:
    """How each eager layer after the first lazy one is treated (see the module doc)."""

    #: the generator state to initialize from (the first lazy layer's construction), or None:
    #: draw from the current state
    start: torch.Tensor | None = None
    #: eager layers re-initialized in construction order
    replay: frozenset[nn.Module] = frozenset()
    #: eager layers kept as they are, whose construction's draws are replayed (on a scratch
    #: copy) to keep the stream aligned: tied weights, and layers the user changed
    tied: frozenset[nn.Module] = frozenset()
    #: of ``tied``, those whose own untied tensors are re-initialized in place, as the eager
    #: construction draws them (a head tied to an embedding, with its own bias)
    retied: frozenset[nn.Module] = frozenset()
    #: replayed (and retied) layers -> the names of their own tensors their initializer
    #: writes: ``build(device="meta")`` moves only these to meta, the others keep their values
    written: Mapping[nn.Module, frozenset[str]] = field(default_factory=dict)
    #: why the model may differ from an eager one, for a warning
    notes: tuple[str, ...] = ()
    #: the modules in construction order where it is not registration order (a decoder
    #: that makes its layers last to first), for the allocation to visit; None: registration
    #: order
    walk: tuple[tuple[str, nn.Module], ...] | None = None
    #: each eager layer replayed that draws -> the key (:func:`state_key`) of the generator
    #: state its construction drew from (work written at that state was written before it,
    #: and after the layers before it that draw nothing: the build runs it between them)
    starts: Mapping[nn.Module, int] = field(default_factory=dict)
    #: the generator states of the construction's stream the replay knows (each lazy layer's
    #: construction, each replayed layer's start, the end), by :func:`state_key`: work written
    #: at another state was written under a generator the code set for it (``fork_rng``)
    known: frozenset[int] = frozenset()


def plan(
    order: list[tuple[str, nn.Module]],
    lazy: set[nn.Module],
    device: torch.device | None,
    now: torch.Tensor,
    examples: tuple[Any, ...] = (),
) -> Plan:
    """The plan for a model whose modules, in registration order, are ``order``, whose lazy
    layers are ``lazy``, built on ``device``, with the generator now at ``now``; ``examples``
    (the build's example inputs) name the cause when they are what was drawn since."""
    first = next((i for i, (_, m) in enumerate(order) if m in lazy), None)
    if first is None:
        return Plan()
    eager_after = [
        (p, m)
        for p, m in order[first + 1 :]
        if m not in lazy
        and own_tensors(m)
        and not any(is_placeholder(t) for t in own_tensors(m))  # inside a lazy layer
    ]
    path, layer = order[first]
    state = find_state(layer)
    declared = state.device if state is not None else None
    if device is not None and device.type not in ("cpu", "meta"):
        return Plan()  # another generator: draw from its current state
    if declared is not None and declared.type != "cpu" and device is None:
        return Plan()
    if state is None or state.rng is None:
        notes: tuple[str, ...] = ()
        if eager_after:
            notes = (
                f"the first lazy layer, '{path}', is torch's own (it records no "
                "construction state), so the eager layers after it keep their values and "
                "the model is not reproducible as an eager one: use lazynn's layers",
            )
        return Plan(notes=notes)
    owned = {id(t) for _, m in order[: first + 1] for t in own_tensors(m)}
    stream = _Stream(owned)
    # (the stream starts where the first lazy layer constructed was: a layer registered later
    # may have been constructed first)
    births = [find_state(m) for _, m in order[first:] if m in lazy]
    earliest = min(
        (s for s in births if s is not None and s.rng is not None), key=lambda s: s.birth
    )
    state = earliest if earliest.birth < state.birth else state
    assert state.rng is not None  # (earliest has one)
    end = stream.replay(state.rng, eager_after)
    # (When a layer cannot be replayed the stream's end is unknown: assume nothing drew.)
    if stream.stopped is None and not torch.equal(end, now):
        drawn = _examples_drawn(examples, end, now)
        return Plan(tied=frozenset(stream.tied), notes=(_drift_note(order, path, drawn),))
    return Plan(
        state.rng,
        frozenset(stream.replay_set),
        frozenset(stream.tied),
        frozenset(stream.retied),
        stream.written,
        tuple(stream.notes),
        stream.walk(order, first, lazy, end),
        {m: state_key(here) for m, here in stream.draw_starts(end).items()},
        frozenset(
            state_key(t)
            for t in (
                end,
                *(here for _, here in stream.sequence),
                *(s.rng for s in births if s is not None and s.rng is not None),
            )
        ),
    )


def state_key(state: torch.Tensor) -> int:
    """A generator state's key, for :attr:`Plan.known` (its bytes, hashed)."""
    return hash(state.numpy().tobytes())


class _Stream:
    """The replay of the eager layers' construction draws from the first lazy layer's state,
    on scratch copies (see :func:`plan`): which layers replay, which are tied or changed,
    what each initializer writes, and where the stream ends. The generator is left as it was.
    """

    def __init__(self, owned: set[int]) -> None:
        #: ids of the tensors of the modules before (a tensor seen again is a tie)
        self.owned = owned
        self.replay_set: set[nn.Module] = set()
        self.tied: set[nn.Module] = set()
        self.retied: set[nn.Module] = set()
        self.written: dict[nn.Module, frozenset[str]] = {}
        self.notes: list[str] = []
        #: the first layer that cannot be replayed (no reset_parameters), or None
        self.stopped: str | None = None
        #: the layers in the order replayed (construction order), each with the generator
        #: state its draws start from
        self.sequence: list[tuple[tuple[str, nn.Module], torch.Tensor]] = []

    def replay(self, start: torch.Tensor, eager_after: list[tuple[str, nn.Module]]) -> torch.Tensor:
        """Replay the layers' construction draws from ``start``, in the order they were
        constructed: registration order, unless a layer's values are not what it draws at its
        turn and one of the next :data:`LOOKAHEAD` layers' are (a decoder that makes its
        layers last to first): that one was constructed first. Returns the state the stream
        ends in; the generator is left as it was."""
        saved = torch.get_rng_state()
        try:
            torch.set_rng_state(start)
            pending = list(eager_after)
            while pending:
                here = torch.get_rng_state()
                index, trial = 0, self.trial(pending[0][1])
                if trial is not None and not trial.same and not trial.tied:
                    index, trial = self.constructed_first(pending, here, trial)
                entry = pending.pop(index)
                self.sequence.append((entry, here))
                self.take(entry, trial)
            end = torch.get_rng_state()
        finally:
            torch.set_rng_state(saved)
        if self.stopped is not None:
            self.notes.append(
                f"'{self.stopped}' initializes outside reset_parameters() (or has none): from "
                "it on, eager layers keep their constructed values and may differ from an eager "
                "model; lazynn.build(Net, example) (the factory form) constructs it exactly"
            )
        return end

    def constructed_first(
        self, pending: list[tuple[str, nn.Module]], here: torch.Tensor, trial: _Trial
    ) -> tuple[int, _Trial]:
        """The first of ``pending`` does not hold what it draws from ``here``: the index and
        trial of one of the next layers that does (constructed before it), or the first's
        again; the generator left where the chosen layer's draws end."""
        for index in range(1, min(len(pending), LOOKAHEAD + 1)):
            torch.set_rng_state(here)
            other = self.trial(pending[index][1])
            if other is not None and other.same and not other.tied:
                return index, other
        torch.set_rng_state(here)
        return 0, self.trial(pending[0][1]) or trial

    def trial(self, module: nn.Module) -> _Trial | None:
        """``module``'s initializer run on a scratch copy from the current state (drawing),
        compared with its values; None if it cannot be replayed (no ``reset_parameters()``,
        or after a layer that stopped the replay)."""
        tensors = own_tensors(module)
        tied = any(id(t) in self.owned for t in tensors)
        if not (tied or self.stopped is None) or reset_of(module) is None:
            return None
        writes = Writes()
        twin = scratch_init(module, writes)
        mine = [
            (a, b)
            for a, b in zip(own_tensors(twin), tensors, strict=True)
            if id(b) not in self.owned and not a.is_meta and not b.is_meta
        ]
        return _Trial(twin, writes, all(torch.equal(a, b) for a, b in mine), tied)

    def draw_starts(self, end: torch.Tensor) -> dict[nn.Module, torch.Tensor]:
        """Each replayed layer that draws (the next layer, or the stream's ``end``, starts
        elsewhere) -> the state it draws from."""
        nexts = [here for _, here in self.sequence[1:]] + [end] if self.sequence else []
        return {
            m: here
            for ((_, m), here), after in zip(self.sequence, nexts, strict=True)
            if not torch.equal(here, after)
        }

    def walk(
        self,
        order: list[tuple[str, nn.Module]],
        first: int,
        lazy: set[nn.Module],
        end: torch.Tensor,
    ) -> tuple[tuple[str, nn.Module], ...] | None:
        """The modules in construction order, for the build, where it is not registration
        order (else None): the eager layers from ``order[first]`` on as the replay found
        them, each lazy layer (by construction number) before the first of them that draws
        from the state recorded at its construction (after them all if it is the stream's
        ``end``); a module that neither draws nor is lazy stays after the module registered
        before it. None too where a lazy layer's place is unknown (its state is none of
        these: something the replay cannot see drew), as registration order is then the
        best guess."""
        states = (((p, m), find_state(m)) for p, m in order[first:] if m in lazy)
        lazies = sorted(
            ((entry, state) for entry, state in states if state is not None),
            key=lambda lazy_entry: lazy_entry[1].birth,
        )
        events: list[tuple[str, nn.Module]] = []
        at = 0
        drawing = self.draw_starts(end)
        for entry, state in lazies:
            rng = state.rng
            if rng is None:
                return None
            # (before the first that draws from it: those that draw nothing at that state,
            # which work written after them may change, are re-initialized first)
            found = next(
                (
                    i
                    for i in range(at, len(self.sequence))
                    if self.sequence[i][0][1] in drawing and torch.equal(self.sequence[i][1], rng)
                ),
                None,
            )
            if found is None and not torch.equal(rng, end):
                return None
            found = len(self.sequence) if found is None else found
            events += [done for done, _ in self.sequence[at:found]] + [entry]
            at = found
        events += [done for done, _ in self.sequence[at:]]
        rank = {id(m): i for i, (_, m) in enumerate(events)}
        key, keys = -1.0, []
        for _, module in order[first:]:
            if id(module) not in rank:  # (a container, torch's own lazy layer: after the
                key += 1e-6  # module before it that is lazy or draws)
                keys.append(key)
                continue
            keys.append(float(rank[id(module)]))
            if module in lazy or module in drawing:  # (one that draws nothing was moved
                key = keys[-1]  # before the lazy layers at its state: nothing follows it)
        pairs = sorted(zip(keys, range(len(keys)), strict=True))
        moved = [order[first + index] for _, index in pairs]
        if moved == order[first:]:
            return None
        return (*order[:first], *moved)

    def take(self, entry: tuple[str, nn.Module], trial: _Trial | None) -> None:
        """Note what the build does with ``entry``'s module, replayed as ``trial``."""
        path, module = entry
        tensors = own_tensors(module)
        if trial is not None:
            if trial.same and (not trial.tied or self.stopped is None):
                self.written[module] = _written(trial.twin, trial.writes)
                (self.retied if trial.tied else self.replay_set).add(module)
            if trial.tied or not trial.same:  # changed by the user: kept, the stream advances
                self.tied.add(module)
            if not trial.same:
                self.notes.append(
                    f"kept the values of '{path}': they were changed after construction, so "
                    "it was not re-initialized in construction order"
                )
        elif not any(id(t) in self.owned for t in tensors) and self.stopped is None:
            self.stopped = path
        self.owned.update(id(t) for t in tensors)


@dataclass(frozen=True)
class _Trial:
    """A layer's initializer run on a scratch copy (``twin``, what it wrote: ``writes``):
    whether it gives the layer's values (``same``), and whether the layer is tied to one
    before it (``tied``)."""

    twin: nn.Module
    writes: Writes
    same: bool
    tied: bool


def _examples_drawn(examples: tuple[Any, ...], end: torch.Tensor, now: torch.Tensor) -> bool:
    """Whether the numbers drawn since the construction are exactly the example inputs':
    ``torch.randn`` or ``torch.rand`` of their shapes, in order, from where replaying the
    construction ends (``end``) gives their values and leaves the generator at ``now``."""
    tensors = [t for t in examples if isinstance(t, torch.Tensor)]
    if not tensors or not all(t.device.type == "cpu" and t.is_floating_point() for t in tensors):
        return False
    generator = torch.Generator()
    generator.set_state(end)
    for tensor in tensors:
        state = generator.get_state()
        for draw in (torch.randn, torch.rand):
            generator.set_state(state)
            if torch.equal(draw(tensor.shape, generator=generator, dtype=tensor.dtype), tensor):
                break
        else:
            return False
    return torch.equal(generator.get_state(), now)


def _drift_note(order: list[tuple[str, nn.Module]], first: str, examples: bool = False) -> str:
    """Why the generator is not where replaying the construction ends, for the warning.

    ``examples``: the example inputs are what was drawn since (``torch.randn`` between
    constructing and building): say so, and how to draw them apart. Else a module enclosing
    the first lazy layer (``first``) may have drawn numbers for tensors of its own in its
    ``__init__`` after constructing that layer (a ViT's ``cls_token``): draws lazynn cannot
    replay, since no ``reset_parameters()`` makes them. Name those tensors.
    """
    enclosing = [
        (path, module)
        for path, module in order
        if (not path or first.startswith(path + ".")) and own_tensors(module)
    ]
    named = [
        f"'{f'{path}.{name}' if path else name}'"
        for path, module in enclosing
        for store, name, tensor in own_slots(module)
        if store is module._parameters  # (buffers are mostly deterministic: zeros, ones)
        and not is_placeholder(tensor)
        and tensor.is_floating_point()
    ]
    effect = (
        "the lazy layers are initialized from the current random state (as a first call "
        "would) and the eager ones keep their values, so the model differs from an eager one"
    )
    if examples:
        return (
            "the example inputs were drawn from torch's generator after the model was "
            f"constructed (torch.randn(...) between the model and build()): {effect}; for an "
            "exact eager twin, draw them from a generator of their own (torch.randn(shape, "
            "generator=torch.Generator().manual_seed(0))) or before the model, or give their "
            "shapes instead (lazynn.build(model, (4, 16)))"
        )
    if named:
        return (
            f"the generator is not where replaying the model's construction ends: "
            f"{', '.join(named[:4])}{' ...' if len(named) > 4 else ''} (tensors a module "
            f"creates in its own __init__, around the lazy layer '{first}') may have drawn "
            "random numbers after that layer was constructed, which lazynn cannot replay, or "
            f"numbers were drawn between constructing the model and build(): {effect}; for an "
            "exact eager twin, construct the model with lazynn.build(Net, example) (the "
            "factory form: it runs your __init__ with every size known), or create such "
            "tensors before the first lazy layer in __init__"
        )
    return (
        "random numbers were drawn after the first lazy layer was constructed, by other "
        "code than the eager layers' own construction: in the model's __init__ (an init "
        "pass over eager layers, such as self.apply(init_fn) or a post_init; a module "
        "constructed and left out of the model) or between constructing the model and "
        f"build(): {effect}; for an exact eager twin, construct it with lazynn.build(Net, "
        "example) (the factory form: it runs your __init__ with every size known)"
    )
