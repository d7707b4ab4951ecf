"""A lazy layer takes exactly its eager class's arguments, minus the inferred one.

* ``inspect.signature(LazyX)`` is ``inspect.signature(X)`` without the inferred parameter:
  same names, order, kinds and defaults (annotations aside);
* it is also the signature of torch's own ``nn.LazyX``, except the ``LazyInstanceNorm*``
  defaults: ``affine`` and ``track_running_stats`` are False in lazynn (as in
  ``nn.InstanceNorm*``) and True in torch;
* every option of the eager signature is accepted, by keyword and by position, and the
  layer builds to the eager class made with that option, bit for bit under one seed.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazynn
from compare import assert_same_module
from registry import ROWS, Row


def params(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter: the signature without annotations."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def eager_signature(cls: type[nn.Module]) -> inspect.Signature:
    """The eager class's constructor signature; for a class taking ``(*args, **kwargs)``
    (nn.RNN, nn.LSTM, nn.GRU), its documented overload's."""
    signature = inspect.signature(cls)
    if not any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        return signature
    get_overloads = getattr(typing, "get_overloads", None)
    if get_overloads is None:  # Python < 3.11
        pytest.skip(f"typing.get_overloads is needed to read nn.{cls.__name__}'s signature")
    explicit = [
        o for o in get_overloads(cls.__init__) if "args" not in inspect.signature(o).parameters
    ]
    assert len(explicit) == 1, cls
    overload = inspect.signature(explicit[0])
    return overload.replace(parameters=list(overload.parameters.values())[1:])  # no self


def kind(row: Row) -> str:
    name = row.eager.__name__
    if "Transpose" in name:
        return "conv_transpose"
    if "Conv" in name:
        return "conv"
    if "Norm" in name:
        return "norm"
    return "linear"


def rank(row: Row) -> int:
    """The number of spatial dimensions of a convolution row (1, 2 or 3)."""
    return int(row.eager.__name__[-2])


# --- 10. signatures ---------------------------------------------------------------------------


#: where the inferred argument sits in the eager signature, when not first
#: (``GroupNorm(num_groups, num_channels)``)
INFERRED_POSITION: dict[type[nn.Module], int] = {nn.GroupNorm: 1}


def eager_args(row: Row, size: int, positional: tuple[Any, ...]) -> tuple[Any, ...]:
    """The eager class's positional arguments: the lazy ones with the sizes in their place."""
    position = INFERRED_POSITION.get(row.eager, 0)
    sizes = tuple(row.eager_kwargs({}, size).values())
    return (*positional[:position], *sizes, *positional[position:])


#: keyword-only arguments a lazy layer adds to its eager class's (how to read its size)
EXTRA = {lazynn.LazyLayerNorm: ["dims"], lazynn.LazyRMSNorm: ["dims"]}


def lazy_params(row: Row) -> list[tuple[str, Any, Any]]:
    """The lazy signature without its declared extra arguments (checked to be keyword-only)."""
    extra = EXTRA.get(row.lazy, [])
    ours = params(inspect.signature(row.lazy))
    for name, kind_, _ in ours:
        if name in extra:
            assert kind_ is inspect.Parameter.KEYWORD_ONLY, name
    return [p for p in ours if p[0] not in extra]


def test_signature_is_the_eager_one_without_the_inferred_argument(row: Row) -> None:
    # a rank-agnostic layer takes what its highest rank's class takes (AvgPool2d/3d's
    # divisor_override, which AvgPool1d lacks and refuses at the build)
    cls = max(row.lazy.by_rank.items())[1] if row.agnostic else row.eager  # type: ignore[attr-defined]
    eager = params(eager_signature(cls))
    # the inferred arguments come first in torch.nn, except where the table says
    position = INFERRED_POSITION.get(cls, 0)
    inferred = row.inferred_args  # (none for the pools and ChannelDropout, two for Bilinear)
    assert tuple(p[0] for p in eager[position : position + len(inferred)]) == inferred
    expected = [p for p in eager if p[0] not in inferred]
    assert lazy_params(row) == expected


INSTANCE_NORM_DEFAULTS = {"affine": (False, True), "track_running_stats": (False, True)}


#: lazynn layers torch ships no lazy version of (made with lazynn.lazy)
NO_TORCH_TWIN = {
    lazynn.LazyGroupNorm,
    lazynn.LazyPReLU,
    lazynn.LazySyncBatchNorm,
    lazynn.LazyRNNCell,
    lazynn.LazyGRUCell,
    lazynn.LazyTransformerEncoderLayer,
    lazynn.LazyLayerNorm,
    lazynn.LazyRMSNorm,
    lazynn.LazyRNN,
    lazynn.LazyLSTM,
    lazynn.LazyGRU,
    lazynn.LazyLSTMCell,
    lazynn.LazyMultiheadAttention,
    lazynn.LazyTransformer,
    lazynn.LazyTransformerDecoderLayer,
    lazynn.LazyBilinear,
    lazynn.LazyAdaptiveLogSoftmaxWithLoss,
    lazynn.LazyLinearCrossEntropyLoss,
}


def test_signature_matches_torchs_own_lazy_class(row: Row) -> None:
    if row.agnostic:
        pytest.skip(f"torch has no rank-agnostic class (lazynn.{row.lazy.__name__})")
    if row.lazy in NO_TORCH_TWIN:
        # nothing to compare with; the table stays true (remove the row once torch has it)
        assert not hasattr(nn, row.lazy.__name__), f"torch now has nn.{row.lazy.__name__}"
        pytest.skip(f"torch has no nn.{row.lazy.__name__}")
    torch_lazy = getattr(nn, row.lazy.__name__, None)
    assert torch_lazy is not None, f"torch has no nn.{row.lazy.__name__}"
    ours = params(inspect.signature(row.lazy))
    theirs = params(inspect.signature(torch_lazy))
    assert [(n, k) for n, k, _ in ours] == [(n, k) for n, k, _ in theirs]
    differences = {
        name: (mine, their)
        for (name, _, mine), (_, _, their) in zip(ours, theirs, strict=True)
        if mine != their
    }
    if row.lazy.__name__.startswith("LazyInstanceNorm"):
        # lazynn follows nn.InstanceNorm*'s defaults; torch's nn.LazyInstanceNorm* default
        # both to True (contrary to its docs).
        assert differences == INSTANCE_NORM_DEFAULTS
        eager_defaults = {n: d for n, _, d in params(inspect.signature(row.eager))}
        for name, (mine, _) in differences.items():
            assert eager_defaults[name] == mine
    else:
        assert differences == {}


def test_instance_norm_defaults_compute_what_the_eager_class_computes() -> None:
    """The consequence of those defaults: no affine parameters, no running statistics."""
    x = torch.randn(2, 3, 5)
    layer = lazynn.LazyInstanceNorm1d()
    y = layer(x)
    eager = nn.InstanceNorm1d(3)
    assert repr(layer) == repr(eager)
    assert list(layer.state_dict()) == list(eager.state_dict()) == []
    assert torch.equal(y, eager(x))


# --- 11. every option is accepted -------------------------------------------------------------


Settings = dict[str, list[dict[str, Any]]]

COMMON: Settings = {
    "device": [{"device": "cpu"}, {"device": torch.device("cpu")}],
    "dtype": [{"dtype": torch.float64}],
}
NORM: Settings = {
    "eps": [{"eps": 1e-3}],
    "momentum": [{"momentum": None}, {"momentum": 0.5}],
    "affine": [{"affine": True}, {"affine": False}],
    "track_running_stats": [{"track_running_stats": True}, {"track_running_stats": False}],
    "bias": [{"bias": False}, {"bias": False, "affine": True}],
}
TRANSFORMER_LAYER: Settings = {
    "nhead": [{"nhead": 2}, {"nhead": 4}],
    "dim_feedforward": [{"dim_feedforward": 3}],
    # in train mode: both twins draw the same dropout masks after the same init
    "dropout": [{"dropout": 0.5}],
    "activation": [{"activation": "gelu"}, {"activation": F.gelu}, {"activation": nn.Tanh()}],
    "layer_norm_eps": [{"layer_norm_eps": 1e-3}],
    "batch_first": [{"batch_first": True}],
    "norm_first": [{"norm_first": True}],
    "bias": [{"bias": False}],
}
RECURRENT: Settings = {
    "hidden_size": [{"hidden_size": 5}],
    "num_layers": [{"num_layers": 2}],
    "bias": [{"bias": False}],
    "batch_first": [{"batch_first": True}],
    # between layers (torch warns about it with one); the twins draw the same masks
    "dropout": [{"dropout": 0.5, "num_layers": 2}],
    "bidirectional": [{"bidirectional": True}, {"bidirectional": True, "num_layers": 2}],
}
#: a user's encoder and decoder for nn.Transformer (d_model 4, the simple size; nhead 2)
CUSTOM_ENCODER = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(4, 2, 8, 0.0, batch_first=True), 1, enable_nested_tensor=False
)
CUSTOM_DECODER = nn.TransformerDecoder(
    nn.TransformerDecoderLayer(4, 2, 8, 0.0, batch_first=True), 1
)
#: the settings of the layers made with lazynn.lazy, by eager class (with the simple size 4)
ALTERNATIVES: dict[type[nn.Module], Settings] = {
    nn.GroupNorm: {
        "num_groups": [{"num_groups": 2}, {"num_groups": 4}],
        "eps": [{"eps": 1e-3}],
        "affine": [{"affine": False}],
        "bias": [{"bias": False}, {"bias": False, "affine": False}],
    },
    nn.PReLU: {"init": [{"init": 0.1}, {"init": -1.0}]},
    # process_group: None is the only value without an initialized process group
    nn.SyncBatchNorm: {**NORM, "process_group": [{"process_group": None}]},
    nn.RNNCell: {
        "hidden_size": [{"hidden_size": 5}],
        "bias": [{"bias": False}],
        "nonlinearity": [{"nonlinearity": "relu"}, {"nonlinearity": "tanh"}],
    },
    nn.GRUCell: {"hidden_size": [{"hidden_size": 5}], "bias": [{"bias": False}]},
    nn.LayerNorm: {
        "eps": [{"eps": 1e-3}],
        "elementwise_affine": [{"elementwise_affine": False}],
        "bias": [{"bias": False}],
    },
    nn.RMSNorm: {"eps": [{"eps": 1e-3}], "elementwise_affine": [{"elementwise_affine": False}]},
    nn.TransformerEncoderLayer: TRANSFORMER_LAYER,
    nn.TransformerDecoderLayer: TRANSFORMER_LAYER,
    nn.RNN: {**RECURRENT, "nonlinearity": [{"nonlinearity": "relu"}, {"nonlinearity": "tanh"}]},
    nn.LSTM: {**RECURRENT, "proj_size": [{"proj_size": 2}]},
    nn.GRU: RECURRENT,
    nn.LSTMCell: {"hidden_size": [{"hidden_size": 5}], "bias": [{"bias": False}]},
    nn.MultiheadAttention: {
        "num_heads": [{"num_heads": 2}, {"num_heads": 4}],
        "dropout": [{"dropout": 0.5}],
        "bias": [{"bias": False}],
        "add_bias_kv": [{"add_bias_kv": True}],
        "add_zero_attn": [{"add_zero_attn": True}],
        # declared: the key / value the row makes have those sizes
        "kdim": [{"kdim": 6}, {"kdim": 2}],
        "vdim": [{"vdim": 3}, {"kdim": 6, "vdim": 2}],
        "batch_first": [{"batch_first": True}],
    },
    # (the simple options: batch_first=True; the others torch warns about are allowed in
    # these tests, see test_every_option_is_accepted)
    nn.Transformer: {
        "nhead": [{"nhead": 4}, {"nhead": 1}],
        "num_encoder_layers": [{"num_encoder_layers": 2}],
        "num_decoder_layers": [{"num_decoder_layers": 2}],
        "dim_feedforward": [{"dim_feedforward": 3}],
        "dropout": [{"dropout": 0.5}],
        "activation": [{"activation": "gelu"}, {"activation": F.gelu}],
        "custom_encoder": [{"custom_encoder": CUSTOM_ENCODER}],
        "custom_decoder": [{"custom_decoder": CUSTOM_DECODER}],
        "layer_norm_eps": [{"layer_norm_eps": 1e-3}],
        "batch_first": [{"batch_first": False}],
        "norm_first": [{"norm_first": True}],
        "bias": [{"bias": False}],
    },
    nn.Bilinear: {"out_features": [{"out_features": 5}], "bias": [{"bias": False}]},
    nn.AdaptiveLogSoftmaxWithLoss: {
        "n_classes": [{"n_classes": 12}],
        "cutoffs": [{"cutoffs": [2, 6]}, {"cutoffs": (1,)}],
        "div_value": [{"div_value": 4.0}],
        "head_bias": [{"head_bias": True}],
    },
    nn.LinearCrossEntropyLoss: {
        "num_classes": [{"num_classes": 3}],
        "out_features": [{"out_features": (2,)}, {"out_features": (2, 3)}],
        "bias": [{"bias": True}, {"bias": True, "out_features": (2,)}],
        "reduction": [{"reduction": "sum"}, {"reduction": "none"}],
        "weight": [{"weight": torch.rand(5, generator=torch.Generator().manual_seed(0))}],
        "ignore_index": [{"ignore_index": 0}],
        "label_smoothing": [{"label_smoothing": 0.2}],
        "options": [{"options": nn.LinearCrossEntropyOptions()}],
    },
}
for _ranked in lazynn.MaxPool.by_rank.values():
    ALTERNATIVES[_ranked] = {
        "kernel_size": [{"kernel_size": 3}],
        "stride": [{"stride": 1}, {"stride": 3}],
        "padding": [{"padding": 1}],
        "dilation": [{"dilation": 2}],
        "return_indices": [{"return_indices": True}],
        "ceil_mode": [{"ceil_mode": True, "stride": 3}],
    }
for _ranked in lazynn.AvgPool.by_rank.values():
    ALTERNATIVES[_ranked] = {
        "kernel_size": [{"kernel_size": 3}],
        "stride": [{"stride": 1}, {"stride": 3}],
        "padding": [{"padding": 1}],
        "ceil_mode": [{"ceil_mode": True, "stride": 3}],
        "count_include_pad": [{"count_include_pad": False, "padding": 1}],
    }
    if "divisor_override" in inspect.signature(_ranked).parameters:  # 2d and 3d
        ALTERNATIVES[_ranked]["divisor_override"] = [{"divisor_override": 3}]
for _ranked in (*lazynn.AdaptiveAvgPool.by_rank.values(), *lazynn.AdaptiveMaxPool.by_rank.values()):
    ALTERNATIVES[_ranked] = {"output_size": [{"output_size": 1}, {"output_size": 3}]}
    if "return_indices" in inspect.signature(_ranked).parameters:
        ALTERNATIVES[_ranked]["return_indices"] = [{"return_indices": True}]
for _ranked in lazynn.ChannelDropout.by_rank.values():
    ALTERNATIVES[_ranked] = {"p": [{"p": 0.5}, {"p": 1.0}], "inplace": [{"inplace": True}]}


def alternatives(row: Row) -> Settings:
    """For each eager option: settings that exercise it (other options they need included)."""
    names = inspect.signature(row.eager).parameters
    common = {k: v for k, v in COMMON.items() if k in names or "kwargs" in names}
    if row.eager in ALTERNATIVES:
        return {**common, **ALTERNATIVES[row.eager]}
    if kind(row) == "linear":
        return {**common, "out_features": [{"out_features": 5}], "bias": [{"bias": False}]}
    if kind(row) == "norm":
        return {**common, **NORM}
    n = rank(row)
    conv: Settings = {
        **common,
        "out_channels": [{"out_channels": 6}],
        "kernel_size": [{"kernel_size": 2}, {"kernel_size": tuple(range(1, n + 1))}],
        "stride": [{"stride": 2}, {"stride": (2,) + (1,) * (n - 1)}],
        "padding": [{"padding": 1}, {"padding": (1,) + (0,) * (n - 1)}],
        "dilation": [{"dilation": 2}],
        "groups": [{"groups": 2}, {"groups": 4, "out_channels": 8}],
        "bias": [{"bias": False}],
    }
    if kind(row) == "conv":
        conv["padding"] += [{"padding": "same"}, {"padding": "valid"}]
        conv["padding_mode"] = [
            {"padding_mode": mode, "padding": 1} for mode in ("reflect", "replicate", "circular")
        ]
    else:
        conv["output_padding"] = [
            {"output_padding": 1, "stride": 2},
            {"output_padding": 1, "dilation": 2},
        ]
        conv["padding_mode"] = [{"padding_mode": "zeros"}]  # the only one torch accepts
    return conv


def _cases() -> list[Any]:
    cases = []
    for row in ROWS:
        for option, settings in alternatives(row).items():
            for i, setting in enumerate(settings):
                cases.append(pytest.param(row, setting, id=f"{row.id}-{option}-{i}"))
    return cases


def test_alternatives_cover_every_eager_option(row: Row) -> None:
    eager = [n for n, _, _ in params(eager_signature(row.eager)) if n not in row.inferred_args]
    assert sorted(alternatives(row)) == sorted(eager)


def build_both(
    row: Row, options: dict[str, Any], positional: tuple[Any, ...] = ()
) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lazy built, eager twin, input, lazy output, eager output) under seed 0."""
    size = row.simple_size
    last = positional[-1] if positional else None
    dtype = options.get("dtype", last if isinstance(last, torch.dtype) else torch.float32)
    x = row.input(options, size).to(dtype)
    torch.manual_seed(0)
    lazy = row.lazy(*positional, **options)
    y_lazy = row.call(lazy, x)
    torch.manual_seed(0)
    if positional:
        arguments = eager_args(row, size, positional)
        if eager_signature(row.eager) != inspect.signature(row.eager):
            # nn.RNN / nn.GRU take (*args, **kwargs) and read positional arguments after
            # `bidirectional` as RNNBase's (proj_size first), not as their documented
            # signature says (device, dtype): by keyword, as documented
            bound = eager_signature(row.eager).bind(*arguments, **options)
            eager = row.eager(**bound.arguments)
        else:
            eager = row.eager(*arguments, **options)
    else:
        eager = row.new_eager(options, size)
    y_eager = row.call(eager, x)
    return lazy, eager, x, y_lazy, y_eager


# nn.Transformer warns that its encoder's nested-tensor fast path is off with some options
# (batch_first=False, norm_first, bias=False, an odd nhead): eager alike
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize(("row", "setting"), _cases())
def test_every_option_is_accepted(row: Row, setting: dict[str, Any]) -> None:
    options = {**row.simple, **setting}
    held = [k for k, v in setting.items() if isinstance(v, nn.Module) and list(v.parameters())]
    if held:  # a module of the user's (nn.Transformer's custom_encoder): refused, see below
        with pytest.raises(lazynn.LazynnError, match=rf"modules with parameters for {held[0]}"):
            row.lazy(**options)
        return
    lazy, eager, _, y_lazy, y_eager = build_both(row, options)
    assert torch.equal(y_lazy, y_eager)
    assert_same_module(lazy, eager)


def test_batch_norm_without_bias() -> None:
    x = torch.randn(4, 3, 2, 2)
    torch.manual_seed(0)
    layer = lazynn.LazyBatchNorm2d(bias=False)
    assert "bias=False" in repr(layer)
    y = layer(x)
    torch.manual_seed(0)
    eager = nn.BatchNorm2d(3, bias=False)
    assert type(layer) is nn.BatchNorm2d
    assert layer.bias is None
    assert layer.weight is not None
    assert "bias" not in layer.state_dict()
    assert torch.equal(y, eager(x))
    assert_same_module(layer, eager)


#: positional_options of the layers made with lazynn.lazy, and of the rank-agnostic pools
#: and Dropout, by eager class
POSITIONAL: dict[type[nn.Module], tuple[Any, ...]] = {
    # num_groups, eps, affine (bias is keyword-only)
    nn.GroupNorm: (2, 1e-3, False, "cpu", torch.float64),
    # init
    nn.PReLU: (0.1, "cpu", torch.float64),
    # eps, momentum, affine, track_running_stats, process_group (None: see ALTERNATIVES)
    nn.SyncBatchNorm: (1e-3, None, False, True, None, "cpu", torch.float64),
    # hidden_size, bias, nonlinearity
    nn.RNNCell: (5, False, "relu", "cpu", torch.float64),
    # hidden_size, bias
    nn.GRUCell: (5, False, "cpu", torch.float64),
    # eps, elementwise_affine, bias
    nn.LayerNorm: (1e-3, False, False, "cpu", torch.float64),
    # eps, elementwise_affine
    nn.RMSNorm: (1e-3, False, "cpu", torch.float64),
    # nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
    # bias
    nn.TransformerEncoderLayer: (2, 6, 0.0, "gelu", 1e-3, True, True, False, "cpu", torch.float64),
    # the same, for the decoder layer
    nn.TransformerDecoderLayer: (2, 6, 0.0, "gelu", 1e-3, True, True, False, "cpu", torch.float64),
    # hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional
    nn.RNN: (5, 2, "relu", False, True, 0.5, True, "cpu", torch.float64),
    # hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size
    nn.LSTM: (5, 2, False, True, 0.5, True, 3, "cpu", torch.float64),
    # hidden_size, num_layers, bias, batch_first, dropout, bidirectional
    nn.GRU: (5, 2, False, True, 0.5, True, "cpu", torch.float64),
    # hidden_size, bias
    nn.LSTMCell: (5, False, "cpu", torch.float64),
    # num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first
    nn.MultiheadAttention: (2, 0.5, False, True, True, 6, 5, True, "cpu", torch.float64),
    # nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout, activation,
    # custom_encoder, custom_decoder (None: see ALTERNATIVES), layer_norm_eps, batch_first,
    # norm_first, bias
    nn.Transformer: (
        4,
        2,
        1,
        6,
        0.5,
        "gelu",
        None,
        None,
        1e-3,
        True,
        True,
        False,
        "cpu",
        torch.float64,
    ),
    # out_features, bias
    nn.Bilinear: (5, False, "cpu", torch.float64),
    # n_classes, cutoffs, div_value, head_bias
    nn.AdaptiveLogSoftmaxWithLoss: (10, [3, 6], 2.0, True, "cpu", torch.float64),
    # num_classes (the others are keyword-only)
    nn.LinearCrossEntropyLoss: (3,),
}
for _ranked in lazynn.MaxPool.by_rank.values():
    # kernel_size, stride, padding, dilation, return_indices, ceil_mode
    POSITIONAL[_ranked] = (3, 2, 1, 2, True, True)
for _ranked in lazynn.AvgPool.by_rank.values():
    # kernel_size, stride, padding, ceil_mode, count_include_pad (, divisor_override: 2d, 3d)
    POSITIONAL[_ranked] = (3, 2, 1, True, False)
    if "divisor_override" in inspect.signature(_ranked).parameters:
        POSITIONAL[_ranked] += (2,)
for _ranked in lazynn.AdaptiveAvgPool.by_rank.values():
    POSITIONAL[_ranked] = (3,)  # output_size
for _ranked in lazynn.AdaptiveMaxPool.by_rank.values():
    POSITIONAL[_ranked] = (3, True)  # output_size, return_indices
for _ranked in lazynn.ChannelDropout.by_rank.values():
    POSITIONAL[_ranked] = (0.25, True)  # p, inplace
#: where an option lands when the eager class keeps no attribute of its name
_TRANSFORMER_LAYER_READERS = {
    "nhead": lambda m: m.self_attn.num_heads,
    "dim_feedforward": lambda m: m.linear1.out_features,
    "dropout": lambda m: m.dropout.p,
    "activation": lambda m: m.activation.__name__,  # the name gives the function
    "layer_norm_eps": lambda m: m.norm1.eps,
    "batch_first": lambda m: m.self_attn.batch_first,
}
READERS: dict[type[nn.Module], dict[str, Any]] = {
    nn.TransformerEncoderLayer: _TRANSFORMER_LAYER_READERS,
    nn.TransformerDecoderLayer: _TRANSFORMER_LAYER_READERS,
    nn.MultiheadAttention: {"add_bias_kv": lambda m: m.bias_k is not None},
    nn.Transformer: {
        "num_encoder_layers": lambda m: len(m.encoder.layers),
        "num_decoder_layers": lambda m: len(m.decoder.layers),
        "dim_feedforward": lambda m: m.encoder.layers[0].linear1.out_features,
        "dropout": lambda m: m.encoder.layers[0].dropout.p,
        "activation": lambda m: m.encoder.layers[0].activation.__name__,
        # None: the default encoder / decoder, not a user's
        "custom_encoder": lambda m: None if type(m.encoder) is nn.TransformerEncoder else m,
        "custom_decoder": lambda m: None if type(m.decoder) is nn.TransformerDecoder else m,
        "layer_norm_eps": lambda m: m.encoder.norm.eps,
        "norm_first": lambda m: m.encoder.layers[0].norm_first,
    },
    nn.AdaptiveLogSoftmaxWithLoss: {"cutoffs": lambda m: m.cutoffs[:-1]},  # n_classes ends it
}


def positional_options(row: Row) -> tuple[Any, ...]:
    """A value for every positional option, in the eager signature's order: non-default
    where the layer allows, and distinct between neighbours, so a swap would show."""
    if row.eager in POSITIONAL:
        return POSITIONAL[row.eager]
    if kind(row) == "linear":
        return (5, False, "cpu", torch.float64)
    if kind(row) == "conv":
        # out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode
        padding = (2,) * rank(row)
        return (8, 1, 3, padding, 4, 2, False, "replicate", "cpu", torch.float64)
    if kind(row) == "conv_transpose":
        # out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation,
        # padding_mode (only "zeros" exists)
        return (8, 6, 3, 1, 2, 4, False, 5, "zeros", "cpu", torch.float64)
    default = inspect.signature(row.eager).parameters["affine"].default
    # eps, momentum, affine (non-default), track_running_stats (default: differs from affine)
    return (1e-3, None, not default, default, "cpu", torch.float64)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # see above
def test_every_option_is_accepted_by_position(row: Row) -> None:
    positional = positional_options(row)
    signature = params(inspect.signature(row.lazy))
    names = [n for n, k, _ in signature if k is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if row.agnostic:  # options of another rank's class only (AvgPool's divisor_override) last
        eager_names = set(inspect.signature(row.eager).parameters)
        names = [n for n in names if n in eager_names]
    assert len(positional) == len(names)
    # a dtype the layer takes by keyword only (LinearCrossEntropyLoss), by keyword
    keywords = {n: torch.float64 for n, k, _ in signature if n == "dtype" and k is k.KEYWORD_ONLY}
    lazy, eager, x, y_lazy, y_eager = build_both(row, keywords, positional)
    if any(n == "dtype" for n, _, _ in signature):  # (the pools and ChannelDropout take none)
        assert x.dtype == torch.float64
    assert torch.equal(y_lazy, y_eager)
    assert_same_module(lazy, eager)
    # ...and each positional value landed where its name says.
    for name, value in zip(names, positional, strict=True):
        if name in ("device", "dtype", "bias"):
            continue  # not kept as attributes (bias: a parameter or None)
        read = READERS.get(row.eager, {}).get(name, lambda m, name=name: getattr(m, name))
        attribute = read(lazy)
        if isinstance(attribute, tuple) and not isinstance(value, tuple):
            value = (value,) * len(attribute)  # as torch stores a convolution's ints
        assert attribute == value, name
        assert read(eager) == value, name


@pytest.mark.parametrize(
    "row", [r for r in ROWS if kind(r) == "conv_transpose"], ids=lambda r: r.id
)
def test_transposed_padding_mode_refused_alike(row: Row) -> None:
    with pytest.raises(ValueError, match="zeros") as eager_error:
        row.eager(4, **row.simple, padding_mode="reflect")
    with pytest.raises(ValueError, match="zeros") as lazy_error:
        row.lazy(**row.simple, padding_mode="reflect")
    # The same message, naming the class the user constructed.
    eager_name, lazy_name = row.eager.__name__, row.lazy.__name__
    assert str(lazy_error.value) == str(eager_error.value).replace(eager_name, lazy_name)
