"""A tensor computed in bands of rows: what ``__init__`` computes (a rope cache, LLaMA's
``freqs_cis = torch.polar(torch.ones_like(f), f)`` of ``f = torch.outer(torch.arange(n),
freqs)``) made a few rows at a time, so that a replay holds the tensor and one band of its
intermediates, where the whole computation holds every intermediate of the tensor's size.

A band of rows can be computed alone when every step that makes the tensor and its large
intermediates is *row-wise*: each row of its output comes from the same row of each input (or
from an input broadcast along the rows), and each element from the inputs' elements at its
index by the same instructions wherever it lies in the kernel's loop. That holds for
correctly rounded arithmetic on real numbers (``mul``, ``div``, ``add``/``sub`` without an
``alpha``, ``neg``), casts and copies, ``polar`` (its CPU kernel is scalar code, one element
at a time), constants (``ones``, ``ones_like``, ``full``...), ``cat`` along another dimension,
and ``arange`` of whole numbers exactly representable in its dtype: computed in bands, the
values are the whole computation's, bit for bit, but for a NaN's payload: torch's vector and
scalar code give a NaN different bits (eager's own NaN bits change with the thread count), so
a NaN may come out with other bits, never a number. Not for transcendental functions (``cos``,
``exp``, ``pow``), whose vectorized and scalar code may round differently (a band's edge moves
elements between them), nor for steps that mix rows (``matmul``, ``cumsum``): their outputs are
computed whole, and a tensor made by one is computed whole too.

>>> import torch
>>> from lazynn._program.record import Recorder
>>> from lazynn._program.replay import Replay
>>> with torch.device("meta"), Recorder() as recorder:
...     f = torch.outer(torch.arange(4096), torch.rand(32))
...     cache = torch.polar(torch.ones_like(f), f)
>>> band = plan(recorder.tape, {recorder.view_of(cache).storage}, budget=64 << 10)
>>> [(b.rows, b.per, len(b.makes)) for b in band.values()]
[(4096, 63, 4)]
>>> _ = torch.manual_seed(0)
>>> f = torch.outer(torch.arange(4096), torch.rand(32))
>>> _ = torch.manual_seed(0)
>>> value = Replay(recorder.tape, "cpu").run({recorder.view_of(cache): None})
>>> torch.equal(next(iter(value.values())), torch.polar(torch.ones_like(f), f))
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .draws import CHUNK
from .tape import Const, Like, Step, Tape, View, is_contiguous, resolve, views_in

__all__ = ["BUDGET", "Band", "plan", "run_band"]

#: the bytes a band's intermediates may hold: one chunk of float32 numbers
BUDGET = 4 * CHUNK

_ARITHMETIC = frozenset(
    {"aten::mul.Tensor", "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar"}
    | {"aten::add.Tensor", "aten::sub.Tensor", "aten::neg.default"}
)
#: steps computed element by element, the same instructions for every element (module doc)
_POINTWISE = _ARITHMETIC | {"aten::polar.default", "aten::_to_copy.default", "aten::clone.default"}
#: steps that make a tensor of a size (its first argument), one value throughout
_SIZED = frozenset({"aten::ones.default", "aten::zeros.default", "aten::full.default"})
_LIKE = frozenset(
    {"aten::ones_like.default", "aten::zeros_like.default", "aten::full_like.default"}
)
_ARANGE = frozenset({"aten::arange.default", "aten::arange.start", "aten::arange.start_step"})
_CAT = "aten::cat.default"


@dataclass(frozen=True)
class Band:
    """The storage ``target`` (made at step ``at``) computed ``per`` rows at a time out of its
    ``rows``, by the steps ``makes`` (in program order, ``at`` last), which make it and the
    intermediates only it reads; ``reads``: the storages those steps read whole."""

    target: int
    at: int
    makes: tuple[int, ...]
    rows: int
    per: int
    reads: frozenset[int]


def _made(step: Step, storage: int) -> View | None:
    """The view of ``storage`` that ``step`` makes, if it makes one tensor, laid out rows
    first without gaps, of two rows or more."""
    if step.random or step.creates != (storage,) or len(step.outputs) != 1:
        return None
    out = step.outputs[0]
    if out is None or out.storage != storage or out.offset or not is_contiguous(out):
        return None
    return out if out.size and out.size[0] > 1 else None


def _aligned(value: View | Const | Like, out: View) -> bool:
    """Whether an input of a step making ``out`` has ``out``'s rows (else it is broadcast
    along them)."""
    size = value.size if isinstance(value, (View, Like)) else None
    if size is None:
        return False
    return len(size) == len(out.size) and size[0] != 1


def _exact_arange(step: Step, out: View) -> bool:
    values = [v for v in step.args if not isinstance(v, torch.device)]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return False
    start, _, stride = _arange(step)
    if out.dtype.is_complex or out.dtype == torch.bool:
        return False
    if not out.dtype.is_floating_point:
        return True
    largest = max(abs(start), abs(start + (out.size[0] - 1) * stride))
    return bool(largest * torch.finfo(out.dtype).eps <= 2)  # (every whole number up to it)


def _arange(step: Step) -> tuple[int, int, int]:
    """(start, end, step) of an ``arange`` step."""
    args = list(step.args)
    if step.op == "aten::arange.default":
        return 0, args[0], 1
    return args[0], args[1], args[2] if len(args) > 2 else step.kwargs.get("step", 1)


def _rowwise(step: Step, out: View) -> bool:
    """Whether ``step`` (making ``out``) makes each band of rows from the same band of its
    inputs, exactly (see the module doc)."""
    op = step.op
    if op in _ARANGE:
        return len(out.size) == 1 and _exact_arange(step, out)
    if op in _SIZED:
        return list(step.args[0]) == list(out.size)
    if op in _LIKE:
        like = step.args[0]
        return isinstance(like, Like) and like.size == out.size and like.stride == out.stride
    if op == _CAT:
        dim = step.args[1] if len(step.args) > 1 else step.kwargs.get("dim", 0)
        parts = views_in(step.args[0])
        return dim % len(out.size) != 0 and all(_aligned(v, out) for v in parts)
    if op not in _POINTWISE:
        return False
    if op in _ARITHMETIC:  # (complex products are fused on vectors; alpha is a fused multiply)
        dtypes = [out.dtype, *(v.dtype for v in views_in([*step.args, *step.kwargs.values()]))]
        if any(d.is_complex for d in dtypes) or step.kwargs.get("alpha", 1) != 1:
            return False
    for value in (*step.args, *step.kwargs.values()):
        if isinstance(value, (Const, list, tuple)):
            return False
        if isinstance(value, View) and len(value.size) > len(out.size):
            return False
    return True


def _rows_of(view: View, out: View) -> bool:
    """Whether ``view``'s row ``r`` lies in row ``r`` of ``out``'s storage (its rows are
    that storage's rows)."""
    row = out.numel // out.size[0]
    if view.dtype != out.dtype or view.size[0] != out.size[0] or view.stride[0] != row:
        return False
    inner = view.offset + sum(
        (n - 1) * s for n, s in zip(view.size[1:], view.stride[1:], strict=True)
    )
    return view.offset >= 0 and min(view.stride) >= 0 and inner < row


def plan(
    tape: Tape,
    targets: Iterable[int],
    steps: Iterable[int] | None = None,
    keep: Iterable[int] = (),
    start: int = 0,
    budget: int | None = None,
) -> dict[int, Band]:
    """The storages of ``targets`` worth computing in bands (an intermediate of their size
    or more), as :class:`Band` by the step that makes each. ``steps``: the steps a replay
    runs (default: all); ``keep``: storages it must hold whole (wanted, given); ``start``:
    the first step it has yet to run; ``budget``: the bytes a band's intermediates hold
    (default :data:`BUDGET`)."""
    budget = budget or BUDGET
    targets = list(targets)
    if not targets:
        return {}
    indices = sorted(range(len(tape.steps)) if steps is None else steps)
    makers: dict[int, int] = {}
    readers: dict[int, set[int]] = {}
    for index in indices:
        step = tape.steps[index]
        for storage in step.creates:
            makers[storage] = index
        for storage in step.reads:
            readers.setdefault(storage, set()).add(index)
    writers: dict[int, list[int]] = {}
    for index, step in enumerate(tape.steps):
        for storage in step.writes:
            writers.setdefault(storage, []).append(index)
    found = {}
    for target in targets:
        at = makers.get(target, -1)
        out = _made(tape.steps[at], target) if at >= start else None
        if out is None or not _rowwise(tape.steps[at], out):
            continue
        shapes = _grow(tape, target, out, makers, set(keep) - {target}, start)
        _prune(tape, target, shapes, makers, readers, writers)
        makes = sorted(makers[s] for s in shapes)
        reads = {v.storage for i in makes for v in _views(tape.steps[i])} - set(shapes)
        if len(shapes) < 2 or any(makes[0] < w < at for r in reads for w in writers.get(r, ())):
            continue
        width = sum(o.numel // o.size[0] * o.dtype.itemsize for o in shapes.values())
        per = max(1, budget // (2 * width))  # (twice: a kernel's own casts of a band)
        found[at] = Band(target, at, tuple(makes), out.size[0], per, frozenset(reads))
    return found


def _views(step: Step) -> list[View]:
    return views_in([*step.args, *step.kwargs.values()])


def _grow(
    tape: Tape, target: int, out: View, makers: dict[int, int], keep: set[int], start: int
) -> dict[int, View]:
    """``target`` and the storages its steps read row by row that row-wise steps make: each
    with the view its step makes."""
    shapes = {target: out}
    todo = [target]
    while todo:
        made = shapes[todo.pop()]
        for view in _views(tape.steps[makers[made.storage]]):
            at = makers.get(view.storage, -1)
            if view.storage in shapes or view.storage in keep or at < start:
                continue
            theirs = _made(tape.steps[at], view.storage)
            if (
                _aligned(view, made)
                and theirs is not None
                and theirs.size[0] == out.size[0]
                and _rows_of(view, theirs)
                and _rowwise(tape.steps[at], theirs)
            ):
                shapes[view.storage] = theirs
                todo.append(view.storage)
    return shapes


def _prune(
    tape: Tape,
    target: int,
    shapes: dict[int, View],
    makers: dict[int, int],
    readers: dict[int, set[int]],
    writers: dict[int, list[int]],
) -> None:
    """Drop from ``shapes`` (in place) what must exist whole: an intermediate written after
    it is made, or read by another step or not row by row (until none is)."""
    while True:
        inside = {makers[s] for s in shapes}
        gone = [
            storage
            for storage, made in shapes.items()
            if storage != target
            and (
                writers.get(storage)
                or not readers.get(storage, set()) <= inside
                or not all(
                    _rows_of(v, made) and _aligned(v, shapes[s])
                    for r in readers[storage]
                    for s in tape.steps[r].creates
                    for v in _views(tape.steps[r])
                    if v.storage == storage
                )
            )
        ]
        if not gone:
            return
        for storage in gone:
            del shapes[storage]


def run_band(
    band: Band, tape: Tape, value: Callable[[Any], Any], device: torch.device
) -> torch.Tensor:
    """``band``'s target computed ``band.per`` rows at a time; ``value`` turns a step's
    argument into what the replay holds (a storage read whole: its tensor)."""
    made = tape.steps[band.at].outputs[0]
    assert made is not None
    result = torch.empty(made.size, dtype=made.dtype, device=device)
    for lo in range(0, band.rows, band.per):
        hi = min(band.rows, lo + band.per)
        rows: dict[int, torch.Tensor] = {}  # storage -> its rows lo:hi
        for index in band.makes:
            step = tape.steps[index]
            out = step.outputs[0]
            assert out is not None
            rows[out.storage] = _run_rows(step, out, lo, hi, rows, value, device)
        with torch.no_grad():
            result[lo:hi].copy_(rows[band.target])
    return result


def _run_rows(
    step: Step,
    out: View,
    lo: int,
    hi: int,
    rows: dict[int, torch.Tensor],
    value: Callable[[Any], Any],
    device: torch.device,
) -> torch.Tensor:
    """Rows ``lo:hi`` of what ``step`` makes, from rows ``lo:hi`` of its inputs (``rows``,
    or the replay's whole ones) and its broadcast inputs whole."""
    where = (out, lo, hi, rows, value)
    args = _band_arg(step.args, *where)
    kwargs = {k: _band_arg(v, *where) for k, v in step.kwargs.items()}
    op = step.op
    if op in _ARANGE:
        start, _, stride = _arange(step)
        op, args = "aten::arange.start_step", (start + lo * stride, start + hi * stride, stride)
    elif op in _SIZED:
        args = ([hi - lo, *out.size[1:]], *args[1:])
    if op in _LIKE and kwargs.get("device") is None:
        kwargs["device"] = device
    with torch.no_grad():
        result = resolve(op)(*args, **kwargs)
    assert tuple(result.shape) == (hi - lo, *out.size[1:])
    made: torch.Tensor = result.contiguous()  # (laid out as its storage's rows)
    return made


def _band_arg(
    v: Any,
    out: View,
    lo: int,
    hi: int,
    rows: dict[int, torch.Tensor],
    value: Callable[[Any], Any],
) -> Any:
    """A step's argument for rows ``lo:hi`` of its output ``out`` (a function of the module,
    not a closure: a closure calling itself is a cycle, which would keep each band's
    tensors until the garbage collector runs)."""
    if isinstance(v, (list, tuple)):
        return type(v)(_band_arg(x, out, lo, hi, rows, value) for x in v)
    if isinstance(v, Like):
        size = (hi - lo, *v.size[1:])
        return value(Like(size, torch.empty(size, device="meta").stride(), v.dtype))
    if not isinstance(v, View) or not _aligned(v, out):
        return value(v)
    band = dataclasses.replace(v, size=(hi - lo, *v.size[1:]))
    if v.storage in rows:  # (its band's rows, laid out as the view's storage)
        return torch.as_strided(rows[v.storage], band.size, band.stride, band.offset)
    return value(dataclasses.replace(band, offset=v.offset + lo * v.stride[0]))
