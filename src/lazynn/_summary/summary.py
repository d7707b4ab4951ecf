"""summary(): a model's layers, shapes, parameter counts and FLOPs, computed on meta.

Data first, rendering second: :func:`summary` returns a frozen :class:`Summary`, the data of
``report.py`` with the renderings of ``render.py`` (a table, markdown or JSON). Nothing is
allocated, and the model is as it was after (the meta rehearsal runs the model itself and puts
back what it changed).

A symbolic batch (``Spec(("B", 3, 224, 224))``, Keras's ``(None, 3, 224, 224)``, or
``--input Bx3x224x224``) is found as Keras finds its ``None``: the model runs with batches of
2, 3 and 4; a dimension that follows the batch reads ``B`` (``2B`` if twice it), and FLOPs are
per sample (``2 f(2) - f(3)``: exact for costs linear in the batch, as every layer's forward
is).
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._build.arguments import check_model
from .._build.factory import is_factory, on_meta
from .._errors import Fix, InferenceError, LazynnError, first_line, message, with_note
from .._module.lifecycle import is_lazy_module
from .._rehearsal.batch import TRIES, batch_name, check_batch_free, keras_batch, substituted
from .._rehearsal.collector import paused
from .._rehearsal.habits import called, check_keywords
from .._rehearsal.learnt import Call, Rehearsal
from .._rehearsal.rehearse import apart, rehearse
from .memory import Memory, optimizer_class, training_memory
from .render import Width, render
from .report import Dim, Report, Shape, SummaryRow

__all__ = ["Summary", "summary"]

_MODES = ("train", "eval")
#: the batch sizes a symbolic batch is tried with (not 1: BatchNorm refuses it in training);
#: the figures per sample come from the first two, the third checks they are linear


@dataclasses.dataclass(frozen=True)
class Summary(Report):
    """The layers of a model as the build makes them: its rows, totals and the estimate of
    a training step's memory, as data; ``str()`` and ``repr()`` (a REPL, a notebook) render
    the default table, :meth:`render` the others, and ``to_dict()`` is JSON-ready, one key
    per field, named as the field (docs/summary.md).

    Totals count each tensor once (shared weights once), and equal
    ``sum(p.numel() for p in model.parameters())`` of the built model. ``total_flops`` is what
    ``torch.utils.flop_counter.FlopCounterMode`` counts for one forward of the examples.

    Attributes:
        model_type: the model's class name (its lazy class, if it was lazy).
        rows: one :class:`SummaryRow` per module, the model first, in
            ``model.named_modules()`` order.
        total_parameters: how many values the model's parameters hold (elements), each
            tensor once; lazy layers the examples never reached are left out.
        trainable_parameters: of those, the values of parameters with ``requires_grad``
            (elements). ``non_trainable_parameters`` is the difference.
        parameter_bytes: the bytes of the parameters, each tensor once.
        buffer_bytes: the bytes of the buffers, each tensor once.
        inputs: the ``shape`` and ``dtype`` of each tensor the model took (named tuples);
            with a symbolic batch, a dimension may be its name (``"B"``, ``"2B"``).
        outputs: the ``shape`` and ``dtype`` of each tensor the model returned.
        unreached: the paths of the lazy layers the examples never reached: their sizes,
            and so their parameters, are unknown.
        total_flops: the FLOPs of one forward of the examples (a multiply-add is 2); per
            sample with a symbolic batch.
        mode: ``"train"`` or ``"eval"``: the mode the examples ran in.
        batch: the symbolic batch dimension's name (``"B"``), if the examples had one:
            shapes show it, FLOPs and activations are per sample; None otherwise.
        memory: the estimate of a training step's memory, in bytes (``params``,
            ``gradients``, ``optimizer_states``, ``activations``, ``total``, and the
            ``optimizer``'s name), when asked for (``training=True``); None otherwise.
        call_order: the paths of the modules the examples called, in the order of their
            first calls (the model first): the picture's path follows it.

    >>> import lazynn
    >>> from torch import nn
    >>> report = lazynn.summary(nn.Sequential(lazynn.LazyLinear(8)), (4, 16))
    >>> report.total_parameters, report.parameter_bytes, report.to_dict()["total_parameters"]
    (136, 544, 136)
    >>> report.inputs, report.unreached, report.mode, report.memory
    ((Shape(shape=(4, 16), dtype=torch.float32),), (), 'train', None)
    >>> print(report.render(format="markdown").splitlines()[2])
    | Sequential | [4, 16] | [4, 8] | -- | 1.0K |
    """

    def render(
        self,
        format: str = "table",
        depth: int | None = None,
        expand: bool = False,
        width: Width = "auto",
        columns: Sequence[str] | None = None,
    ) -> str:
        """The summary as ``format``: ``"table"`` (text), ``"markdown"``, ``"json"``, or
        ``"dot"``: a picture's source, the rows as boxes of a Graphviz graph (a row with rows
        under it is a frame around them) joined in the model's order by edges labelled with
        the shapes (``dot -Tsvg`` draws it; ``graphviz.Source(text)`` in a notebook).

        Args:
            depth: the deepest module level shown (0: the model alone); default: the
                deepest whose table fits in ``SCREEN_ROWS`` rows (40).
            expand: list every block, instead of one row for identical consecutive blocks.
            width: the table's widest line, as far as shortening shapes, then names, can
                bring it (a note under the table says what was cut); None: no limit.
                Default ``"auto"``: the terminal's width when stdout is a terminal (at
                least 80), 100 otherwise (a file, a pipe, a doctest).
            columns: which of ``input``, ``output``, ``params``, ``param_shapes``,
                ``param_bytes``, ``buffer_bytes``, ``flops``, ``calls`` to show, in order.
                Default: ``input``, ``output``, ``params``, ``flops``. In the DOT graph,
                the figures in each box (the shapes are on the edges).

        >>> import lazynn
        >>> from torch import nn
        >>> graph = lazynn.summary(nn.Sequential(lazynn.LazyLinear(8)), (4, 16)).render("dot")
        >>> print(*[line for line in graph.splitlines() if '" -> "' in line], sep="\\n")
          "input" -> "n1" [label="[4, 16]"];
          "n1" -> "output" [label="[4, 8]"];
        """
        return render(self, format, depth, expand, width, columns)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        """The table, as ``str()``: what a REPL shows (``print`` and the fields for the rest)."""
        return self.render()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's display: the table."""
        printer.text(self.render())

    def _repr_html_(self) -> str:
        """A notebook's display: the table, in a ``<pre>`` block (monospace, as printed)."""
        return f"<pre>{html.escape(self.render())}</pre>"


@paused()  # (the cycle collector: see _rehearsal/collector.py)
def summary(
    model: nn.Module | Callable[[], nn.Module],
    *example_inputs: Any,
    mode: str = "train",
    training: bool = False,
    optimizer: str | type[torch.optim.Optimizer] = "adamw",
    **example_kwargs: Any,
) -> Summary:
    """Summarize ``model`` for example inputs, built or not, allocating nothing.

    Args:
        model: any ``nn.Module``; lazy layers are reported with the sizes the examples give.
            Or its factory (``Net``, ``functools.partial(Net, config)``, a lambda), as for
            :func:`lazynn.build`: it is constructed on meta only (its ``__init__`` code runs
            there, drawing nothing).
        *example_inputs, **example_kwargs: as for :func:`lazynn.build`: tensors, shapes,
            :class:`lazynn.Spec` (whose first dimension may be a name: a symbolic batch, as
            Keras's ``None`` is: ``(None, 16)``). torchinfo's keywords (``input_size=``,
            ``depth=``...) the forward does not take are refused, naming lazynn's way.
        mode: ``"train"`` (the default, as a first call in training) or ``"eval"``: the
            mode every module runs the examples in (the model's own modes are kept).
        training: add an estimate of a training step's memory (``Summary.memory``):
            parameters, gradients, ``optimizer``'s state and the activations autograd saves,
            counted on meta (docs/summary.md, Training memory).
        optimizer: a ``torch.optim`` class or its name (``"adamw"``, ``"sgd"``...), for
            ``training``.

    Returns a :class:`~lazynn.Summary`: ``str()`` is the table, ``.render(...)`` chooses the
    depth, format and columns, ``.to_dict()`` is JSON-ready. FLOPs are counted with
    ``torch.utils.flop_counter.FlopCounterMode`` on meta: the same as it counts for the built
    model on real tensors.

    >>> import torch, lazynn
    >>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
    >>> s = lazynn.summary(net, (4, 16))
    >>> s.total_parameters, s.rows[1].type, s.rows[1].outputs[0].shape, s.total_flops
    (154, 'Linear', (4, 8), 1152)
    >>> lazynn.summary(net, lazynn.Spec(("B", 16))).rows[-1].outputs[0].shape
    ('B', 2)
    >>> lazynn.is_lazy(net)
    True
    """
    check_model(model, "lazynn.summary")
    if mode not in _MODES:
        raise LazynnError(
            message("lazynn.summary", "mode='train' or mode='eval'", repr(mode), "pass one of them")
        )
    if training:  # an unknown or refused optimizer, before anything runs
        optimizer_class(optimizer)
    example_inputs = tuple(keras_batch(a) for a in example_inputs)  # (each: not the tuple)
    example_kwargs = keras_batch(example_kwargs)
    check_keywords(*called(model), example_kwargs)  # (torchinfo's, before anything)
    lazy_types = None  # (a factory's model is built on meta: its lazy classes, by path,
    notes: dict[str, str] = {}  # and what its lazy layers read that may not be meant)
    batch = batch_name(example_inputs, example_kwargs, "lazynn.summary")
    if is_factory(model):
        sized = {k: substituted(v, TRIES[0]) for k, v in example_kwargs.items()}
        try:
            model, lazy_types, notes = on_meta(
                model,
                tuple(substituted(v, TRIES[0]) for v in example_inputs),
                sized,
                "lazynn.summary(factory)",
            )
        except LazynnError as error:
            if batch is None:
                raise
            raise with_note(error, _batch_note(batch, TRIES[0])) from error
    assert isinstance(model, nn.Module)
    train = mode == "train"
    if batch is None:
        rehearsal = rehearse(
            model, example_inputs, example_kwargs, training=train, count_flops=True
        )
        report = _collect(model, rehearsal, mode, None, None, lazy_types, notes)
        if training:
            memory = _estimate(model, example_inputs, example_kwargs, optimizer)
            report = dataclasses.replace(report, memory=memory)
        return report
    tries = [(substituted(example_inputs, n), substituted(example_kwargs, n)) for n in TRIES]
    runs = []
    for n, (a, k) in zip(TRIES, tries, strict=True):
        try:
            runs.append(rehearse(model, a, k, training=train, count_flops=True))
        except LazynnError as error:  # (a note: its parts and fix key are kept)
            raise with_note(error, _batch_note(batch, n)) from error
    check_batch_free(runs[0], runs[1], batch)
    _check_linear(
        {p: tuple(r.calls[p].flops if p in r.calls else 0 for r in runs) for p in runs[0].calls},
        "FLOPs",
        batch,
    )
    report = _collect(model, runs[0], mode, batch, runs[1], lazy_types, notes)
    if training:  # per sample: activations are linear in the batch, the rest does not change
        # (an LSTM's oneDNN workspace without its page rounding: per sample, linear)
        estimates = [_estimate(model, a, k, optimizer, paged=False) for a, k in tries]
        _check_linear(
            {"": tuple(m.activations for m in estimates)}, "saved activations (bytes)", batch
        )
        two, three = estimates[:2]
        per_sample = max(2 * two.activations - three.activations, 0)
        memory = dataclasses.replace(two, activations=per_sample)
        report = dataclasses.replace(report, memory=memory)
    return report


def _batch_note(batch: str, n: int) -> str:
    """What a failure with a symbolic batch says of the number it ran as."""
    return (
        f"lazynn.summary ran the symbolic batch {batch!r} as {n}: give every input's batch as "
        f"{batch}, or the batch as a number"
    )


def _check_linear(figures: dict[str, tuple[int, ...]], what: str, batch: str) -> None:
    """Refuse per-sample figures of a cost that is not linear in the batch (attention across
    the batch, ``h @ h.T``): ``figures`` by module path, at each batch size tried."""
    deepest_first = sorted(figures.items(), key=lambda item: -item[0].count(".") - bool(item[0]))
    for path, (a, b, c) in deepest_first:  # (the module that computes across the batch)
        if c - b != b - a:
            tried = ", ".join(
                f"{v:,} at {batch}={n}" for v, n in zip((a, b, c), TRIES, strict=True)
            )
            raise InferenceError(
                message(
                    f"lazynn.summary at '{path}'" if path else "lazynn.summary",
                    f"{what} linear in the batch, to report them per sample of a symbolic "
                    f"batch {batch!r}",
                    f"{what} that are not ({tried}: the model computes across the batch)",
                    "give the batch as a number (Spec((8, ...)), or --input 8x...): the "
                    "figures are then exact for that batch",
                    key=Fix.NUMERIC_BATCH,
                )
            )


def _collect(
    model: nn.Module,
    rehearsal: Rehearsal,
    mode: str,
    batch: str | None,
    other: Rehearsal | None,
    lazy_types: dict[str, str] | None = None,
    notes: dict[str, str] | None = None,
) -> Summary:
    """The Summary of ``rehearsal`` (and, with a symbolic batch, of ``other``, at a second
    batch size: shapes merged, FLOPs per sample); ``lazy_types``: the lazy class of each
    module that was lazy, by path (by default, those of ``model``); ``notes``: what a lazy
    layer read that may not be meant, by path, where the model was built before the
    rehearsal (a factory's, on meta), besides the rehearsal's own."""
    notes = {**(notes or {}), **rehearsal.notes}
    if lazy_types is None:
        lazy_types = {p: type(m).__name__ for p, m in model.named_modules() if is_lazy_module(m)}
    shape: Callable[
        [list[tuple[tuple[int, ...], Any]], list[tuple[tuple[int, ...], Any]]], tuple[Shape, ...]
    ]
    shape = (
        (lambda a, b: _merge(a, b, batch))
        if batch is not None
        else (lambda a, b: tuple(Shape(dims, dtype) for dims, dtype in a))
    )

    def calls_of(path: str, r: Rehearsal | None) -> Call | None:
        return r.calls.get(path) if r is not None else None

    def flops(path: str) -> int:
        first, second = calls_of(path, rehearsal), calls_of(path, other)
        if first is None:
            return 0
        if second is None:
            return first.flops
        return max(2 * first.flops - second.flops, 0)  # per sample: f(1) = 2 f(2) - f(3)

    rows = []
    owners: dict[int, str] = {}
    total = trainable = param_bytes = buffer_bytes = 0
    for path, _ in model.named_modules():
        infos = rehearsal.tensors.get(path, [])
        call = rehearsal.calls.get(path)
        twin = calls_of(path, other)
        fresh = [i for i in infos if i.ident not in owners]
        tied = tuple((i.name, owners[i.ident]) for i in infos if i.ident in owners)
        for info in fresh:
            owners[info.ident] = f"{path}.{info.name}" if path else info.name
        params = [i for i in fresh if i.is_parameter]
        rows.append(
            SummaryRow(
                path=path,
                depth=path.count(".") + 1 if path else 0,
                type=rehearsal.types[path],
                lazy_type=lazy_types.get(path),
                inputs=shape(call.inputs, twin.inputs if twin else []) if call else (),
                outputs=shape(call.outputs, twin.outputs if twin else []) if call else (),
                parameters=tuple((i.name, i.shape) for i in infos if i.is_parameter),
                num_parameters=sum(i.numel for i in params),
                trainable_parameters=sum(i.numel for i in params if i.requires_grad),
                parameter_bytes=sum(i.nbytes for i in params),
                buffer_bytes=sum(i.nbytes for i in fresh if not i.is_parameter),
                calls=call.count if call else 0,
                flops=flops(path),
                tied=tied,
                note=notes.get(path, ""),
            )
        )
        total += sum(i.numel for i in params)
        trainable += sum(i.numel for i in params if i.requires_grad)
        param_bytes += sum(i.nbytes for i in params)
        buffer_bytes += sum(i.nbytes for i in fresh if not i.is_parameter)
    root, root_twin = rehearsal.calls.get(""), calls_of("", other)
    return Summary(
        model_type=lazy_types.get("", type(model).__name__),
        rows=tuple(rows),
        total_parameters=total,
        trainable_parameters=trainable,
        parameter_bytes=param_bytes,
        buffer_bytes=buffer_bytes,
        inputs=shape(root.inputs, root_twin.inputs if root_twin else []) if root else (),
        outputs=shape(root.outputs, root_twin.outputs if root_twin else []) if root else (),
        unreached=tuple(rehearsal.unreached),
        total_flops=flops(""),
        mode=mode,
        batch=batch,
        call_order=tuple(rehearsal.calls),
    )


# --- a symbolic batch ---------------------------------------------------------------------------


def _estimate(
    model: nn.Module,
    args: Any,
    kwargs: dict[str, Any],
    optimizer: str | type[torch.optim.Optimizer],
    paged: bool = True,
) -> Memory:
    """The training-memory estimate; a training step's refusal of the examples says so.
    (Inside a forward that a rehearsal runs, what its step runs is not that forward's.)"""
    try:
        with apart():
            return training_memory(model, args, kwargs, optimizer, paged=paged)
    except InferenceError as error:
        if "more than 1 value per channel when training" not in str(error):
            raise
        raise InferenceError(
            message(
                "lazynn.summary(training=True)",
                "examples a training step takes (the estimate runs them in training mode, "
                "whatever mode= says)",
                "a batch of one, which BatchNorm refuses in training",
                "give the estimate a batch of more than one (--input 2x..., with --training)",
                detail=first_line(error.__cause__ or error).split(" Fix: ")[0],
            )
        ) from error


def _dim(a: int, b: int, batch: str) -> Dim:
    """A dimension seen as ``a`` at the first batch size and ``b`` at the second."""
    first, second = TRIES[:2]
    if a == b:
        return a
    if a % first == 0 and b % second == 0 and a // first == b // second:
        k = a // first
        return batch if k == 1 else f"{k}{batch}"
    return "?"


def _merge(
    a: list[tuple[tuple[int, ...], Any]], b: list[tuple[tuple[int, ...], Any]], batch: str
) -> tuple[Shape, ...]:
    if len(a) != len(b):
        return tuple(Shape(tuple("?" for _ in dims), dtype) for dims, dtype in a)
    out: list[Shape] = []
    for (dims_a, dtype), (dims_b, _) in zip(a, b, strict=True):
        if len(dims_a) != len(dims_b):
            out.append(Shape(tuple("?" for _ in dims_a), dtype))
        else:
            dims = tuple(_dim(x, y, batch) for x, y in zip(dims_a, dims_b, strict=True))
            out.append(Shape(dims, dtype))
    return tuple(out)
