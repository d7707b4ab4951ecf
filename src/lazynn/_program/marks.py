"""Where the code leaves a generator while a construction is recorded: marks in its seed field.

A recorded construction runs on meta, where draws move no generator: the tape says how far
each one goes. The code may still set a generator itself: ``torch.manual_seed``,
``g.manual_seed(3)``, ``torch.set_rng_state(saved)``, ``g.set_state(saved)``,
``torch.random.fork_rng()`` (which puts back, on exit, the state it saved on entry). None of
these is a torch function a mode sees, so :class:`Marks` watches the generators instead: the
first 8 bytes of a CPU generator's state are its seed field (``the_initial_seed``), which no
draw reads or writes and every reseed rewrites. Each generator the recording follows (the
default one from the start; a private one from its first draw) holds a *mark* there, a new one
after every step that moves it, so that a state the code saves carries the place in the
program it was saved at. Before each step that draws from a generator, and at the end:

* the seed field is the generator's last mark: nothing happened (another thread's draws keep
  it: they are not the program's);
* it is an earlier mark: the code put back a state it had saved: a :data:`RESTORE` step, to the
  place that mark names (a replay keeps the generator's state at that place);
* it is anything else: the code set a state of its own: a :data:`RESEED` step, with it.

:meth:`Marks.release` puts each generator's own seed field back, and its whole state where
the code set it (what it set is a step of the program, not the process's). What the marks
cannot hide: ``torch.initial_seed()`` (and the seed field of a state) read while a
construction is recorded is a mark, not the seed (the meta door, a factory's first run).

>>> import torch
>>> from lazynn._program.tape import Tape, Const
>>> tape = Tape()
>>> marks = Marks(tape, lambda t: Const(0))
>>> saved = torch.get_rng_state()        # the code saves the state (a mark: the start)
>>> tape.steps.append(None)              # (a draw, as a recording writes it)
>>> marks.moved(None, 0)
>>> torch.set_rng_state(saved)           # and puts it back
>>> marks.check(None)
>>> tape.steps[-1].op, tape.steps[-1].args
('lazynn::restore', (None, -1))
>>> marks.release()
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import torch

from .tape import RESEED, RESTORE, Const, GeneratorRef, Step, Tape

__all__ = ["Marks"]

#: the first 3 bytes of a seed field a recording wrote (then: how deep the recording is
#: nested in another, and which mark of it: the same in every run of one construction)
_TAG = b"lzy"
#: how many recordings are running, nested, on this thread
_DEPTH = threading.local()


def _field(state: torch.Tensor) -> bytes:
    return bytes(state[:8].tolist())


class Marks:
    """The generators a recording follows, by key (None: the default one; a number: the
    tape's private generator), and their marks (see the module doc). ``const(state)`` keeps
    a state on the tape."""

    def __init__(self, tape: Tape, const: Callable[[torch.Tensor], Const]) -> None:
        self.tape = tape
        self.const = const
        #: key -> the generator
        self.generators: dict[int | None, torch.Generator] = {}
        #: key -> its state before the recording marked it
        self.starts: dict[int | None, torch.Tensor] = {}
        #: key -> the mark it holds now
        self.last: dict[int | None, bytes] = {}
        #: mark -> (the key of the generator it was written in, the step after which it was)
        self.places: dict[bytes, tuple[int | None, int]] = {}
        #: the generators the code set (a state of its own, or one it had saved)
        self.set: set[int | None] = set()
        self.depth = getattr(_DEPTH, "value", 0)
        _DEPTH.value = self.depth + 1
        self._counter = itertools.count(1)
        self.follow(None, torch.default_generator)

    def follow(self, key: int | None, generator: torch.Generator) -> None:
        """Follow ``generator`` from here (the tape's start for it: place -1). A generator
        the code set from another it saved a state of (``g.set_state(torch.get_rng_state())``
        before its first draw) starts where that one was then: a RESTORE step."""
        if key in self.generators or generator.device.type != "cpu":
            return
        self.generators[key] = generator
        self.starts[key] = generator.get_state()
        place = self.places.get(_field(self.starts[key]))
        if place is None:
            self._mark(key, -1)
            return
        source, index = place
        at = None if source is None else GeneratorRef(source)
        ref = None if key is None else GeneratorRef(key)
        self.tape.steps.append(Step(RESTORE, (at, index), {"generator": ref}))
        self.set.add(key)
        self._mark(key, len(self.tape.steps) - 1)

    def _mark(self, key: int | None, place: int) -> None:
        generator = self.generators[key]
        mark = _TAG + bytes([self.depth % 256]) + next(self._counter).to_bytes(4, "little")
        state = generator.get_state()
        state[:8] = torch.tensor(list(mark), dtype=torch.uint8, device="cpu")
        generator.set_state(state)
        self.last[key] = mark
        self.places[mark] = (key, place)

    def moved(self, key: int | None, index: int) -> None:
        """Step ``index`` of the tape moved the generator ``key``: a new mark, for that place."""
        if key in self.generators:
            self._mark(key, index)

    def check(self, key: int | None) -> None:
        """Write a step for what the code did to the generator ``key`` since its last mark, if
        anything (see the module doc)."""
        generator = self.generators.get(key)
        if generator is None:
            return
        state = generator.get_state()
        field = _field(state)
        if field == self.last[key]:
            return
        ref = None if key is None else GeneratorRef(key)
        place = self.places.get(field)
        if place is not None:  # a state the code saved, put back
            source, index = place
            at = None if source is None else GeneratorRef(source)
            self.tape.steps.append(Step(RESTORE, (at, index), {"generator": ref}))
        else:  # a state of the code's own
            self.tape.steps.append(Step(RESEED, (self.const(state),), {"generator": ref}))
        self.set.add(key)
        self._mark(key, len(self.tape.steps) - 1)

    def check_all(self) -> None:
        for key in list(self.generators):
            self.check(key)

    def release(self) -> None:
        """Each generator as it was: wholly where the code set it (what it set was a step of
        the program, not the process's), else its seed field only (no draw of the recording
        moved it; another thread's draws from it meanwhile stay)."""
        _DEPTH.value = self.depth
        for key, generator in self.generators.items():
            if key in self.set:
                generator.set_state(self.starts[key])
                continue
            state = generator.get_state()
            state[:8] = self.starts[key][:8]
            generator.set_state(state)
