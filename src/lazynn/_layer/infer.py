"""What a lazy layer infers: :class:`Infer`, where a size is read from the inputs, and
:data:`UNKNOWN`, the value of a size before the build (it prints ``?``).

>>> Infer(layouts=("(C, H, W)", "(N, C, H, W)")).read((8, 3, 32, 32))
3
>>> UNKNOWN
?
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._errors import BUILD, CALL_NOT_FORWARD, UnbuiltError, message, shape_str
from .._module.callers import find_tool

__all__ = ["CLASS_KEY", "UNKNOWN", "Infer", "ambiguity", "unknown_parts"]

#: In a size record: the class a rank-agnostic layer chose (not a constructor argument).
CLASS_KEY = "__lazynn_class__"


class _Unknown:
    """The value of an inferred size before the build; prints as ``?``."""

    _instance: ClassVar[_Unknown | None] = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    def __format__(self, spec: str) -> str:
        return "?"

    def __reduce__(self) -> str:
        return "UNKNOWN"

    def __deepcopy__(self, memo: dict[int, Any]) -> _Unknown:
        return self

    def _refuse(self, *args: object) -> Any:
        tool = find_tool()
        raise UnbuiltError(
            message(
                "an inferred size (shown as ?)",
                f"a built layer for {tool.name}" if tool else "a built layer to compute with it",
                "a layer whose sizes the first input has not decided yet",
                tool.fix
                if tool
                else f"build first: {BUILD}, or call the model on an "
                f"example input ({CALL_NOT_FORWARD}), or load a built checkpoint",
            )
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __index__ = __int__ = __float__ = __bool__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = _refuse
    __hash__ = object.__hash__


#: The value of an inferred size (``in_features``...) before the build.
UNKNOWN = _Unknown()
"""The value of an inferred size before the build (``LazyLinear(4).in_features``); prints
``?``, and refuses arithmetic and comparisons, which would use a size not known yet.

>>> import lazynn
>>> layer = lazynn.LazyLinear(4)
>>> layer.in_features is lazynn.UNKNOWN, layer
(True, LazyLinear(in_features=?, out_features=4, bias=True))
"""

_LAYOUT = re.compile(r"^\((.*)\)$")


@dataclass(frozen=True)
class Infer:
    """Where a constructor argument is read from a forward call's inputs.

    Args:
        dim: the input dimension that gives the size. Default: ``-1`` (the last).
        arg: which forward argument: a position or a parameter name. Default: ``0``.
        layouts: the input layouts accepted, such as ``("(C, H, W)", "(N, C, H, W)")``.
            When given, the input's rank must be one of theirs, and the size is read at the
            position of ``letter`` in the matching layout (so unbatched and batched inputs
            each read the right dimension). When empty, any rank reaching ``dim`` is fine.
        letter: the layout letter to read. Default: ``"C"``.
        probe: a value valid for the constructor, used to lay out placeholders before the
            build: an int, or the name of another constructor argument whose value is valid
            (``"groups"`` for convolutions). Default: ``1``.
        trailing: read the last ``trailing`` dimensions as a tuple (``LayerNorm``'s
            ``normalized_shape``) instead of one dimension. Default: ``None``.

    >>> Infer(dim=-1).read_dim(3)
    2
    >>> Infer(layouts=("(C, L)", "(N, C, L)")).read_dim(2)
    0
    """

    dim: int = -1
    arg: int | str = 0
    layouts: tuple[str, ...] = ()
    letter: str = "C"
    probe: int | str = 1
    trailing: int | None = None

    def _letters(self, layout: str) -> list[str]:
        match = _LAYOUT.match(layout.strip())
        inner = match.group(1) if match else layout
        return [part.strip() for part in inner.split(",") if part.strip()]

    def accepted(self) -> str:
        """The accepted inputs, for messages: ``"a 3-d (C, H, W) or 4-d (N, C, H, W) input"``."""
        if self.trailing is not None:
            return f"an input of rank >= {self.trailing}"
        if not self.layouts:
            return f"an input of rank >= {self.dim + 1 if self.dim >= 0 else -self.dim}"
        parts = [f"{len(self._letters(lay))}-d {lay}" for lay in self.layouts]
        return "a " + " or ".join(parts) + " input"

    def read_dim(self, rank: int) -> int | None:
        """The dimension to read for an input of ``rank``, or None if the rank is refused."""
        if not self.layouts:
            ok = -rank <= self.dim < rank
            return (self.dim % rank) if ok else None
        for layout in self.layouts:
            letters = self._letters(layout)
            if len(letters) == rank:
                return letters.index(self.letter)
        return None

    def probe_value(self, kwargs: Mapping[str, Any]) -> Any:
        """The value placeholders are laid out with before the build: ``probe``, or the value
        of the constructor argument it names (in ``kwargs``); a tuple of ``trailing`` of them
        when ``trailing`` is set."""
        value = int(kwargs[self.probe]) if isinstance(self.probe, str) else self.probe
        return (value,) * self.trailing if self.trailing is not None else value

    def read(self, shape: Sequence[int]) -> Any:
        """The size this spec reads from an input of ``shape`` (None if the rank is refused)."""
        if self.trailing is not None:
            ok = 0 < self.trailing <= len(shape)
            return tuple(int(d) for d in shape[len(shape) - self.trailing :]) if ok else None
        dim = self.read_dim(len(shape))
        return None if dim is None else int(shape[dim])


_SPATIAL_LETTERS = frozenset("DHWL")
#: a channel dimension this small, last, with a larger one at C: images stored channels-last
_FEW_CHANNELS = 4


def ambiguity(spec: Infer, shape: Sequence[int], name: str) -> str | None:
    """Why the size ``spec`` reads from an input of ``shape`` may not be the one meant, with
    the fix; None when the reading is plain. Two readings are flagged:

    * an unbatched input (a layout without ``N`` when one with it is accepted): a forgotten
      batch dimension, or a batch without its channel dimension, reads as one sample;
    * a channel count that looks like a spatial size: ``C`` equal to a spatial dimension
      before the last, and the last at most 4 (images stored channels-last, ``(N, H, W, C)``).

    >>> conv = Infer(layouts=("(C, H, W)", "(N, C, H, W)"))
    >>> print(ambiguity(conv, (8, 28, 28), "in_channels"))  # doctest: +NORMALIZE_WHITESPACE
    reads its input (8, 28, 28) as one unbatched (C, H, W) sample (as torch does), so
    in_channels=8 comes from dimension 0. If dimension 0 is a batch, its channel dimension
    is missing: give (8, 1, 28, 28) for one channel; if the batch is missing, add it:
    (1, 8, 28, 28)
    >>> print(ambiguity(conv, (1, 224, 224, 3), "in_channels"))  # doctest: +NORMALIZE_WHITESPACE
    reads in_channels=224 from dimension 1 of (1, 224, 224, 3), which looks like images
    stored channels-last (N, H, W, C); it takes (N, C, H, W): give (1, 3, 224, 224)
    (x.permute(0, 3, 1, 2))
    >>> ambiguity(conv, (1, 3, 224, 224), "in_channels") is None
    True
    """
    if not spec.layouts or spec.trailing is not None:
        return None
    if not all(isinstance(d, int) for d in shape):
        return None  # symbolic sizes (torch.compile, dynamic=True): reading one would fix it
    shape = tuple(shape)
    rank = len(shape)
    layouts = [spec._letters(layout) for layout in spec.layouts]
    read = next((letters for letters in layouts if len(letters) == rank), None)
    if read is None or spec.letter not in read:
        return None
    at = read.index(spec.letter)
    batched = next((ls for ls in layouts if ls[0] == "N" and ls[1:] == read), None)
    if "N" not in read and batched is not None:
        layout = "(" + ", ".join(read) + ")"
        lacking = list(shape)
        lacking.insert(batched.index(spec.letter), 1)
        letter = "channel" if spec.letter == "C" else spec.letter
        return (
            f"reads its input {shape_str(shape)} as one unbatched {layout} sample (as torch "
            f"does), so {name}={shape[at]} comes from dimension {at}. If dimension 0 is a "
            f"batch, its {letter} dimension is missing: give {shape_str(lacking)} for one "
            f"{letter}; if the batch is missing, add it: {shape_str((1, *shape))}"
        )
    spatial = [i for i, letter in enumerate(read) if letter in _SPATIAL_LETTERS]
    if (
        spec.letter == "C"
        and len(spatial) >= 2
        and spatial[0] == at + 1
        and shape[-1] <= _FEW_CHANNELS < shape[at]
        and shape[at] in [shape[i] for i in spatial[:-1]]
    ):
        last = [*read[:at], *(read[i] for i in spatial), "C"]
        order = [*range(at), rank - 1, *range(at, rank - 1)]
        fixed = [shape[i] for i in order]
        return (
            f"reads {name}={shape[at]} from dimension {at} of {shape_str(shape)}, which looks "
            f"like images stored channels-last ({', '.join(last)}); it takes "
            f"({', '.join(read)}): give {shape_str(fixed)} "
            f"(x.permute({', '.join(str(i) for i in order)}))"
        )
    return None


def unknown_parts(a: Any, b: Any) -> Any:
    """``UNKNOWN``, or for two tuples of one length, ``a`` with ``?`` where they differ."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(UNKNOWN if x != y else x for x, y in zip(a, b, strict=True))
    return UNKNOWN
