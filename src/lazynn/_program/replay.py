"""Running a tape: the values its steps give a model's tensors, on any device, whole or as one
block of a shard.

:class:`Replay` runs a :class:`~lazynn._program.tape.Tape` in program order, on private
generators that start where the construction's did (so no one else's draws are touched, and
the numbers are the eager program's). It computes only what the tensors asked for need
(:meth:`Replay.run`): a step that makes or writes one of them, or a tensor one of those reads;
every other random step is drawn through without keeping its numbers
(:func:`~lazynn._program.draws.draw_through`), so that the stream stays where eager code would
have it. A tensor asked for as a :class:`Block` (a rank's shard) is computed block by block
when its steps allow it (it is made by a fill, written by whole-tensor random fills and
elementwise steps, and read by no other step): each rank then holds only its block. Any
other is computed whole, and its block kept: in bands of rows where its steps allow it
(:mod:`.bands`), and ``trunc_normal_``'s rounds in parts (:mod:`.rounds`), so that beyond
the tensors it keeps a replay holds about one chunk of numbers at once.

>>> import torch
>>> from lazynn._program.record import Recorder
>>> with torch.device("meta"), Recorder() as recorder:
...     layer = torch.nn.Linear(3, 2)
>>> _ = torch.manual_seed(0)
>>> values = Replay(recorder.tape, "cpu").run({recorder.view_of(layer.weight): None})
>>> _ = torch.manual_seed(0)
>>> torch.equal(next(iter(values.values())), torch.nn.Linear(3, 2).weight)
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from .bands import plan, run_band
from .blocks import ELEMENTWISE, FILLED, OVERWRITES, TRUNC_NORMAL, Block, Ranks
from .draws import FILLS, call_drawing, draw_parts, draw_region, draw_through
from .rounds import alone, count_rounds, splittable, trunc_normal_block, trunc_normal_parts
from .stream import Places, Stream
from .tape import (
    LIKE_OPS,
    RESEED,
    RESTORE,
    Const,
    GeneratorRef,
    Like,
    Step,
    Tape,
    View,
    as_view,
    extent,
    is_contiguous,
    resolve,
    views_in,
)

__all__ = ["Block", "Ranks", "Replay"]


class Replay:
    """Runs ``tape`` on ``device`` (see the module doc). ``default``: the state the device's
    own generator starts from (default: its state now); the tape's other generators start
    from the states it recorded. ``ranks``: the processes replaying it with this one, which
    then share the rounds of ``trunc_normal_`` (each draws its part, :mod:`.rounds`).
    ``threads``: how many threads draw each large whole-tensor fill on the CPU, in parts
    (:func:`~.draws.draw_parts`)."""

    def __init__(
        self,
        tape: Tape,
        device: torch.device | str,
        default: torch.Tensor | None = None,
        ranks: Ranks | None = None,
        threads: int = 1,
    ) -> None:
        self.tape = tape
        self.ranks, self.threads = ranks, threads
        self.device = torch.device(device)
        kind = "cuda" if self.device.type == "cuda" else "cpu"
        self.default = torch.Generator(device=self.device if kind == "cuda" else "cpu")
        if default is None:
            default = (
                torch.cuda.get_rng_state(self.device) if kind == "cuda" else torch.get_rng_state()
            )
        self.default.set_state(default)
        self.private = []
        for state in tape.generators:
            generator = torch.Generator()
            generator.set_state(state)
            self.private.append(generator)
        #: id(generator) -> its place, words still to skip (settled before anything draws)
        self.streams = {id(g): Stream(g) for g in (self.default, *self.private)}
        #: storage -> the real tensor holding it
        self.env: dict[int, torch.Tensor] = {}
        #: how many steps have run (the generators are there)
        self.done = 0
        #: the generators' states the program puts back later (RESTORE steps)
        self._places = Places(tape.steps, self._generator, self.streams)
        self._sizes: dict[int, int] | None = None  # storage -> its elements

    # --- what runs -------------------------------------------------------------------------
    def needed(self, wanted: Iterable[int], upto: int) -> tuple[set[int], set[int]]:
        """The steps before ``upto`` that the storages ``wanted`` need, and every storage they
        need (walked back from the end: a step that makes or writes a needed storage is
        needed, and so is what it reads; before a step that overwrites a storage whole
        without reading it, only the step that makes it is)."""
        storages = set(wanted)
        steps: set[int] = set()
        overwritten: set[int] = set()  # (needed only made: what writes them comes later)
        for index in range(upto - 1, -1, -1):
            step = self.tape.steps[index]
            if step.op in (RESEED, RESTORE):
                continue
            if not storages.isdisjoint((*step.creates, *step.writes)):
                steps.add(index)
                gone = self.overwrites(step)
                storages.update(s for s in (*step.reads, *step.writes) if s != gone)
                if gone is not None:
                    storages.discard(gone)
                    overwritten.add(gone)
            elif not overwritten.isdisjoint(step.creates):
                steps.add(index)  # (what makes it: a clone reads its source)
                storages.update(step.reads)
        return steps, storages

    def overwrites(self, step: Step) -> int | None:
        """The storage ``step`` writes every element of without reading it (a whole-tensor
        fill, ``trunc_normal_``, ``zero_``, ``fill_``, ``copy_``), or None."""
        target = step.args[0] if step.args else None
        if step.op not in OVERWRITES or not isinstance(target, View) or target.offset:
            return None
        if target.storage in step.reads or not is_contiguous(target):
            return None
        if self._sizes is None:
            self._sizes = {}
            for made in self.tape.steps:
                for view in made.outputs:
                    if view is not None and view.storage in made.creates:
                        size = max(self._sizes.get(view.storage, 0), extent(view))
                        self._sizes[view.storage] = size
        return target.storage if self._sizes.get(target.storage) == target.numel else None

    def run(
        self,
        wanted: Mapping[View, Block | None],
        upto: int | None = None,
        have: Mapping[int, torch.Tensor] | None = None,
        draw_all: bool = True,
    ) -> dict[View, torch.Tensor]:
        """Run the tape (its first ``upto`` steps) and return each wanted tensor's value: a
        tensor on the device, or for a :class:`Block`, its ``local`` filled. ``have``: storages
        whose values are given (loaded from a checkpoint): their steps only draw.
        ``draw_all``: draw through every random step, so that the generators end where the
        program leaves them (else only those before the last one a wanted value needs)."""
        upto = len(self.tape.steps) if upto is None else upto
        given = dict(have or {})
        self.env.update(given)
        blocks = {v.storage: b for v, b in wanted.items() if b is not None}
        local = {s for s, b in blocks.items() if self._splits(s, b.view, upto)}
        whole = {v.storage for v, b in wanted.items() if b is None or v.storage not in local}
        steps, _ = self.needed(whole - set(given), upto)
        overwritten = {  # (a block's steps before its last whole overwrite: only drawn)
            gone: index
            for index, step in enumerate(self.tape.steps[:upto])
            if (gone := self.overwrites(step)) in local
        }
        mine = {
            index
            for index, step in enumerate(self.tape.steps[:upto])
            for storage in local.intersection((*step.creates, *step.writes))
            if index >= overwritten.get(storage, 0) or storage in step.creates
        }
        while True:
            drawn = [i for i in (*steps, *mine) if self.tape.steps[i].random]
            horizon = upto if draw_all else max(drawn, default=-1)
            # A random step only drawn through still reads its inputs' values where it has
            # any (poisson's rates, multinomial's probabilities, bernoulli's p): how many
            # numbers it draws, and whether it accepts them, may depend on them. They are
            # computed for real, never taken from scratch memory.
            inputs = (
                {
                    storage
                    for index, step in enumerate(self.tape.steps[: max(horizon, 0)])
                    if step.random and index not in steps and index not in mine
                    for storage in step.reads
                }
                - whole
                - set(given)
            )
            if not inputs:
                break
            whole |= inputs
            steps, _ = self.needed(whole - set(given), upto)
        keep = whole | set(given)
        cpu = self.device.type == "cpu"  # (row-wise steps checked on torch's CPU kernels)
        held = keep | set(self.env)
        bands = plan(self.tape, whole - set(given), steps, held, self.done) if cpu else {}
        inside = {i for band in bands.values() for i in band.makes if i != band.at}
        last = self._last_uses(steps, keep, {at: band.reads for at, band in bands.items()})
        for index in range(self.done, upto):
            step = self.tape.steps[index]
            if step.op == RESEED:
                self._reseed(step)
            elif step.op == RESTORE:
                self._places.restore(step)
            elif index in mine:
                self._run_block(step, blocks)
            elif index in bands:
                self.env[bands[index].target] = run_band(
                    bands[index], self.tape, self._value, self.device
                )
            elif index in steps and index not in inside:
                self._execute(step)
            elif step.random and index < horizon:
                self._draw_through(step)
            for storage in last.get(index, ()):  # (a temporary nothing reads again)
                self.env.pop(storage, None)
            self._places.passed(index)
        self.settle()
        self.done = upto if draw_all else max(horizon + 1, self.done)
        out = {}
        for view, block in wanted.items():
            if block is not None:
                if view.storage not in local:
                    full = as_view(self.env[view.storage], view)
                    part = tuple(
                        slice(o, o + n)
                        for o, n in zip(block.offset, block.local.shape, strict=True)
                    )
                    with torch.no_grad():
                        block.local.copy_(full[part])
                out[view] = block.local
            else:
                out[view] = as_view(self.env[view.storage], view)
        return out

    def value_of(self, view: View, block: Block | None) -> torch.Tensor | None:
        """The value of ``view`` so far (its block's memory for a block), or None if nothing
        has made it yet."""
        if block is not None and view.storage not in self.env:
            return block.local
        base = self.env.get(view.storage)
        return None if base is None else as_view(base, view)

    def settle(self) -> None:
        """Move every generator on by the words skipped so far."""
        for stream in self.streams.values():
            stream.settle()

    def lent(self) -> Iterator[None]:
        """The default generator of the device set to the replay's, for code that draws from
        it (queued work), and the replay's set to where that code left it."""
        self.settle()
        cuda = self.device.type == "cuda"
        held = torch.cuda.get_rng_state(self.device) if cuda else torch.get_rng_state()
        if cuda:
            torch.cuda.set_rng_state(self.default.get_state(), self.device)
        else:
            torch.set_rng_state(self.default.get_state())
        try:
            yield
        finally:
            now = torch.cuda.get_rng_state(self.device) if cuda else torch.get_rng_state()
            self.default.set_state(now)
            if cuda:
                torch.cuda.set_rng_state(held, self.device)
            else:
                torch.set_rng_state(held)

    def finish(self) -> None:
        """Leave the device's generator, and each recorded one, where the program leaves it."""
        self.settle()
        for owner, private in zip(self.tape.owners, self.private, strict=False):
            generator = owner()
            if generator is not None:
                generator.set_state(private.get_state())
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(self.default.get_state(), self.device)
        else:
            torch.set_rng_state(self.default.get_state())

    # --- one step --------------------------------------------------------------------------
    def _last_uses(
        self, steps: set[int], keep: set[int], reads: Mapping[int, Iterable[int]]
    ) -> dict[int, list[int]]:
        """Step index -> the storages nothing needed reads or writes after it (freed there);
        ``reads``: more storages steps read (a band's, where it is computed)."""
        last: dict[int, int] = {}
        for index in sorted(steps):
            step = self.tape.steps[index]
            for storage in (*step.creates, *step.reads, *step.writes, *reads.get(index, ())):
                last[storage] = index
        out: dict[int, list[int]] = {}
        for storage, index in last.items():
            if storage not in keep:
                out.setdefault(index, []).append(storage)
        return out

    def _value(self, value: Any) -> Any:
        if isinstance(value, View):
            return as_view(self.env[value.storage], value)
        if isinstance(value, Like):  # (a shape: a meta tensor of it; the step's device is set)
            return torch.empty_strided(value.size, value.stride, dtype=value.dtype, device="meta")
        if isinstance(value, Const):
            const = self.tape.consts[value.index]
            return const.to(self.device) if const.device != self.device else const
        if isinstance(value, GeneratorRef):
            return self.private[value.index]
        if isinstance(value, torch.device) and value.type == "meta":
            return self.device
        if isinstance(value, (list, tuple)):
            return type(value)(self._value(v) for v in value)
        return value

    def _call(self, step: Step) -> Any:
        args = tuple(self._value(a) for a in step.args)
        kwargs = {k: self._value(v) for k, v in step.kwargs.items()}
        if step.op in LIKE_OPS and kwargs.get("device") is None:
            kwargs["device"] = self.device  # (else the meta tensor's)
        with torch.no_grad():
            if step.random:
                kwargs.pop("generator", None)
                generator = self._stream(step).settle()
                return call_drawing(resolve(step.op), args, kwargs, generator)
            return resolve(step.op)(*args, **kwargs)

    def _execute(self, step: Step) -> None:
        if self._rounds(step) and (self.ranks is not None or self.threads == 1):
            # (in parts; a rank's rounds agreed with the other ranks, as they do)
            target = step.args[0]
            assert isinstance(target, View)
            whole = as_view(self.env[target.storage], target)
            self._trunc_normal(step, whole, target.size, (0,) * len(target.size))
            return
        if self.threads > 1 and step.random and self._in_parts(step):
            return
        result = self._call(step)
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        for view, value in zip(step.outputs, outputs, strict=False):
            if view is not None and view.storage in step.creates and view.storage not in self.env:
                self.env[view.storage] = value

    def _reseed(self, step: Step) -> None:
        (state,) = step.args
        which = step.kwargs.get("generator")
        generator = self.private[which.index] if isinstance(which, GeneratorRef) else self.default
        self.streams[id(generator)].drop()
        generator.set_state(self._value(state))

    def _generator(self, key: int | None) -> torch.Generator:
        return self.default if key is None else self.private[key]

    def _stream(self, step: Step) -> Stream:
        which = step.kwargs.get("generator")
        generator = self.private[which.index] if isinstance(which, GeneratorRef) else self.default
        return self.streams[id(generator)]

    def _draw_through(self, step: Step) -> None:
        """Draw what a random step nothing needs would draw, keeping nothing (chunks of a
        whole-tensor fill; otherwise the step itself, on scratch tensors)."""
        target = step.args[0] if step.args else None
        if self._rounds(step):  # (rounds counted on this rank's slice, agreed, or the whole)
            assert isinstance(target, View)
            ranks = self.ranks or Ranks(0, 1, alone)
            total, size = target.numel, ranks.size
            edges = [*(16 * (total * i // size // 16) for i in range(size)), total]
            lo, hi = edges[ranks.rank : ranks.rank + 2]
            bounds = tuple(float(v) for v in step.args[1:])
            count_rounds(total, lo, hi, target.dtype, bounds, self._stream(step), ranks.agree)
            return
        fill = FILLS.get(step.op)
        if fill is not None and isinstance(target, View) and is_contiguous(target):
            kwargs = {k: self._value(v) for k, v in step.kwargs.items()}
            stream = self._stream(step)
            kwargs["generator"] = stream.generator
            args = tuple(self._value(a) for a in step.args[1:])
            with torch.no_grad():
                draw_through(fill, target.size, target.dtype, args, kwargs, stream=stream)
            return
        scratch: dict[int, torch.Tensor] = {}
        for value in (*step.args, *step.kwargs.values()):
            for view in views_in(value):
                if view.storage not in self.env and view.storage not in scratch:
                    size = extent(view)
                    scratch[view.storage] = torch.empty(size, dtype=view.dtype, device=self.device)
        saved = {s: self.env[s] for s in scratch if s in self.env}
        self.env.update(scratch)
        try:
            self._call(step)
        finally:
            for storage in scratch:
                self.env.pop(storage, None)
            self.env.update(saved)

    # --- blocks ----------------------------------------------------------------------------
    def _splits(self, storage: int, view: View, upto: int) -> bool:
        """Whether the tensor ``view`` (all of ``storage``) can be computed block by block:
        made by a fill, written only whole by random fills and elementwise steps with
        scalars, and read by no other step."""
        if not is_contiguous(view) or view.offset != 0:
            return False
        made = False
        for step in self.tape.steps[:upto]:
            touches = storage in step.creates or storage in step.writes
            if not touches:
                if storage in step.reads:
                    return False  # read by another tensor's steps: it must exist whole
                continue
            if storage in step.creates:
                if step.op not in FILLED or step.outputs[0] != view:
                    return False
                made = True
                continue
            target = step.args[0] if step.args else None
            if target != view or any(views_in(a) for a in step.args[1:]):
                return False
            if any(views_in(v) for v in step.kwargs.values()):
                return False
            known = step.op in FILLS or step.op in ELEMENTWISE or self._shared_rounds(step)
            if not known:
                return False
        return made

    def _run_block(self, step: Step, blocks: Mapping[int, Block]) -> None:
        """One step of a tensor computed block by block, on this rank's block."""
        storage = next(s for s in (*step.creates, *step.writes) if s in blocks)
        block = blocks[storage]
        local = block.local
        if storage in step.creates:
            value = FILLED[step.op]
            if value is not None:
                with torch.no_grad():
                    local.fill_(value)
            return
        args = tuple(self._value(a) for a in step.args[1:])
        kwargs = {k: self._value(v) for k, v in step.kwargs.items()}
        fill: Callable[..., Any] | None = FILLS.get(step.op)
        if self._shared_rounds(step):
            self._trunc_normal(step, local, block.view.size, block.offset)
            return
        with torch.no_grad():
            if fill is not None:
                stream = self._stream(step)
                kwargs["generator"] = stream.generator
                draw_region(local, fill, block.view.size, block.offset, args, kwargs, stream=stream)
            else:
                resolve(step.op)(local, *args, **kwargs)

    def _in_parts(self, step: Step) -> bool:
        """Run a large fill (or ``trunc_normal_``'s rounds) of a whole contiguous tensor with
        :attr:`threads` threads; False, having done nothing, where that does not apply."""
        target = step.args[0] if step.args else None
        fill = FILLS.get(step.op)
        if not isinstance(target, View) or not is_contiguous(target):
            return False
        trunc = step.op == TRUNC_NORMAL and splittable(target.dtype, target.numel, step.args[1:])
        if not (fill or trunc):
            return False
        tensor = as_view(self.env[target.storage], target)
        args = tuple(self._value(a) for a in step.args[1:])
        kwargs = {k: self._value(v) for k, v in step.kwargs.items() if k != "generator"}
        generator = self._stream(step).settle()
        with torch.no_grad():
            if fill is not None:
                return draw_parts(tensor, fill, args, kwargs, generator, self.threads)
            trunc_normal_parts(tensor, tuple(float(a) for a in args), generator, self.threads)
        return True

    def _rounds(self, step: Step) -> bool:
        """Whether lazynn draws this step's rounds: a ``trunc_normal_`` of a whole contiguous
        CPU tensor that :func:`~.rounds.splittable` allows."""
        target = step.args[0] if step.args else None
        return (
            step.op == TRUNC_NORMAL
            and self.device.type == "cpu"
            and isinstance(target, View)
            and is_contiguous(target)
            and splittable(target.dtype, target.numel, step.args[1:])
        )

    def _shared_rounds(self, step: Step) -> bool:
        """Whether ranks share the rounds of this step (:meth:`_rounds`, between ranks)."""
        return self.ranks is not None and self._rounds(step)

    def _trunc_normal(
        self, step: Step, local: torch.Tensor, shape: tuple[int, ...], offset: tuple[int, ...]
    ) -> None:
        bounds = tuple(float(v) for v in step.args[1:])
        agree = self.ranks.agree if self.ranks is not None else alone
        trunc_normal_block(local, shape, offset, bounds, self._stream(step), agree)
