"""One row per lazy layer: every registry-driven test runs over ROWS.

Adding a layer to lazynn is adding a row here: the lazy class, its eager class, the
constructor argument it infers, a hypothesis strategy of the other constructor arguments,
and how to make a valid input for given arguments and inferred size. A layer with more
inputs or a tuple output says how to call it (``args``: the other inputs derived from the
row's input; ``out``: the output as one tensor); tests call every module, lazy or eager,
through ``row.call(module, x)`` and make every eager twin with ``row.new_eager``. A
rank-agnostic layer has a row per rank (``name``: "Conv-2d"), its eager class the one that
rank selects (``input_rank``: the rank of its input).

What a test checks of some layers only is a field of their rows too: other call forms with
their bad inputs (``calls``), other constructions and inputs (``variants``) and models to
build on meta and materialize (``materialize``); a test runs over the rows that have them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import lazynn

Options = dict[str, Any]
#: a call's (positional, keyword) arguments
Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _alone(module: nn.Module, x: torch.Tensor) -> tuple[Any, ...]:
    return (x,)


def _same(output: Any) -> torch.Tensor:
    return output  # type: ignore[no-any-return]


@dataclass(frozen=True, kw_only=True)
class Twin:
    """A lazy module made or called otherwise than its row's layer, and its eager twin."""

    #: the test id
    id: str
    #: () -> the lazy module
    lazy: Callable[[], nn.Module]
    #: () -> what the lazy module is after its first call on ``inputs``, made eagerly
    eager: Callable[[], nn.Module]
    #: () -> the positional inputs
    inputs: Callable[[], tuple[Any, ...]]
    #: whether the eager twin's checkpoint is also loaded into an unbuilt lazy module (the
    #: variants whose checkpoints no row covers)
    checkpoint: bool = False


@dataclass(frozen=True, kw_only=True)
class Bad:
    """A bad first input of a call form: refused by lazynn, the layer left as it was."""

    #: the test id
    id: str
    #: () -> the bad inputs
    inputs: Callable[[], Inputs]
    #: what the message says after the layer's name (a regular expression)
    pattern: str
    #: the eager twin refuses the input too (False: no eager twin can be made from it)
    eager_refuses: bool = True


@dataclass(frozen=True, kw_only=True)
class CallForm:
    """The row's layer called with inputs of its own (not derived from the row's one input)."""

    #: the test id
    id: str
    #: () -> the lazy layer
    lazy: Callable[[], nn.Module]
    #: () -> the eager twin of ``lazy`` built on ``inputs``
    eager: Callable[[], nn.Module]
    #: () -> the good inputs
    inputs: Callable[[], Inputs]
    #: the inferred sizes, read from a built module
    sizes: Callable[[nn.Module], tuple[int, ...]]
    #: () -> an eager twin with other inferred sizes
    other: Callable[[], nn.Module]
    #: () -> inputs for ``other``
    other_inputs: Callable[[], Inputs]
    #: how the call form calls the layer unlike the registry's row; empty: as the row does
    #: (the form only gives the good inputs and eager twin of its ``bad`` inputs)
    beyond: str = ""
    #: bad first inputs, each refused and leaving the layer as it was
    bad: tuple[Bad, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Row:
    lazy: type[nn.Module]
    eager: type[nn.Module]
    #: the constructor argument the tests vary ('' for a layer that infers none)
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
    #: (module, input) -> the forward's positional arguments, the input first; the others
    #: (key and value, target, second input...) derived from it deterministically.
    #: Default: the input alone
    args: Callable[[nn.Module, torch.Tensor], tuple[Any, ...]] = _alone
    #: the forward's output -> one tensor (a tuple's floating tensors joined). Default: as is
    out: Callable[[Any], torch.Tensor] = _same
    #: (options, inferred size) -> the eager constructor's inferred arguments, for a layer
    #: that infers more than one (Bilinear). Default: ``{inferred: size}`` (``{}`` for a
    #: layer that infers none: the rank-agnostic pools and ChannelDropout)
    eager_sizes: Callable[[Options, int], dict[str, Any]] | None = None
    #: the test id, for a lazy class with several rows (a rank-agnostic one: "Conv-2d").
    #: Default: the lazy class's name
    name: str | None = None
    #: whether a built checkpoint builds an unbuilt layer (a rank-agnostic norm's tensors
    #: look the same in every rank: its checkpoint cannot tell which class to become)
    checkpoint_builds: bool = True
    #: whether build() / summary() can run it on meta tensors (False: its forward's shapes
    #: depend on values, as AdaptiveLogSoftmaxWithLoss's torch.nonzero; they refuse clearly)
    rehearsable: bool = True
    #: a rank-agnostic layer's row: the rank of its (batched) input, at which the lazy class
    #: becomes ``eager`` (written out as torch names it, not read from the class); a rank no
    #: row of the class has is refused with a message listing each row's "rank (eager)"
    #: (tests/nn/test_rank_agnostic.py). None for a layer of one class
    input_rank: int | None = None
    #: other call forms of the layer, each against its eager twin, with other sizes, and its
    #: bad first inputs (tests/layer/test_lazy_layers_called_otherwise.py)
    calls: tuple[CallForm, ...] = ()
    #: other constructions and inputs of the layer (a packed sequence, a declared kdim, two
    #: normalized dimensions...), each against its eager twin after the first call
    #: (tests/nn/test_sequence_layers.py)
    variants: tuple[Twin, ...] = ()
    #: lazy modules built on meta then materialized (or built at once) against eager
    #: construction (tests/building/test_materialize.py): the layer, or a model whose first lazy
    #: layer
    #: it is (nn.TransformerEncoder of its copies, a Sequential of it and another)
    materialize: tuple[Twin, ...] = ()

    @property
    def id(self) -> str:
        return self.name or self.lazy.__name__

    @property
    def sized(self) -> bool:
        """Whether the layer infers a size (the rank-agnostic pools and ChannelDropout infer only
        their class)."""
        return bool(self.inferred)

    @property
    def agnostic(self) -> bool:
        """Whether the lazy class is rank-agnostic (its input's rank picks the eager class)."""
        return hasattr(self.lazy, "by_rank")

    def size(self, module: nn.Module) -> Any:
        """The module's inferred size: an int once built, ``lazynn.UNKNOWN`` before."""
        if self.size_of is not None:
            return self.size_of(module)
        return getattr(module, self.inferred)

    def eager_kwargs(self, options: Options, size: int) -> dict[str, Any]:
        """The eager constructor's inferred arguments for ``size``."""
        if self.eager_sizes is not None:
            return self.eager_sizes(options, size)
        return {self.inferred: size} if self.inferred else {}

    @property
    def inferred_args(self) -> tuple[str, ...]:
        """The names of every constructor argument the layer infers."""
        return tuple(self.eager_kwargs(self.simple, self.simple_size))

    def new_eager(self, options: Options, size: int, **extra: Any) -> nn.Module:
        """The eager twin: the eager class with the inferred arguments for ``size``."""
        return self.eager(**self.eager_kwargs(options, size), **options, **extra)

    def call(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Run ``module`` (lazy or eager) on the row's input: one tensor out."""
        return self.out(module(*self.args(module, x)))

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
    Row(
        lazy=lazynn.LazyLinear,
        eager=nn.Linear,
        inferred="in_features",
        options=_linear_options(),
        shape=_linear_shape,
        sizes=_any_size,
        simple={"out_features": 3},
    ),
]
for _rank, (_lazy, _eager, _lazy_t, _eager_t) in enumerate(
    [
        (lazynn.LazyConv1d, nn.Conv1d, lazynn.LazyConvTranspose1d, nn.ConvTranspose1d),
        (lazynn.LazyConv2d, nn.Conv2d, lazynn.LazyConvTranspose2d, nn.ConvTranspose2d),
        (lazynn.LazyConv3d, nn.Conv3d, lazynn.LazyConvTranspose3d, nn.ConvTranspose3d),
    ],
    start=1,
):
    ROWS.append(
        Row(
            lazy=_lazy,
            eager=_eager,
            inferred="in_channels",
            options=_conv_options(False),
            shape=_conv_shape(_rank),
            sizes=_groups_sizes,
            simple={"out_channels": 4, "kernel_size": 3},
        )
    )
    ROWS.append(
        Row(
            lazy=_lazy_t,
            eager=_eager_t,
            inferred="in_channels",
            options=_conv_options(True),
            shape=_conv_shape(_rank),
            sizes=_groups_sizes,
            simple={"out_channels": 4, "kernel_size": 3},
        )
    )
for _lazy, _eager, _brank, _unbatched, _affine in [
    (lazynn.LazyBatchNorm1d, nn.BatchNorm1d, 3, False, True),
    (lazynn.LazyBatchNorm2d, nn.BatchNorm2d, 4, False, True),
    (lazynn.LazyBatchNorm3d, nn.BatchNorm3d, 5, False, True),
    (lazynn.LazyInstanceNorm1d, nn.InstanceNorm1d, 3, True, False),
    (lazynn.LazyInstanceNorm2d, nn.InstanceNorm2d, 4, True, False),
    (lazynn.LazyInstanceNorm3d, nn.InstanceNorm3d, 5, True, False),
]:
    ROWS.append(
        Row(
            lazy=_lazy,
            eager=_eager,
            inferred="num_features",
            options=_norm_options(_affine),
            shape=_norm_shape(_brank, _unbatched),
            sizes=_any_size,
            simple={"affine": True, "track_running_stats": True},
        )
    )


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


#: the input of the rows' ``materialize`` models (drawn from a generator of its own: making
#: it leaves the global random stream alone)
_X = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))

ROWS += [
    # simple: num_groups=1, so that any size is valid for the tests that pick their own
    # sizes (test_copies builds with 2 and 5); the hypothesis options draw 1, 2 and 3.
    Row(
        lazy=lazynn.LazyGroupNorm,
        eager=nn.GroupNorm,
        inferred="num_channels",
        options=st.fixed_dictionaries(
            {
                "num_groups": st.sampled_from([1, 2, 3]),
                "eps": st.sampled_from([1e-5, 1e-3]),
                "affine": st.booleans(),
            }
        ),
        shape=_channels_shape(3),
        sizes=lambda o: _multiples(o, o["num_groups"]),
        simple={"num_groups": 1},
        wrong_ranks=(1,),
        step=lambda o: int(o["num_groups"]),
        materialize=(
            Twin(
                id="group-norm-prelu",
                lazy=lambda: nn.Sequential(lazynn.LazyGroupNorm(1), lazynn.LazyPReLU()),
                eager=lambda: nn.Sequential(nn.GroupNorm(1, 5), nn.PReLU(5)),
                inputs=lambda: (_X,),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyPReLU,
        eager=nn.PReLU,
        inferred="num_parameters",
        options=st.fixed_dictionaries({"init": st.sampled_from([0.25, 0.1])}),
        shape=_channels_shape(3),
        sizes=_any_size,
        simple={},
        wrong_ranks=(1,),
    ),
    Row(
        lazy=lazynn.LazySyncBatchNorm,
        eager=nn.SyncBatchNorm,
        inferred="num_features",
        options=_norm_options(True),
        shape=_channels_shape(3),
        sizes=_any_size,
        simple={"affine": True, "track_running_stats": True},
        wrong_ranks=(1,),
    ),
    Row(
        lazy=lazynn.LazyRNNCell,
        eager=nn.RNNCell,
        inferred="input_size",
        options=st.fixed_dictionaries(
            {
                "hidden_size": st.integers(1, 5),
                "bias": st.booleans(),
                "nonlinearity": st.sampled_from(["tanh", "relu"]),
            }
        ),
        shape=_cell_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(0, 3),
    ),
    Row(
        lazy=lazynn.LazyGRUCell,
        eager=nn.GRUCell,
        inferred="input_size",
        options=st.fixed_dictionaries({"hidden_size": st.integers(1, 5), "bias": st.booleans()}),
        shape=_cell_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(0, 3),
        materialize=(
            Twin(
                id="gru-cell",
                lazy=lambda: lazynn.LazyGRUCell(4),
                eager=lambda: nn.GRUCell(8, 4),
                inputs=lambda: (_X[0],),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyLayerNorm,
        eager=nn.LayerNorm,
        inferred="normalized_shape",
        options=st.fixed_dictionaries(
            {
                "eps": st.sampled_from([1e-5, 1e-3]),
                "elementwise_affine": st.booleans(),
                "bias": st.booleans(),
            }
        ),
        shape=_cell_shape,
        sizes=_any_size,
        simple={},
        wrong_ranks=(0,),
        size_of=lambda m: m.normalized_shape[0],
        variants=(
            Twin(
                id="layer-norm-2-dims",
                lazy=lambda: lazynn.LazyLayerNorm(dims=2),
                eager=lambda: nn.LayerNorm((3, 5)),
                inputs=lambda: (torch.randn(4, 3, 5),),
                checkpoint=True,
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyRMSNorm,
        eager=nn.RMSNorm,
        inferred="normalized_shape",
        options=st.fixed_dictionaries(
            {"eps": st.sampled_from([None, 1e-3]), "elementwise_affine": st.booleans()}
        ),
        shape=_cell_shape,
        sizes=_any_size,
        simple={},
        wrong_ranks=(0,),
        size_of=lambda m: m.normalized_shape[0],
    ),
    # simple: nhead=1 (any d_model is valid) and dropout=0.0, so that outputs do not depend
    # on the RNG state at call time (the generic tests compare outputs of separately called
    # twins); the hypothesis options draw dropout 0.1 too, where both draw the same numbers.
    Row(
        lazy=lazynn.LazyTransformerEncoderLayer,
        eager=nn.TransformerEncoderLayer,
        inferred="d_model",
        options=st.fixed_dictionaries(
            {
                "nhead": st.sampled_from([1, 2]),
                "dim_feedforward": st.integers(2, 8),
                "dropout": st.sampled_from([0.0, 0.1]),
                "activation": st.sampled_from(["relu", "gelu"]),
                "batch_first": st.booleans(),
                "norm_first": st.booleans(),
            }
        ),
        shape=_sequence_shape,
        sizes=lambda o: _multiples(o, o["nhead"]),
        simple={"nhead": 1, "dim_feedforward": 8, "dropout": 0.0},
        wrong_ranks=(1, 4),
        size_of=_transformer_size,
        step=lambda o: int(o["nhead"]),
        materialize=(
            Twin(
                id="encoder-layer",
                lazy=lambda: lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16),
                eager=lambda: nn.TransformerEncoderLayer(8, 2, 16),
                inputs=lambda: (_X,),
            ),
            Twin(
                id="encoder-of-copies",
                lazy=lambda: nn.TransformerEncoder(
                    lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16),
                    3,
                    enable_nested_tensor=False,
                ),
                eager=lambda: nn.TransformerEncoder(
                    nn.TransformerEncoderLayer(8, 2, 16), 3, enable_nested_tensor=False
                ),
                inputs=lambda: (_X,),
            ),
        ),
    ),
]


# --- layers with several inputs or a tuple output ---------------------------------------------


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if value is None:
        return []
    return [t for v in value for t in _leaves(v)]


def _joined(output: Any) -> torch.Tensor:
    """A tuple output (``(out, (h, c))``, ``(out, weights)``, a named tuple) as one tensor:
    its floating tensors flattened and concatenated (a max pool's indices left out)."""
    return torch.cat([t.flatten() for t in _leaves(output) if t.is_floating_point()])


def _resized(x: torch.Tensor, size: Any) -> torch.Tensor:
    """``x`` with its last dimension made ``size`` (repeated, then cut), for a declared
    ``kdim`` / ``vdim``; ``x`` itself when ``size`` is not a declared int or is x's."""
    if not isinstance(size, int) or x.dim() == 0 or x.shape[-1] in (0, size):
        return x
    repeats = -(-size // x.shape[-1])
    return torch.cat([x] * repeats, dim=-1)[..., :size]


def _attention_args(m: nn.Module, x: torch.Tensor) -> tuple[Any, ...]:
    """Self-attention: query x; key and value from x (of the declared kdim / vdim, if any)."""
    return x, _resized(x, m.kdim), _resized(x.cos(), m.vdim)


def _targets(x: torch.Tensor, classes: int, trailing: tuple[int, ...] = ()) -> torch.Tensor:
    """Class indices spread over ``[0, classes)`` (head and tail clusters alike): one per row
    of a batched (2-d) input, one for an unbatched one."""
    shape = ((x.shape[0],) if x.dim() >= 2 else ()) + tuple(trailing)
    count = math.prod(shape)
    spread = torch.arange(count, device=x.device) * (classes - 1) // max(count - 1, 1)
    return spread.reshape(shape)


def _second_input(x: torch.Tensor) -> torch.Tensor:
    """Bilinear's second input: x and one more feature (so in2_features = in1_features + 1)."""
    return torch.cat([x, x[..., :1].cos()], dim=-1) if x.dim() else x


@st.composite
def _recurrent_options(draw: st.DrawFn, nonlinearity: bool, proj: bool) -> Options:
    hidden = draw(st.integers(1, 4))
    layers = draw(st.integers(1, 2))
    options: Options = {
        "hidden_size": hidden,
        "num_layers": layers,
        "bias": draw(st.booleans()),
        "batch_first": draw(st.booleans()),
        "bidirectional": draw(st.booleans()),
        # dropout acts between layers (torch warns about it with one layer); the twins draw
        # the same masks after the same initialization
        "dropout": draw(st.sampled_from([0.0, 0.5])) if layers > 1 else 0.0,
    }
    if nonlinearity:
        options["nonlinearity"] = draw(st.sampled_from(["tanh", "relu"]))
    if proj:
        options["proj_size"] = draw(st.integers(0, hidden - 1))
    return options


@st.composite
def _adaptive_options(draw: st.DrawFn) -> Options:
    classes = draw(st.integers(6, 10))
    # two cutoffs: three clusters, the last with in_features // div_value**2 features
    cutoffs = sorted(draw(st.sets(st.integers(1, classes - 1), min_size=2, max_size=2)))
    return {
        "n_classes": classes,
        "cutoffs": cutoffs,
        "div_value": draw(st.sampled_from([2.0, 4.0])),
        "head_bias": draw(st.booleans()),
    }


def _adaptive_sizes(o: Options) -> st.SearchStrategy[int]:
    # each tail cluster needs at least one feature (torch warns about an empty projection)
    least = int(o["div_value"] ** len(o["cutoffs"]))
    return st.integers(least, least + 3)


def _rows_shape(o: Options, c: int, batched: bool) -> tuple[int, ...]:
    # a K-dimensional loss (LinearCrossEntropyLoss's out_features) takes batched inputs only
    return (6, c) if batched or o.get("out_features") else (c,)


# --- the rows' other call forms (tests/layer/test_lazy_layers_called_otherwise.py) ----------------


def _call(*a: Any, **k: Any) -> Callable[[], Inputs]:
    """Inputs made from factories, each called when the inputs are needed."""

    def make() -> Inputs:
        return tuple(f() for f in a), {key: f() for key, f in k.items()}

    return make


def _randn(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(shape)


def _classes(n_classes: int, *shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, n_classes, shape)


def _causal(n: int) -> Callable[[], torch.Tensor]:
    return lambda: nn.Transformer.generate_square_subsequent_mask(n)


def _padding(batch: int, length: int) -> Callable[[], torch.Tensor]:
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return lambda: mask.clone()


def _shape_text(*shape: int) -> str:
    return re.escape(str(tuple(shape)))


def _decoder_sizes(m: nn.Module) -> tuple[int, ...]:
    # nn.TransformerDecoderLayer keeps no d_model attribute: read it where it lands
    return (m.linear1.in_features, m.self_attn.embed_dim, m.multihead_attn.embed_dim)


_LSTM_CELL_CALLS = (
    CallForm(
        id="lstm-cell-state-no-bias",
        lazy=lambda: lazynn.LazyLSTMCell(3, bias=False),
        eager=lambda: nn.LSTMCell(5, 3, bias=False),
        inputs=lambda: ((torch.randn(4, 5), (torch.randn(4, 3), torch.randn(4, 3))), {}),
        sizes=lambda m: (m.input_size,),
        other=lambda: nn.LSTMCell(2, 3, bias=False),
        other_inputs=_call(_randn(4, 2)),
        beyond="an explicit (h, c) state",
        bad=(
            Bad(
                id="lstm-cell-state-of-another-size",
                inputs=lambda: ((torch.randn(4, 5), (torch.randn(4, 2), torch.randn(4, 2))), {}),
                pattern=rf"expected .*received .*{_shape_text(4, 2)}.*hidden_size",
            ),
        ),
    ),
)


def _bilinear_sizes(m: nn.Module) -> tuple[int, ...]:
    return (m.in1_features, m.in2_features)


_BILINEAR_CALLS = (
    CallForm(
        id="bilinear",
        lazy=lambda: lazynn.LazyBilinear(3),
        eager=lambda: nn.Bilinear(5, 4, 3),
        inputs=_call(_randn(6, 5), _randn(6, 4)),
        sizes=_bilinear_sizes,
        other=lambda: nn.Bilinear(2, 7, 3),
        other_inputs=_call(_randn(6, 2), _randn(6, 7)),
        bad=(
            Bad(
                id="bilinear-second-not-a-tensor",
                inputs=_call(_randn(6, 5), lambda: [1.0, 2.0]),
                pattern=r"expected .*\bin2_features\b.*received list",
            ),
            Bad(
                id="bilinear-second-missing",
                inputs=_call(_randn(6, 5)),
                pattern=r"expected .*\bin2_features\b.*received None",
            ),
            Bad(
                id="bilinear-batches-differ",
                inputs=_call(_randn(6, 5), _randn(7, 4)),
                pattern=rf"expected .*received .*{_shape_text(6, 5)}"
                rf".*{_shape_text(7, 4)}",
            ),
        ),
    ),
    CallForm(
        id="bilinear-keywords",
        lazy=lambda: lazynn.LazyBilinear(3),
        eager=lambda: nn.Bilinear(5, 4, 3),
        inputs=_call(input1=_randn(6, 5), input2=_randn(6, 4)),
        sizes=_bilinear_sizes,
        other=lambda: nn.Bilinear(4, 5, 3),
        other_inputs=_call(input1=_randn(6, 4), input2=_randn(6, 5)),
        beyond="inputs by keyword",
    ),
)
_DECODER_CALLS = (
    CallForm(
        id="decoder",
        lazy=lambda: lazynn.LazyTransformerDecoderLayer(2, 8, 0.0, batch_first=True),
        eager=lambda: nn.TransformerDecoderLayer(4, 2, 8, 0.0, batch_first=True),
        inputs=_call(_randn(3, 5, 4), _randn(3, 6, 4)),
        sizes=_decoder_sizes,
        other=lambda: nn.TransformerDecoderLayer(6, 2, 8, 0.0, batch_first=True),
        other_inputs=_call(_randn(3, 5, 6), _randn(3, 6, 6)),
        bad=(
            Bad(
                id="decoder-memory-of-another-size",
                inputs=_call(_randn(3, 5, 4), _randn(3, 6, 6)),
                pattern=rf"expected .*received .*{_shape_text(3, 6, 6)}",
            ),
            Bad(
                id="decoder-memory-missing",
                inputs=_call(_randn(3, 5, 4)),
                pattern=rf"expected .*received .*{_shape_text(3, 5, 4)}.*memory",
            ),
            Bad(
                id="decoder-d_model-not-divisible",
                inputs=_call(_randn(3, 5, 5), _randn(3, 6, 5)),
                pattern=rf"expected .*received .*{_shape_text(3, 5, 5)}.*d_model=5"
                r".*divisible by num_heads",
                eager_refuses=False,
            ),
        ),
    ),
    CallForm(
        id="decoder-keywords-masks",
        lazy=lambda: lazynn.LazyTransformerDecoderLayer(2, 8, 0.0, batch_first=True),
        eager=lambda: nn.TransformerDecoderLayer(4, 2, 8, 0.0, batch_first=True),
        inputs=_call(
            tgt=_randn(3, 5, 4),
            memory=_randn(3, 6, 4),
            tgt_mask=_causal(5),
            memory_key_padding_mask=_padding(3, 6),
            tgt_is_causal=lambda: True,
        ),
        sizes=_decoder_sizes,
        other=lambda: nn.TransformerDecoderLayer(8, 2, 8, 0.0, batch_first=True),
        other_inputs=_call(tgt=_randn(3, 5, 8), memory=_randn(3, 6, 8)),
        beyond="inputs by keyword, masks and tgt_is_causal",
    ),
)
_ADAPTIVE_CALLS = (
    CallForm(
        id="adaptive",
        lazy=lambda: lazynn.LazyAdaptiveLogSoftmaxWithLoss(10, [3, 6], div_value=2.0),
        eager=lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [3, 6], div_value=2.0),
        inputs=_call(_randn(7, 8), _classes(10, 7)),
        sizes=lambda m: (m.in_features,),
        other=lambda: nn.AdaptiveLogSoftmaxWithLoss(12, 10, [3, 6], div_value=2.0),
        other_inputs=_call(_randn(7, 12), _classes(10, 7)),
        bad=(
            Bad(
                id="adaptive-batches-differ",
                inputs=_call(_randn(7, 8), _classes(10, 6)),
                pattern=rf"expected .*received .*{_shape_text(7, 8)}.*{_shape_text(6)}"
                r".*batch dimension",
            ),
        ),
    ),
)


ROWS += [
    Row(
        lazy=lazynn.LazyRNN,
        eager=nn.RNN,
        inferred="input_size",
        options=_recurrent_options(True, False),
        shape=_sequence_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(1, 4),
        out=_joined,
    ),
    Row(
        lazy=lazynn.LazyLSTM,
        eager=nn.LSTM,
        inferred="input_size",
        options=_recurrent_options(False, True),
        shape=_sequence_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(1, 4),
        out=_joined,
        variants=(
            Twin(
                id="lstm-packed",
                lazy=lambda: lazynn.LazyLSTM(4),
                eager=lambda: nn.LSTM(5, 4),
                inputs=lambda: (
                    pack_padded_sequence(torch.randn(6, 3, 5), torch.tensor([6, 4, 2])),
                ),
            ),
        ),
        materialize=(
            Twin(
                id="lstm",
                lazy=lambda: lazynn.LazyLSTM(4, num_layers=2, bidirectional=True),
                eager=lambda: nn.LSTM(8, 4, num_layers=2, bidirectional=True),
                inputs=lambda: (_X,),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyGRU,
        eager=nn.GRU,
        inferred="input_size",
        options=_recurrent_options(False, False),
        shape=_sequence_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(1, 4),
        out=_joined,
    ),
    Row(
        lazy=lazynn.LazyLSTMCell,
        eager=nn.LSTMCell,
        inferred="input_size",
        options=st.fixed_dictionaries({"hidden_size": st.integers(1, 5), "bias": st.booleans()}),
        shape=_cell_shape,
        sizes=_any_size,
        simple={"hidden_size": 3},
        wrong_ranks=(0, 3),
        out=_joined,
        calls=_LSTM_CELL_CALLS,
    ),
    # simple: num_heads=1 and dropout=0.0, as the TransformerEncoderLayer row
    Row(
        lazy=lazynn.LazyMultiheadAttention,
        eager=nn.MultiheadAttention,
        inferred="embed_dim",
        options=st.fixed_dictionaries(
            {
                "num_heads": st.sampled_from([1, 2]),
                "dropout": st.sampled_from([0.0, 0.1]),
                "bias": st.booleans(),
                "add_bias_kv": st.booleans(),
                "add_zero_attn": st.booleans(),
                "batch_first": st.booleans(),
            }
        ),
        shape=_sequence_shape,
        sizes=lambda o: _multiples(o, o["num_heads"]),
        simple={"num_heads": 1},
        wrong_ranks=(1, 4),
        step=lambda o: int(o["num_heads"]),
        args=_attention_args,
        out=_joined,
        variants=(
            Twin(
                id="mha-declared-kdim",
                lazy=lambda: lazynn.LazyMultiheadAttention(2, kdim=6, vdim=7),
                eager=lambda: nn.MultiheadAttention(8, 2, kdim=6, vdim=7),
                inputs=lambda: (torch.randn(5, 3, 8), torch.randn(4, 3, 6), torch.randn(4, 3, 7)),
                checkpoint=True,
            ),
        ),
        materialize=(
            Twin(
                id="mha",
                lazy=lambda: lazynn.LazyMultiheadAttention(2),
                eager=lambda: nn.MultiheadAttention(8, 2),
                inputs=lambda: (_X, _X, _X),
            ),
        ),
    ),
    # nn.Transformer warns (its encoder's nested-tensor fast path is off) unless batch_first,
    # not norm_first and an even nhead: the options stay within those
    Row(
        lazy=lazynn.LazyTransformer,
        eager=nn.Transformer,
        inferred="d_model",
        options=st.fixed_dictionaries(
            {
                "nhead": st.sampled_from([2, 4]),
                "num_encoder_layers": st.integers(1, 2),
                "num_decoder_layers": st.integers(1, 2),
                "dim_feedforward": st.integers(2, 8),
                "dropout": st.sampled_from([0.0, 0.1]),
                "activation": st.sampled_from(["relu", "gelu"]),
                "batch_first": st.just(True),
            }
        ),
        shape=_sequence_shape,
        sizes=lambda o: _multiples(o, o["nhead"]),
        simple={
            "nhead": 2,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "dim_feedforward": 8,
            "dropout": 0.0,
            "batch_first": True,
        },
        wrong_ranks=(1, 4),
        step=lambda o: int(o["nhead"]),
        args=lambda m, x: (x, x.tanh()),
        variants=(
            # a target sequence of another length than the source
            Twin(
                id="transformer",
                lazy=lambda: lazynn.LazyTransformer(
                    nhead=2,
                    num_encoder_layers=1,
                    num_decoder_layers=1,
                    dim_feedforward=16,
                    dropout=0.0,
                    batch_first=True,
                ),
                eager=lambda: nn.Transformer(8, 2, 1, 1, 16, 0.0, batch_first=True),
                inputs=lambda: (torch.randn(2, 3, 8), torch.randn(2, 4, 8)),
            ),
        ),
        materialize=(
            Twin(
                id="transformer",
                lazy=lambda: lazynn.LazyTransformer(
                    nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16
                ),
                eager=lambda: nn.Transformer(8, 2, 2, 1, 16),
                inputs=lambda: (_X, _X),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyTransformerDecoderLayer,
        eager=nn.TransformerDecoderLayer,
        inferred="d_model",
        options=st.fixed_dictionaries(
            {
                "nhead": st.sampled_from([1, 2]),
                "dim_feedforward": st.integers(2, 8),
                "dropout": st.sampled_from([0.0, 0.1]),
                "activation": st.sampled_from(["relu", "gelu"]),
                "batch_first": st.booleans(),
                "norm_first": st.booleans(),
                "bias": st.booleans(),
            }
        ),
        shape=_sequence_shape,
        sizes=lambda o: _multiples(o, o["nhead"]),
        simple={"nhead": 1, "dim_feedforward": 8, "dropout": 0.0},
        wrong_ranks=(1, 4),
        size_of=_transformer_size,
        step=lambda o: int(o["nhead"]),
        args=lambda m, x: (x, x.cos()),
        calls=_DECODER_CALLS,
        materialize=(
            Twin(
                id="decoder-layer",
                lazy=lambda: lazynn.LazyTransformerDecoderLayer(2, dim_feedforward=16),
                eager=lambda: nn.TransformerDecoderLayer(8, 2, 16),
                inputs=lambda: (_X, _X),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyBilinear,
        eager=nn.Bilinear,
        inferred="in1_features",
        options=_linear_options(),
        shape=_linear_shape,
        sizes=_any_size,
        simple={"out_features": 3},
        wrong_ranks=(0,),
        args=lambda m, x: (x, _second_input(x)),
        eager_sizes=lambda o, c: {"in1_features": c, "in2_features": c + 1},
        calls=_BILINEAR_CALLS,
        materialize=(
            Twin(
                id="bilinear",
                lazy=lambda: lazynn.LazyBilinear(3),
                eager=lambda: nn.Bilinear(8, 8, 3),
                inputs=lambda: (_X, _X),
            ),
        ),
    ),
    Row(
        lazy=lazynn.LazyAdaptiveLogSoftmaxWithLoss,
        eager=nn.AdaptiveLogSoftmaxWithLoss,
        inferred="in_features",
        options=_adaptive_options(),
        shape=_rows_shape,
        sizes=_adaptive_sizes,
        simple={"n_classes": 8, "cutoffs": [4], "div_value": 2.0},
        wrong_ranks=(0, 3),
        args=lambda m, x: (x, _targets(x, m.n_classes)),
        out=_joined,
        rehearsable=False,
        calls=_ADAPTIVE_CALLS,
    ),
    Row(
        lazy=lazynn.LazyLinearCrossEntropyLoss,
        eager=nn.LinearCrossEntropyLoss,
        inferred="in_features",
        options=st.fixed_dictionaries(
            {
                "num_classes": st.integers(2, 6),
                "bias": st.booleans(),
                "out_features": st.sampled_from([(), (2,)]),
                "reduction": st.sampled_from(["mean", "sum", "none"]),
                "label_smoothing": st.sampled_from([0.0, 0.1]),
            }
        ),
        shape=_rows_shape,
        sizes=_any_size,
        simple={"num_classes": 5},
        wrong_ranks=(0, 3),
        size_of=lambda m: m.linear.in_features,
        args=lambda m, x: (x, _targets(x, m.num_classes, m.out_features)),
    ),
]


# --- rank-agnostic layers: a row per rank (the class the input's rank selects) ----------------


@st.composite
def _max_pool_options(draw: st.DrawFn) -> Options:
    kernel = draw(st.integers(1, 3))
    return {
        "kernel_size": kernel,
        "stride": draw(st.sampled_from([None, 1, 2])),
        "padding": draw(st.integers(0, kernel // 2)),
        "dilation": draw(st.integers(1, 2)),
        "return_indices": draw(st.booleans()),
        "ceil_mode": draw(st.booleans()),
    }


@st.composite
def _avg_pool_options(draw: st.DrawFn) -> Options:
    kernel = draw(st.integers(1, 3))
    return {
        "kernel_size": kernel,
        "stride": draw(st.sampled_from([None, 1, 2])),
        "padding": draw(st.integers(0, kernel // 2)),
        "ceil_mode": draw(st.booleans()),
        "count_include_pad": draw(st.booleans()),
    }


def _agnostic(
    *,
    lazy: type[nn.Module],
    eager: type[nn.Module],
    rank: int,
    inferred: str,
    options: st.SearchStrategy[Options],
    shape: Callable[..., tuple[int, ...]],
    sizes: Callable[[Options], st.SearchStrategy[int]],
    simple: Options,
    suffix: str = "",
    input_rank: int | None = None,
    **more: Any,
) -> Row:
    """A row of a rank-agnostic layer, for inputs of one rank (``rank`` spatial dims; the
    input's rank ``input_rank``, by default ``rank + 2``): batched only; wrong ranks: 1 (no
    class takes it) and 6 (none takes it either)."""
    return Row(
        lazy=lazy,
        eager=eager,
        inferred=inferred,
        options=options,
        shape=shape,
        sizes=sizes,
        simple=simple,
        wrong_ranks=(1, 6),
        name=f"{lazy.__name__}-{rank}d{suffix}",
        input_rank=rank + 2 if input_rank is None else input_rank,
        **more,
    )


_OUTPUT_SIZE = st.fixed_dictionaries({"output_size": st.integers(1, 3)})
# the class each rank-agnostic layer becomes, per number of spatial dimensions
for _rank, _eagers in enumerate(
    [
        (
            nn.Conv1d,
            nn.ConvTranspose1d,
            nn.BatchNorm1d,
            nn.InstanceNorm1d,
            nn.MaxPool1d,
            nn.AvgPool1d,
            nn.AdaptiveAvgPool1d,
            nn.AdaptiveMaxPool1d,
            nn.Dropout1d,
        ),
        (
            nn.Conv2d,
            nn.ConvTranspose2d,
            nn.BatchNorm2d,
            nn.InstanceNorm2d,
            nn.MaxPool2d,
            nn.AvgPool2d,
            nn.AdaptiveAvgPool2d,
            nn.AdaptiveMaxPool2d,
            nn.Dropout2d,
        ),
        (
            nn.Conv3d,
            nn.ConvTranspose3d,
            nn.BatchNorm3d,
            nn.InstanceNorm3d,
            nn.MaxPool3d,
            nn.AvgPool3d,
            nn.AdaptiveAvgPool3d,
            nn.AdaptiveMaxPool3d,
            nn.Dropout3d,
        ),
    ],
    start=1,
):
    _conv, _conv_t, _bn, _in, _max, _avg, _aavg, _amax, _drop = _eagers
    _norm = {"affine": True, "track_running_stats": True}
    _pool_shape = _conv_shape(_rank)
    ROWS += [
        _agnostic(
            lazy=lazynn.Conv,
            eager=_conv,
            rank=_rank,
            inferred="in_channels",
            options=_conv_options(False),
            shape=_conv_shape(_rank),
            sizes=_groups_sizes,
            simple={"out_channels": 4, "kernel_size": 3},
        ),
        _agnostic(
            lazy=lazynn.ConvTranspose,
            eager=_conv_t,
            rank=_rank,
            inferred="in_channels",
            options=_conv_options(True),
            shape=_conv_shape(_rank),
            sizes=_groups_sizes,
            simple={"out_channels": 4, "kernel_size": 3},
        ),
        _agnostic(
            lazy=lazynn.BatchNorm,
            eager=_bn,
            rank=_rank,
            inferred="num_features",
            options=_norm_options(True),
            shape=_norm_shape(_rank + 2, False),
            sizes=_any_size,
            simple=_norm,
            checkpoint_builds=False,
        ),
        _agnostic(
            lazy=lazynn.InstanceNorm,
            eager=_in,
            rank=_rank,
            inferred="num_features",
            options=_norm_options(False),
            shape=_norm_shape(_rank + 2, False),
            sizes=_any_size,
            simple=_norm,
            checkpoint_builds=False,
        ),
        _agnostic(
            lazy=lazynn.MaxPool,
            eager=_max,
            rank=_rank,
            inferred="",
            options=_max_pool_options(),
            shape=_pool_shape,
            sizes=_any_size,
            simple={"kernel_size": 2},
            out=_joined,
        ),
        _agnostic(
            lazy=lazynn.AvgPool,
            eager=_avg,
            rank=_rank,
            inferred="",
            options=_avg_pool_options(),
            shape=_pool_shape,
            sizes=_any_size,
            simple={"kernel_size": 2},
        ),
        _agnostic(
            lazy=lazynn.AdaptiveAvgPool,
            eager=_aavg,
            rank=_rank,
            inferred="",
            options=_OUTPUT_SIZE,
            shape=_pool_shape,
            sizes=_any_size,
            simple={"output_size": 2},
        ),
        _agnostic(
            lazy=lazynn.AdaptiveMaxPool,
            eager=_amax,
            rank=_rank,
            inferred="",
            options=st.fixed_dictionaries(
                {"output_size": st.integers(1, 3), "return_indices": st.booleans()}
            ),
            shape=_pool_shape,
            sizes=_any_size,
            simple={"output_size": 2},
            out=_joined,
        ),
        # simple: p=0.0, so that separately called twins agree (the hypothesis options draw
        # p=0.5 too, where both draw the same mask)
        _agnostic(
            lazy=lazynn.ChannelDropout,
            eager=_drop,
            rank=_rank,
            inferred="",
            options=st.fixed_dictionaries({"p": st.sampled_from([0.0, 0.5])}),
            shape=_pool_shape,
            sizes=_any_size,
            simple={"p": 0.0},
        ),
    ]
# BatchNorm1d takes (N, C) too
ROWS.append(
    _agnostic(
        lazy=lazynn.BatchNorm,
        eager=nn.BatchNorm1d,
        rank=1,
        inferred="num_features",
        options=_norm_options(True),
        shape=_norm_shape(2, False),
        sizes=_any_size,
        simple={"affine": True, "track_running_stats": True},
        suffix="-NC",
        input_rank=2,
        checkpoint_builds=False,
    )
)

#: rows whose layers accept an unbatched input
UNBATCHED = {
    r.lazy
    for r in ROWS
    if r.lazy.__name__.startswith(
        (
            "LazyConv",
            "LazyInstance",
            "LazyRNN",
            "LazyGRU",
            "LazyLSTM",
            "LazyTransformer",
            "LazyLayerNorm",
            "LazyRMSNorm",
            "LazyMultiheadAttention",
            "LazyBilinear",
            "LazyAdaptiveLogSoftmaxWithLoss",
            "LazyLinearCrossEntropyLoss",
        )
    )
}


# --- an unbuilt module's tensors: its placeholders, and the buffers known before the build ----


def known_names(module: nn.Module) -> set[str]:
    """The qualified names of the buffers of ``module`` and its submodules that are real
    tensors before the build: each lazy layer's own ``known_buffers`` (the lazy norms'
    ``num_batches_tracked``, ``tensor(0)`` as in torch's lazy norms: no input decides its
    shape). Read from each module's class, so a built module (of an eager class) has none."""
    names: set[str] = set()
    for prefix, sub in module.named_modules():
        for name in getattr(type(sub), "known_buffers", frozenset()):
            if sub._buffers.get(name) is not None:
                names.add(f"{prefix}.{name}" if prefix else name)
    return names


def lazy_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """An unbuilt module's lazy tensors, the placeholders whose shape the first input decides,
    by qualified name (parameters, then buffers): every parameter and buffer but the known
    ones (``known_names``)."""
    known = known_names(module)
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {name: t for name, t in tensors.items() if name not in known}


def known_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """An unbuilt module's known buffers (``known_names``) by qualified name: real tensors."""
    known = known_names(module)
    return {name: t for name, t in module.named_buffers() if name in known}


def same_value(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal real tensors: dtype, device, shape, and values (unread on meta)."""
    if (a.dtype, a.device, a.shape) != (b.dtype, b.device, b.shape):
        return False
    return a.is_meta or torch.equal(a, b)


def assert_known_initial(module: nn.Module) -> None:
    """Each known buffer of unbuilt ``module`` is what torch's lazy norms hold before their
    build: a plain ``tensor(0, dtype=torch.long)``, no placeholder (its value unread on meta)."""
    for name, t in known_tensors(module).items():
        assert type(t) is torch.Tensor, name
        assert not lazynn.is_lazy(t), name
        assert not torch.nn.parameter.is_lazy(t), name
        assert (t.shape, t.dtype, t.requires_grad) == ((), torch.long, False), name
        if not t.is_meta:
            assert t.item() == 0, name


def _tensors(row: Row) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    layer = row.lazy(**row.simple)
    return list(layer.parameters()), list(layer.buffers())


def has_parameters(row: Row) -> bool:
    """Whether the layer (with the row's simple options) has parameters."""
    return bool(_tensors(row)[0])


def has_tensors(row: Row) -> bool:
    """Whether the layer (with the row's simple options) has parameters or buffers."""
    return any(_tensors(row))


#: rows whose layers have parameters / parameters or buffers, for the tests about them
PARAMETER_ROWS = [r for r in ROWS if has_parameters(r)]
TENSOR_ROWS = [r for r in ROWS if has_tensors(r)]


def build_pair(
    row: Row, options: Options, size: int, seed: int = 0, batched: bool = True
) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(lazy after its first call, eager twin, input): both initialized under ``seed``."""
    x = row.input(options, size, batched)
    torch.manual_seed(seed)
    lazy = row.lazy(**options)
    row.call(lazy, x)
    torch.manual_seed(seed)
    eager = row.new_eager(options, size)
    row.call(eager, x)
    return lazy, eager, x
