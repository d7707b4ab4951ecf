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
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazynn
from registry import ROWS, Row

_MODULE_KEYS = frozenset(nn.Module().__dict__)


def params(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter: the signature without annotations."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def kind(row: Row) -> str:
    name = row.lazy.__name__
    if "Transpose" in name:
        return "conv_transpose"
    if "Conv" in name:
        return "conv"
    if "Norm" in name:
        return "norm"
    return "linear"


def rank(row: Row) -> int:
    """The number of spatial dimensions of a convolution row (1, 2 or 3)."""
    return int(row.lazy.__name__[-2])


# --- 10. signatures ---------------------------------------------------------------------------


#: where the inferred argument sits in the eager signature, when not first
#: (``GroupNorm(num_groups, num_channels)``)
INFERRED_POSITION: dict[type[nn.Module], int] = {nn.GroupNorm: 1}


def eager_args(row: Row, size: int, positional: tuple[Any, ...]) -> tuple[Any, ...]:
    """The eager class's positional arguments: the lazy ones with the size in its place."""
    position = INFERRED_POSITION.get(row.eager, 0)
    return (*positional[:position], size, *positional[position:])


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
    eager = params(inspect.signature(row.eager))
    # the inferred argument comes first in torch.nn, except where the table says
    assert eager[INFERRED_POSITION.get(row.eager, 0)][0] == row.inferred
    expected = [p for p in eager if p[0] != row.inferred]
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
}


def test_signature_matches_torchs_own_lazy_class(row: Row) -> None:
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
    nn.TransformerEncoderLayer: {
        "nhead": [{"nhead": 2}, {"nhead": 4}],
        "dim_feedforward": [{"dim_feedforward": 3}],
        # in train mode: both twins draw the same dropout masks after the same init
        "dropout": [{"dropout": 0.5}],
        "activation": [{"activation": "gelu"}, {"activation": F.gelu}, {"activation": nn.Tanh()}],
        "layer_norm_eps": [{"layer_norm_eps": 1e-3}],
        "batch_first": [{"batch_first": True}],
        "norm_first": [{"norm_first": True}],
        "bias": [{"bias": False}],
    },
}


def alternatives(row: Row) -> Settings:
    """For each eager option: settings that exercise it (other options they need included)."""
    common = COMMON
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
    eager = [n for n, _, _ in params(inspect.signature(row.eager)) if n != row.inferred]
    assert sorted(alternatives(row)) == sorted(eager)


def assert_same_layer(lazy: nn.Module, eager: nn.Module) -> None:
    assert type(lazy) is type(eager)
    assert not lazynn.is_lazy(lazy)
    assert not lazy._forward_pre_hooks
    assert repr(lazy) == repr(eager)
    assert vars(lazy).keys() == vars(eager).keys()
    for key, value in vars(eager).items():
        if key not in _MODULE_KEYS:
            assert vars(lazy)[key] == value, key
    ls, es = lazy.state_dict(), eager.state_dict()
    assert list(ls) == list(es)
    for key in es:
        assert type(ls[key]) is type(es[key]), key
        assert ls[key].dtype == es[key].dtype, key
        assert torch.equal(ls[key], es[key]), key
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert type(p) is nn.Parameter, name
        assert p.requires_grad == q.requires_grad, name


def build_both(
    row: Row, options: dict[str, Any], positional: tuple[Any, ...] = ()
) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lazy built, eager twin, input, lazy output, eager output) under seed 0."""
    size = row.simple_size
    dtype = options.get("dtype", positional[-1] if positional else torch.float32)
    x = row.input(options, size).to(dtype)
    torch.manual_seed(0)
    lazy = row.lazy(*positional, **options)
    y_lazy = lazy(x)
    torch.manual_seed(0)
    if positional:
        eager = row.eager(*eager_args(row, size, positional), **options)
    else:
        eager = row.eager(**{row.inferred: size}, **options)
    y_eager = eager(x)
    return lazy, eager, x, y_lazy, y_eager


@pytest.mark.parametrize(("row", "setting"), _cases())
def test_every_option_is_accepted(row: Row, setting: dict[str, Any]) -> None:
    options = {**row.simple, **setting}
    lazy, eager, _, y_lazy, y_eager = build_both(row, options)
    assert torch.equal(y_lazy, y_eager)
    assert_same_layer(lazy, eager)


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
    assert_same_layer(layer, eager)


#: positional_options of the layers made with lazynn.lazy, by eager class
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
    nn.TransformerEncoderLayer: (2, 6, 0.0, "gelu", 1e-3, True, True, False, "cpu",
                                 torch.float64),
}
#: where an option lands when the eager class keeps no attribute of its name
READERS: dict[type[nn.Module], dict[str, Any]] = {
    nn.TransformerEncoderLayer: {
        "nhead": lambda m: m.self_attn.num_heads,
        "dim_feedforward": lambda m: m.linear1.out_features,
        "dropout": lambda m: m.dropout.p,
        "activation": lambda m: m.activation.__name__,  # the name gives the function
        "layer_norm_eps": lambda m: m.norm1.eps,
        "batch_first": lambda m: m.self_attn.batch_first,
    },
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


def test_every_option_is_accepted_by_position(row: Row) -> None:
    positional = positional_options(row)
    names = [
        n
        for n, k, _ in params(inspect.signature(row.lazy))
        if k is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    assert len(positional) == len(names)
    lazy, eager, x, y_lazy, y_eager = build_both(row, {}, positional)
    assert x.dtype == torch.float64
    assert torch.equal(y_lazy, y_eager)
    assert_same_layer(lazy, eager)
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
