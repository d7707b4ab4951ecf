"""A CPU generator's place in its stream: how many words a random fill draws, and words
skipped without drawing them (jumped or drawn through by numpy: ``jump.py``), merged until
something draws for real.

The words a fill draws are a function of the fill, the dtype and the element count on torch's
CPU kernels (2.13-2.15: ``uniform_`` one word an element, two for float64; ``normal_`` of 16 or
more contiguous elements the same plus 16 more for a tail that is not a whole block of 16, and
bfloat16/float16 16 words a started block; fewer than 16 elements take a scalar path whose
count depends on a cached sample: not skipped). The table is specific to the torch release, so
the first skip of a process runs :func:`self_test`: fills split at a jump, against whole ones,
values and the generator's end. If they differ, lazynn draws every word for the rest of the
process and warns once, naming the release.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> stream = Stream(g)
>>> stream.skip(fill_words("uniform", torch.float32, 10, 10))
>>> part = torch.empty(5).uniform_(generator=stream.settle())
>>> torch.equal(part, torch.empty(15).uniform_(generator=torch.Generator().manual_seed(0))[10:])
True
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .jump import advance, counters
from .tape import RESTORE

__all__ = ["Places", "Stream", "fill_words", "self_test", "skipping"]

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def fill_words(kind: str, dtype: torch.dtype, total: int, upto: int) -> int | None:
    """The words a contiguous fill of ``total`` elements has drawn once it reaches element
    ``upto`` (a multiple of 16 below ``total``, or ``total``: the whole fill); None where the
    count is not known in advance (a fill of fewer than 16 normals, another dtype)."""
    if dtype not in _FLOATS or kind not in ("uniform", "normal"):
        return None
    wide = 2 if dtype == torch.float64 else 1
    if kind == "uniform":
        return upto * wide
    if total < 16:
        return None
    if dtype in (torch.bfloat16, torch.float16):
        return 16 * -(-upto // 16)
    tail = 16 if upto == total and total % 16 else 0
    return (upto + tail) * wide


class Stream:
    """A generator with words still to skip: :meth:`skip` adds to them, :meth:`settle` moves
    the generator on by them (one jump for many skips) and returns it."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.pending = 0

    @functools.cached_property
    def jumps(self) -> bool:
        """Whether words may be skipped (a CPU generator, the self-test passed: asked at the
        first skip, so a replay that skips nothing never runs the self-test)."""
        return self.generator.device.type == "cpu" and skipping()

    def skip(self, words: int) -> None:
        self.pending += words

    def drop(self) -> None:
        """Forget the words to skip (the generator is about to be set)."""
        self.pending = 0

    def settle(self) -> torch.Generator:
        if self.pending:
            self.generator.set_state(advance(self.generator.get_state(), self.pending))
            self.pending = 0
        return self.generator


def stats() -> dict[str, float]:
    """What skipping words has cost this process so far: ``jumps`` and ``jump_seconds``
    (polynomials and their application), ``skipped_words``, and ``skip_seconds`` (words
    drawn through by numpy instead)."""
    return dict(vars(counters()))


_warned = threading.Event()


@functools.cache
def skipping() -> bool:
    """Whether skipping words reproduces this torch release's draws (:func:`self_test`,
    once a process)."""
    failed = self_test()
    if failed and not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"lazynn: on torch {torch.__version__}, random fills split at a jump of the "
            f"generator differ from whole ones ({failed}); lazynn draws every random number "
            "in this process (exact, not parallel). Please report it with the torch release.",
            RuntimeWarning,
            stacklevel=3,
        )
    return not failed


#: (fill, dtype, elements, split): sizes around blocks of 16 and a twist of 624 words
_CASES = (
    ("uniform", torch.float32, 1000, 624),
    ("uniform", torch.float64, 777, 320),
    ("uniform", torch.bfloat16, 100, 48),
    ("uniform", torch.float16, 650, 16),
    ("normal", torch.float32, 1001, 640),
    ("normal", torch.float32, 33, 16),
    ("normal", torch.float64, 50, 32),
    ("normal", torch.bfloat16, 1001, 624),
    ("normal", torch.float16, 40, 16),
)


def self_test() -> str:
    """Fills split in two at an element, the second half drawn from a generator moved on by
    the first half's words (:func:`fill_words`, :func:`~lazynn._program.jump.advance`),
    against whole fills: the values and the generator's end; then a jump of 30,720 words
    against drawing them. The first case that differs, or ''."""
    for kind, dtype, total, split in _CASES:
        fill = torch.Tensor.uniform_ if kind == "uniform" else torch.Tensor.normal_
        whole_gen = torch.Generator().manual_seed(1234)
        start = whole_gen.get_state()
        whole = fill(torch.empty(total, dtype=dtype, device="cpu"), generator=whole_gen)
        skipped, drawn = (
            fill_words(kind, dtype, total, split),
            fill_words(kind, dtype, total, total),
        )
        assert skipped is not None
        assert drawn is not None
        second = torch.Generator()
        second.set_state(advance(start, skipped, jump=False))
        first = fill(
            torch.empty(split, dtype=dtype, device="cpu"),
            generator=torch.Generator().manual_seed(1234),
        )
        rest = fill(torch.empty(total - split, dtype=dtype, device="cpu"), generator=second)
        same = torch.equal(first, whole[:split]) and torch.equal(rest, whole[split:])
        ends = torch.equal(second.get_state(), whole_gen.get_state()) and torch.equal(
            advance(start, drawn, jump=False), whole_gen.get_state()
        )
        if not (same and ends):
            return f"{kind}_ of {total} {str(dtype).replace('torch.', '')} split at {split}"
    drawn_gen = torch.Generator().manual_seed(1234)
    start, buffer = drawn_gen.get_state(), torch.empty(1024, device="cpu")
    for _ in range(30):
        buffer.uniform_(generator=drawn_gen)
    jumped = torch.Generator()
    jumped.set_state(advance(start, 30 * 1024, jump=True))
    if not torch.equal(jumped.get_state(), drawn_gen.get_state()):
        return "a jump of 30,720 words"
    return ""


class Places:
    """The generators' states a program puts back later (its ``RESTORE`` steps: the code set
    a generator back to a state it had saved), kept as a replay passes them. ``generator(key)``
    is a replay's generator (None: the default one; a number: a private one), ``streams`` its
    streams by ``id()``."""

    def __init__(
        self,
        steps: list[Any],
        generator: Callable[[int | None], torch.Generator],
        streams: dict[int, Stream],
    ) -> None:
        self.generator, self.streams = generator, streams
        #: step index -> the generators whose state after it is put back later
        self.wanted: dict[int, list[int | None]] = {}
        for step in steps:
            if step.op == RESTORE:
                source, index = step.args
                self.wanted.setdefault(index, []).append(None if source is None else source.index)
        #: (key, step index) -> the state kept there
        self.kept: dict[tuple[int | None, int], torch.Tensor] = {}
        self.passed(-1)  # (the tape's start)

    def passed(self, index: int) -> None:
        """A replay has run step ``index``: keep the states wanted after it."""
        for key in self.wanted.get(index, ()):
            generator = self.generator(key)
            self.streams[id(generator)].settle()
            self.kept[(key, index)] = generator.get_state()

    def restore(self, step: Any) -> None:
        """Run a ``RESTORE`` step: its generator set to the state kept at its place."""
        source, index = step.args
        which = step.kwargs.get("generator")
        generator = self.generator(None if which is None else which.index)
        self.streams[id(generator)].drop()
        generator.set_state(self.kept[(None if source is None else source.index, index)])
