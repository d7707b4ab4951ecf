"""lazynn.lazy(): any module class made lazy in one line, with lazynn's guarantees."""

from __future__ import annotations

import copy
import inspect
import io
import pickle

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module


class Gate(nn.Module):
    """y = sigmoid(x @ w + b) * x: x (*, features) -> y (*, features); takes device/dtype."""

    def __init__(self, features: int, scale: float = 1.0, device=None, dtype=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.features = features
        self.scale = scale
        self.weight = nn.Parameter(torch.randn(features, features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x @ self.weight + self.bias) * x * self.scale


class Plain(nn.Module):
    """A module with no device/dtype arguments: x (*, width) -> (*, out)."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.width = width
        self.proj = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


LazyGate = lazynn.lazy(Gate, features=lazynn.Infer(dim=-1))
LazyPlain = lazynn.lazy(Plain, width=lazynn.Infer(dim=-1))


@pytest.mark.parametrize(
    ("lazy", "eager", "kwargs"),
    [
        (LazyGate, Gate, {"scale": 2.0}),
        (LazyPlain, Plain, {"out": 3}),
    ],
    ids=["factory-kwargs", "no-factory-kwargs"],
)
def test_lazy_class_equals_eager_after_first_call(lazy, eager, kwargs) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(4, 5)
    torch.manual_seed(0)
    layer = lazy(**kwargs)
    assert lazynn.is_lazy(layer)
    assert all(lazynn.is_lazy(p) for p in layer.parameters())
    y = layer(x)
    torch.manual_seed(0)
    twin = eager(5, **kwargs)
    assert_same_module(layer, twin)
    assert torch.equal(y, twin(x))
    assert not layer._forward_pre_hooks


def test_signature_is_the_eager_one_without_the_inferred_argument() -> None:
    eager = list(inspect.signature(Gate).parameters.values())
    lazy = list(inspect.signature(LazyGate).parameters.values())
    assert [p for p in eager if p.name != "features"] == lazy
    assert LazyGate.__name__ == "LazyGate"
    assert LazyGate.cls_to_become is Gate


def test_unbuilt_copies_pickles_and_checkpoints() -> None:
    layer = LazyGate(scale=3.0).double()
    clone = copy.deepcopy(layer)
    loaded = pickle.loads(pickle.dumps(layer))
    for other in (clone, loaded):
        assert lazynn.is_lazy(other)
        assert other.weight.dtype == torch.float64
    clone(torch.randn(2, 4, dtype=torch.float64))
    assert lazynn.is_lazy(layer)
    assert clone.features == 4
    buffer = io.BytesIO()
    torch.save(clone.state_dict(), buffer)
    buffer.seek(0)
    target = LazyGate(scale=3.0).double()
    target.load_state_dict(torch.load(buffer))
    assert_same_module(target, clone)


def test_bad_input_leaves_it_unbuilt_and_names_it() -> None:
    model = nn.Sequential(LazyGate())
    with pytest.raises(lazynn.InferenceError, match=r"LazyGate at '0'") as info:
        model(torch.randn(2, 3, device="meta"))
    assert "Fix:" in str(info.value)
    assert lazynn.is_lazy(model[0])
    model(torch.randn(2, 3))
    assert model[0].features == 3


def test_meta_build_and_materialize() -> None:
    torch.manual_seed(0)
    model = lazynn.build(nn.Sequential(LazyPlain(out=2), nn.ReLU()), (3, 6), device="meta")
    lazynn.materialize(model)
    torch.manual_seed(0)
    assert_same_module(model[0], Plain(6, 2))
    # Gate has no reset_parameters(): a lazy Gate is constructed as Gate(...) constructs,
    torch.manual_seed(0)
    gated = lazynn.build(nn.Sequential(LazyGate(scale=2.0)), (3, 6), device="meta")
    lazynn.materialize(gated)
    torch.manual_seed(0)
    assert_same_module(gated[0], Gate(6, scale=2.0))
    # but an eager Gate made on meta cannot be initialized, and materialize says so.
    with torch.device("meta"):
        eager_on_meta = Gate(6)
    with pytest.warns(UserWarning, match="'1' initializes outside reset_parameters"):
        mixed = lazynn.build(nn.Sequential(LazyPlain(out=6), eager_on_meta), (3, 6), device="meta")
    with pytest.raises(lazynn.LazynnError, match=r"'1' without one"):
        lazynn.materialize(mixed)


def test_a_torch_layer_in_one_line() -> None:
    LazyGroupNorm = lazynn.lazy(nn.GroupNorm, num_channels=lazynn.Infer(dim=1, probe="num_groups"))
    x = torch.randn(2, 6, 5)
    torch.manual_seed(0)
    layer = LazyGroupNorm(3, affine=True)
    y = layer(x)
    torch.manual_seed(0)
    eager = nn.GroupNorm(3, 6, affine=True)
    assert_same_module(layer, eager)
    assert torch.equal(y, eager(x))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "text"),
    [
        ((int,), {"x": lazynn.Infer()}, TypeError, "expected an nn.Module subclass"),
        ((Gate,), {}, ValueError, "expected the constructor arguments to infer"),
        ((Gate,), {"width": lazynn.Infer()}, ValueError, "unknown \\['width'\\]"),
        ((nn.LSTM,), {"input_size": lazynn.Infer()}, ValueError, "cannot see"),
        ((Gate,), {"features": -1}, TypeError, "expected features= a lazynn.Infer"),
    ],
)
def test_declaration_errors(args, kwargs, error, text) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=text) as info:
        lazynn.lazy(*args, **kwargs)
    assert isinstance(info.value, lazynn.ArgumentError)  # (lazynn's family, and torch's types)
    assert " Fix: " in str(info.value)


class SamePadConv(nn.Conv2d):
    """The shape of third-party conv subclasses (efficientnet-pytorch's
    Conv2dStaticSamePadding): its own arguments, then **kwargs passed on to nn.Conv2d."""

    def __init__(self, in_channels, out_channels, kernel_size, image_size=None, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(in_channels, out_channels, kernel_size, **kwargs)
        self.image_size = image_size


def test_a_class_taking_keyword_arguments_is_made_lazy_with_them_passed_on() -> None:
    LazySamePadConv = lazynn.lazy(SamePadConv, in_channels=lazynn.Infer(dim=1))
    x = torch.randn(1, 3, 8, 8)
    torch.manual_seed(0)
    layer = LazySamePadConv(out_channels=4, kernel_size=3, image_size=8, stride=2, bias=False)
    y = layer(x)
    torch.manual_seed(0)
    eager = SamePadConv(3, 4, 3, image_size=8, stride=2, bias=False)
    assert_same_module(layer, eager)
    assert torch.equal(y, eager(x))
    assert layer.stride == (2, 2)
    assert layer.bias is None
