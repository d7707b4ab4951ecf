"""One row per lazy layer: every registry-driven test runs over ROWS.

Adding a layer to lazynn is adding a row here: the lazy class, its eager class, the
constructor argument it infers, a hypothesis strategy of the other constructor arguments,
and how to make a valid input for given arguments and inferred size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import torch
from torch import nn

import lazynn

Options = dict[str, Any]


@dataclass(frozen=True)
class Row:
    lazy: type[nn.Module]
    eager: type[nn.Module]
    inferred: str
    #: constructor arguments other than the inferred one
    options: st.SearchStrategy[Options]
    #: (options, inferred size, batched) -> a valid input shape
    shape: Callable[[Options, int, bool], tuple[int, ...]]
    #: options -> valid values of the inferred size
    sizes: Callable[[Options], st.SearchStrategy[int]]
    #: plain options for the non-hypothesis tests
    simple: Options
    simple_size: int = 4
    #: ranks the layer refuses, for layers whose valid ranks are not "the example's only"
    wrong_ranks: tuple[int, ...] = ()
    #: module -> its inferred size, for an eager class that stores no attribute of that
    #: name (nn.TransformerEncoderLayer keeps no ``d_model``). Default: the attribute.
    size_of: Callable[[nn.Module], Any] | None = None
    #: options -> the number every valid size is a multiple of (``groups``, ``num_groups``,
    #: ``nhead``), for tests that pick a size of their own
    step: Callable[[Options], int] = lambda o: int(o.get("groups", 1))

    @property
    def id(self) -> str:
        return self.lazy.__name__

    def size(self, module: nn.Module) -> Any:
        """The module's inferred size: an int once built, ``lazynn.UNKNOWN`` before."""
        if self.size_of is not None:
            return self.size_of(module)
        return getattr(module, self.inferred)

    def input(self, options: Options, size: int, batched: bool = True) -> torch.Tensor:
        return torch.randn(self.shape(options, size, batched))

    def example(self) -> torch.Tensor:
        return self.input(self.simple, self.simple_size)


def _linear_options() -> st.SearchStrategy[Options]:
    return st.fixed_dictionaries({"out_features": st.integers(1, 6), "bias": st.booleans()})


def _linear_shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
    return (2, 3, c) if batched else (c,)


@st.composite
def _conv_options(draw: st.DrawFn, transpose: bool) -> Options:
    groups = draw(st.sampled_from([1, 2]))
    stride = draw(st.integers(1, 2))
    dilation = draw(st.integers(1, 2))
    options: Options = {
        "out_channels": groups * draw(st.integers(1, 3)),
        "kernel_size": draw(st.integers(1, 3)),
        "stride": stride,
        "dilation": dilation,
        "groups": groups,
        "bias": draw(st.booleans()),
    }
    if transpose:
        options["padding"] = draw(st.integers(0, 1))
        options["output_padding"] = draw(st.integers(0, max(stride, dilation) - 1))
    else:
        mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
        options["padding_mode"] = mode
        options["padding"] = (
            draw(st.sampled_from([0, 1, "same"])) if stride == 1 else draw(st.integers(0, 1))
        )
    return options


def _conv_shape(rank: int) -> Callable[[Options, int, bool], tuple[int, ...]]:
    spatial = (7,) * rank if rank < 3 else (5,) * rank

    def shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
        return ((2, c) if batched else (c,)) + spatial

    return shape


def _groups_sizes(o: Options) -> st.SearchStrategy[int]:
    return st.integers(1, 3).map(lambda k: k * o.get("groups", 1))


def _any_size(o: Options) -> st.SearchStrategy[int]:
    return st.integers(1, 5)


def _norm_options(default: bool) -> st.SearchStrategy[Options]:
    return st.fixed_dictionaries(
        {
            "eps": st.sampled_from([1e-5, 1e-3]),
            "momentum": st.sampled_from([0.1, 0.5, None]),
            "affine": st.booleans(),
            "track_running_stats": st.booleans(),
        }
    )


def _norm_shape(
    batched_rank: int, unbatched: bool
) -> Callable[[Options, int, bool], tuple[int, ...]]:
    def shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
        spatial = (4,) * (batched_rank - 2)
        if batched or not unbatched:
            return (3, c, *spatial)
        return (c, *spatial)

    return shape


ROWS: list[Row] = [
    Row(lazynn.LazyLinear, nn.Linear, "in_features", _linear_options(), _linear_shape,
        _any_size, {"out_features": 3}),
]
for _rank, (_lazy, _eager, _lazy_t, _eager_t) in enumerate(
    [
        (lazynn.LazyConv1d, nn.Conv1d, lazynn.LazyConvTranspose1d, nn.ConvTranspose1d),
        (lazynn.LazyConv2d, nn.Conv2d, lazynn.LazyConvTranspose2d, nn.ConvTranspose2d),
        (lazynn.LazyConv3d, nn.Conv3d, lazynn.LazyConvTranspose3d, nn.ConvTranspose3d),
    ],
    start=1,
):
    ROWS.append(Row(_lazy, _eager, "in_channels", _conv_options(False), _conv_shape(_rank),
                    _groups_sizes, {"out_channels": 4, "kernel_size": 3}))
    ROWS.append(Row(_lazy_t, _eager_t, "in_channels", _conv_options(True), _conv_shape(_rank),
                    _groups_sizes, {"out_channels": 4, "kernel_size": 3}))
for _lazy, _eager, _brank, _unbatched, _affine in [
    (lazynn.LazyBatchNorm1d, nn.BatchNorm1d, 3, False, True),
    (lazynn.LazyBatchNorm2d, nn.BatchNorm2d, 4, False, True),
    (lazynn.LazyBatchNorm3d, nn.BatchNorm3d, 5, False, True),
    (lazynn.LazyInstanceNorm1d, nn.InstanceNorm1d, 3, True, False),
    (lazynn.LazyInstanceNorm2d, nn.InstanceNorm2d, 4, True, False),
    (lazynn.LazyInstanceNorm3d, nn.InstanceNorm3d, 5, True, False),
]:
    ROWS.append(Row(_lazy, _eager, "num_features", _norm_options(_affine),
                    _norm_shape(_brank, _unbatched), _any_size,
                    {"affine": True, "track_running_stats": True}))


def _channels_shape(rank: int) -> Callable[[Options, int, bool], tuple[int, ...]]:
    def shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
        return (3, c) + (4,) * (rank - 2)

    return shape


def _cell_shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
    return (3, c) if batched else (c,)


def _sequence_shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
    return (3, 2, c) if batched else (2, c)


def _multiples(o: Options, step: int) -> st.SearchStrategy[int]:
    return st.integers(1, 3).map(lambda k: k * step)


def _transformer_size(m: nn.Module) -> Any:
    # nn.TransformerEncoderLayer keeps no d_model attribute: read it where it lands
    return m.linear1.in_features


ROWS += [
    # simple: num_groups=1, so that any size is valid for the tests that pick their own
    # sizes (test_copies builds with 2 and 5); the hypothesis options draw 1, 2 and 3.
    Row(lazynn.LazyGroupNorm, nn.GroupNorm, "num_channels",
        st.fixed_dictionaries({"num_groups": st.sampled_from([1, 2, 3]),
                               "eps": st.sampled_from([1e-5, 1e-3]),
                               "affine": st.booleans()}),
        _channels_shape(3), lambda o: _multiples(o, o["num_groups"]),
        {"num_groups": 1}, wrong_ranks=(1,), step=lambda o: int(o["num_groups"])),
    Row(lazynn.LazyPReLU, nn.PReLU, "num_parameters",
        st.fixed_dictionaries({"init": st.sampled_from([0.25, 0.1])}),
        _channels_shape(3), _any_size, {}, wrong_ranks=(1,)),
    Row(lazynn.LazySyncBatchNorm, nn.SyncBatchNorm, "num_features", _norm_options(True),
        _channels_shape(3), _any_size, {"affine": True, "track_running_stats": True},
        wrong_ranks=(1,)),
    Row(lazynn.LazyRNNCell, nn.RNNCell, "input_size",
        st.fixed_dictionaries({"hidden_size": st.integers(1, 5), "bias": st.booleans(),
                               "nonlinearity": st.sampled_from(["tanh", "relu"])}),
        _cell_shape, _any_size, {"hidden_size": 3}, wrong_ranks=(0, 3)),
    Row(lazynn.LazyGRUCell, nn.GRUCell, "input_size",
        st.fixed_dictionaries({"hidden_size": st.integers(1, 5), "bias": st.booleans()}),
        _cell_shape, _any_size, {"hidden_size": 3}, wrong_ranks=(0, 3)),
    Row(lazynn.LazyLayerNorm, nn.LayerNorm, "normalized_shape",
        st.fixed_dictionaries({"eps": st.sampled_from([1e-5, 1e-3]),
                               "elementwise_affine": st.booleans(), "bias": st.booleans()}),
        _cell_shape, _any_size, {}, wrong_ranks=(0,),
        size_of=lambda m: m.normalized_shape[0]),
    Row(lazynn.LazyRMSNorm, nn.RMSNorm, "normalized_shape",
        st.fixed_dictionaries({"eps": st.sampled_from([None, 1e-3]),
                               "elementwise_affine": st.booleans()}),
        _cell_shape, _any_size, {}, wrong_ranks=(0,),
        size_of=lambda m: m.normalized_shape[0]),
    # simple: nhead=1 (any d_model is valid) and dropout=0.0, so that outputs do not depend
    # on the RNG state at call time (the generic tests compare outputs of separately called
    # twins); the hypothesis options draw dropout 0.1 too, where both draw the same numbers.
    Row(lazynn.LazyTransformerEncoderLayer, nn.TransformerEncoderLayer, "d_model",
        st.fixed_dictionaries({"nhead": st.sampled_from([1, 2]),
                               "dim_feedforward": st.integers(2, 8),
                               "dropout": st.sampled_from([0.0, 0.1]),
                               "activation": st.sampled_from(["relu", "gelu"]),
                               "batch_first": st.booleans(), "norm_first": st.booleans()}),
        _sequence_shape, lambda o: _multiples(o, o["nhead"]),
        {"nhead": 1, "dim_feedforward": 8, "dropout": 0.0}, wrong_ranks=(1, 4),
        size_of=_transformer_size, step=lambda o: int(o["nhead"])),
]

#: rows whose layers accept an unbatched input
UNBATCHED = {
    r.lazy
    for r in ROWS
    if r.lazy.__name__.startswith(("LazyConv", "LazyInstance", "LazyRNNCell", "LazyGRUCell",
                                   "LazyTransformer", "LazyLayerNorm", "LazyRMSNorm"))
}


def build_pair(row: Row, options: Options, size: int, seed: int = 0,
               batched: bool = True) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(lazy after its first call, eager twin, input): both initialized under ``seed``."""
    x = row.input(options, size, batched)
    torch.manual_seed(seed)
    lazy = row.lazy(**options)
    lazy(x)
    torch.manual_seed(seed)
    eager = row.eager(**{row.inferred: size}, **options)
    eager(x)
    return lazy, eager, x
