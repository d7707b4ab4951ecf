"""A half-ported line, its input size left in, is refused; a legitimate line still works.

Spec (issue 26, "the newcomer's next hour"): porting deletes the input size from a sized
constructor (``nn.Linear(768, 3072)`` -> ``lazynn.LazyLinear(3072)``). A line whose size was
left in reads every argument one place off, which torch accepts silently
(``LazyLinear(768, 3072)``: 768 outputs and ``bias=3072``). lazynn refuses, at construction,
arguments that contradict the eager signature's types, with a ``lazynn.ArgumentError`` (also a
``TypeError`` and a ``ValueError``) that names the line meant:

* a number other than 0 and 1 for a bool parameter (0 and 1, bools, numpy's bools pass: code
  that works with torch works with lazynn);
* an int of 1 or more for an ``eps`` (or ``*_eps``) or a ``momentum``.

Every lazy layer goes through the check: torch.nn's families, the rank-agnostic layers and the
classes ``lazynn.lazy`` makes. A left-in size no type contradicts (``LazyConv2d(3, 64)``) is
noted where the first call fails, when the value in the inferred position is the size the
input gives: in the first call's error, ``lazynn.build``'s and the summary's.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import lazynn
from registry import ROWS, Row


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d`` signature (``timm/layers/norm_act.py``): a BatchNorm2d with its
    activation inside."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        apply_act: bool = True,
        act_layer: type[nn.Module] = nn.ReLU,
        inplace: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.act = act_layer(inplace=inplace) if apply_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(x))  # type: ignore[no-any-return]


LazyBatchNormAct2d = lazynn.lazy(BatchNormAct2d, num_features=lazynn.Infer(dim=1))


class Unannotated(nn.Module):
    """A user's block that annotates nothing: its defaults say which parameters are bools."""

    def __init__(self, features, scale=False, eps=1e-6):  # type: ignore[no-untyped-def]
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.scale, self.eps = scale, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Counting(nn.Module):
    """A user's block whose ``eps`` is a count and whose ``pool`` is a bool or a size: their
    annotations say so, and lazynn takes any int for them."""

    def __init__(self, features: int, pool: bool | int = False, eps: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.pool, self.eps = pool, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


LazyUnannotated = lazynn.lazy(Unannotated, features=lazynn.Infer(dim=-1))
LazyCounting = lazynn.lazy(Counting, features=lazynn.Infer(dim=-1))


# --- the examples of the issue, and their messages -----------------------------------------------

#: id -> (the half-ported line, what its message says)
HALF_PORTED: dict[str, tuple[Callable[[], nn.Module], list[str]]] = {
    "LazyLinear(768, 3072)": (
        lambda: lazynn.LazyLinear(768, 3072),
        [
            "LazyLinear: expected bias to be a bool, as in nn.Linear, received 3072.",
            "Note: an input size left in? LazyLinear(768, 3072) reads as out_features=768, "
            "bias=3072.",
            "Fix: delete the input size, which lazynn infers: LazyLinear(3072); or pass "
            "bias=True or bias=False",
        ],
    ),
    "LazyBatchNorm2d(64)": (
        lambda: lazynn.LazyBatchNorm2d(64),
        [
            "LazyBatchNorm2d: expected eps to be a float below 1, as in nn.BatchNorm2d, "
            "received 64.",
            "LazyBatchNorm2d(64) reads as eps=64.",
            "Fix: delete the input size, which lazynn infers: LazyBatchNorm2d(); or if eps=64 "
            "is meant, pass it as a float (64.0)",
        ],
    ),
    "lazy(BatchNormAct2d)(48)": (
        lambda: LazyBatchNormAct2d(48),
        ["expected eps to be a float below 1, as in BatchNormAct2d", "LazyBatchNormAct2d()"],
    ),
    "its other arguments kept": (
        lambda: lazynn.LazyBatchNorm1d(64, 1e-3, affine=False),
        ["LazyBatchNorm1d(64, ...) reads as eps=64", "lazynn infers: LazyBatchNorm1d(...);"],
    ),
    "the size in second place (GroupNorm)": (
        lambda: lazynn.LazyGroupNorm(32, 256),
        ["reads as num_groups=32, eps=256", "lazynn infers: LazyGroupNorm(32);"],
    ),
    "a recurrent layer (nn.LSTM takes *args)": (
        lambda: lazynn.LazyLSTM(128, 256, 2),
        ["expected bias to be a bool, as in nn.LSTM", "lazynn infers: LazyLSTM(256, 2);"],
    ),
    "two sizes left in (Bilinear)": (
        lambda: lazynn.LazyBilinear(10, 20),
        ["LazyBilinear(10, 20) reads as out_features=10, bias=20", "delete the input sizes"],
    ),
    "a rank-agnostic layer": (
        lambda: lazynn.BatchNorm(64),
        [
            "BatchNorm: expected eps to be a float below 1, as in nn.BatchNorm1d/2d/3d",
            "BatchNorm()",
        ],
    ),
    "a bool of a layer that infers no size": (
        lambda: lazynn.MaxPool(2, 2, 0, 1, 7),
        ["MaxPool: expected return_indices to be a bool", "Fix: pass return_indices=True or"],
    ),
    "a bool of an unannotated class, by its default": (
        lambda: LazyUnannotated(2),
        ["expected scale to be a bool, as in Unannotated, received 2", "LazyUnannotated()"],
    ),
    "a layer_norm_eps": (
        lambda: lazynn.LazyTransformerEncoderLayer(8, layer_norm_eps=5),
        ["expected layer_norm_eps to be a float below 1"],
    ),
    "a momentum": (
        lambda: lazynn.LazyBatchNorm2d(momentum=np.int64(2)),
        ["expected momentum to be a float below 1", "received np.int64(2)"],
    ),
}


@pytest.mark.parametrize("case", list(HALF_PORTED))
def test_a_half_ported_line_is_refused_naming_the_line_meant(case: str) -> None:
    make, fragments = HALF_PORTED[case]
    with pytest.raises(lazynn.ArgumentError) as caught:
        make()
    text = str(caught.value)
    for fragment in fragments:
        assert fragment in text
    assert "\n" not in text
    assert caught.value.parts is not None  # (in parts, as every lazynn error)


def test_the_refusal_is_caught_as_a_type_error_a_value_error_and_a_lazynn_error() -> None:
    for family in (TypeError, ValueError, lazynn.LazynnError):
        with pytest.raises(family):
            lazynn.LazyLinear(768, 3072)


def test_a_refusal_inside_a_model_constructs_nothing_of_it() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = lazynn.LazyLinear(3072)
            self.fc2 = lazynn.LazyLinear(3072, 768)  # half-ported

    x = torch.randn(2, 768)
    before = torch.get_rng_state()
    with pytest.raises(lazynn.ArgumentError, match=re.escape("LazyLinear(3072, 768) reads as")):
        Net()
    with pytest.raises(lazynn.ArgumentError):
        lazynn.build(Net, x)
    assert torch.equal(torch.get_rng_state(), before)


# --- over the registry: every lazy layer goes through the check -------------------------------


def annotated(row: Row, kinds: tuple[Any, ...]) -> list[str]:
    """The parameters of the row's lazy class annotated as one of ``kinds``."""
    return [
        p.name
        for p in inspect.signature(row.lazy).parameters.values()
        if p.annotation in kinds and p.name not in row.simple
    ]


BOOLS = [(row, name) for row in ROWS for name in annotated(row, (bool, "bool"))]
FRACTIONS = [
    (row, name)
    for row in ROWS
    for name in annotated(row, (float, "float", float | None, "float | None"))
    if name in ("eps", "momentum") or name.endswith("_eps")
]


def pair_id(pair: tuple[Row, str]) -> str:
    return f"{pair[0].id}-{pair[1]}"


def test_every_kind_of_layer_has_a_bool_and_a_fraction_tested() -> None:
    assert len({row.id for row, _ in BOOLS}) >= 30
    assert {name for _, name in FRACTIONS} >= {"eps", "momentum", "layer_norm_eps"}


@pytest.mark.parametrize(("row", "name"), BOOLS, ids=list(map(pair_id, BOOLS)))
@settings(max_examples=15, deadline=None)
@given(value=st.integers().filter(lambda v: v not in (0, 1)) | st.floats(0.01, 0.99))
def test_a_number_for_a_bool_parameter_is_refused(row: Row, name: str, value: float) -> None:
    with pytest.raises(lazynn.ArgumentError, match=rf"expected {name} to be a bool"):
        row.lazy(**{**row.simple, name: value})


@pytest.mark.parametrize(("row", "name"), BOOLS, ids=list(map(pair_id, BOOLS)))
@pytest.mark.parametrize("value", [True, False, 0, 1, np.bool_(True), np.bool_(False), 1.0])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")  # (nn.Transformer)
def test_a_bool_parameter_takes_what_its_eager_class_takes(row: Row, name: str, value: Any) -> None:
    # (nn.RNN/LSTM/GRU refuse any bias or batch_first but a bool, with a TypeError of their own)
    try:
        row.new_eager(row.simple, row.simple_size, **{name: value})
    except TypeError as refused:
        with pytest.raises(TypeError, match=re.escape(str(refused))):
            row.lazy(**{**row.simple, name: value})
    else:
        assert lazynn.is_lazy(row.lazy(**{**row.simple, name: value}))


@pytest.mark.parametrize(("row", "name"), FRACTIONS, ids=list(map(pair_id, FRACTIONS)))
@settings(max_examples=15, deadline=None)
@given(value=st.integers(1, 10**6))
def test_an_int_of_one_or_more_for_a_fraction_is_refused(row: Row, name: str, value: int) -> None:
    with pytest.raises(lazynn.ArgumentError, match=rf"expected {name} to be a float below 1"):
        row.lazy(**{**row.simple, name: value})


@pytest.mark.parametrize(("row", "name"), FRACTIONS, ids=list(map(pair_id, FRACTIONS)))
@settings(max_examples=15, deadline=None)
@given(value=st.floats(1e-12, 1e3) | st.just(0) | st.just(0.0))
def test_a_float_fraction_is_taken_as_written(row: Row, name: str, value: float) -> None:
    # (an eps of 64.0 is odd but deliberate: written as a float, it is no left-in size)
    layer = row.lazy(**{**row.simple, name: value})
    assert lazynn.is_lazy(layer)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_every_row_still_constructs_with_its_options(row: Row, data: st.DataObject) -> None:
    options = data.draw(row.options)
    assert lazynn.is_lazy(row.lazy(**options))
    assert lazynn.is_lazy(row.lazy(**row.simple))


def test_momentum_none_and_legitimate_arguments_construct() -> None:
    for make in (
        lambda: lazynn.LazyBatchNorm2d(momentum=None),
        lambda: lazynn.LazyBatchNorm2d(1e-5, 0.1, True, True),
        lambda: lazynn.LazyLinear(10, bias=False),
        lambda: lazynn.LazyConv2d(16, 3, 1, 1, 1, 1, True),
        lambda: lazynn.LazyLSTM(16, 2, True, True, 0.0, True),
        lambda: LazyCounting(pool=7, eps=12),  # annotated as no bool, no float: any int
        lambda: LazyUnannotated(scale=True, eps=1e-3),
    ):
        assert lazynn.is_lazy(make())


def test_an_int_bool_builds_what_torch_builds() -> None:
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(3, bias=0)
    layer(torch.ones(2, 4))
    torch.manual_seed(0)
    eager = nn.Linear(4, 3, bias=False)
    assert layer.bias is None
    assert torch.equal(layer.weight, eager.weight)


# --- a left-in size no type contradicts: noted where the first call fails ---------------------


def first_call(model: nn.Module, x: torch.Tensor) -> str:
    with pytest.raises(lazynn.InferenceError) as caught:
        model(x)
    return str(caught.value)


def through_build(model: nn.Module, x: torch.Tensor) -> str:
    with pytest.raises(lazynn.InferenceError) as caught:
        lazynn.build(model, x)
    return str(caught.value)


def through_summary(model: nn.Module, x: torch.Tensor) -> str:
    with pytest.raises(lazynn.InferenceError) as caught:
        lazynn.summary(model, x)
    return str(caught.value)


def on_meta(model: nn.Module, x: torch.Tensor) -> str:
    return first_call(model.to("meta"), x.to("meta"))


DOORS = [first_call, through_build, through_summary, on_meta]


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.__name__)
def test_a_kernel_larger_than_the_input_names_the_left_in_size(
    door: Callable[[nn.Module, torch.Tensor], str],
) -> None:
    model = nn.Sequential(lazynn.LazyConv2d(3, 64))  # nn.Conv2d(3, 64, ...), half-ported
    text = door(model, torch.randn(1, 3, 32, 32))
    assert "Kernel size can't be greater than actual input size" in text  # torch's words
    assert (
        "Note: an input size left in? LazyConv2d(3, 64) reads as out_channels=3, "
        "kernel_size=64, and the input gives in_channels=3; a port deletes the input size: "
        "LazyConv2d(64, ...)."
    ) in text
    assert lazynn.is_lazy(model)


@pytest.mark.parametrize(
    ("make", "x", "note"),
    [
        (
            lambda: lazynn.Conv(3, 64, 3),
            torch.randn(1, 3, 32, 32),
            "Conv(3, 64, ...) reads as out_channels=3, kernel_size=64, and the input gives "
            "in_channels=3; a port deletes the input size: Conv(64, ...)",
        ),
        (
            lambda: lazynn.LazyMultiheadAttention(512, 8),
            torch.randn(2, 5, 512),
            "LazyMultiheadAttention(512, ...) reads as num_heads=512, and the input gives "
            "embed_dim=512",
        ),
    ],
    ids=["rank-agnostic", "attention"],
)
def test_other_first_calls_a_left_in_size_explains(
    make: Callable[[], nn.Module], x: torch.Tensor, note: str
) -> None:
    layer = make()
    with pytest.raises(lazynn.InferenceError, match=re.escape(note)):
        layer(*((x, x, x) if isinstance(layer, nn.MultiheadAttention) else (x,)))


def test_a_first_call_no_left_in_size_explains_has_no_note() -> None:
    text = first_call(lazynn.LazyConv2d(4, 64), torch.randn(1, 3, 32, 32))  # 4 is no input size
    assert "Kernel size can't be greater" in text
    assert "Note:" not in text
