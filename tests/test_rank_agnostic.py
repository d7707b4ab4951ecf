"""Rank-agnostic layers: the first input's rank picks the 1d/2d/3d class, exactly."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import nn

import lazynn

# (agnostic class, constructor args, {batched rank: eager class}, eager inferred argument)
CASES: list[tuple[type[nn.Module], tuple[Any, ...], dict[int, type[nn.Module]], str | None]] = [
    (lazynn.Conv, (4, 3), {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}, "in_channels"),
    (lazynn.ConvTranspose, (4, 3),
     {3: nn.ConvTranspose1d, 4: nn.ConvTranspose2d, 5: nn.ConvTranspose3d}, "in_channels"),
    (lazynn.BatchNorm, (), {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d,
                            5: nn.BatchNorm3d}, "num_features"),
    (lazynn.InstanceNorm, (), {3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d,
                               5: nn.InstanceNorm3d}, "num_features"),
    (lazynn.MaxPool, (2,), {3: nn.MaxPool1d, 4: nn.MaxPool2d, 5: nn.MaxPool3d}, None),
    (lazynn.AvgPool, (2,), {3: nn.AvgPool1d, 4: nn.AvgPool2d, 5: nn.AvgPool3d}, None),
    (lazynn.AdaptiveAvgPool, (1,),
     {3: nn.AdaptiveAvgPool1d, 4: nn.AdaptiveAvgPool2d, 5: nn.AdaptiveAvgPool3d}, None),
    (lazynn.AdaptiveMaxPool, (2,),
     {3: nn.AdaptiveMaxPool1d, 4: nn.AdaptiveMaxPool2d, 5: nn.AdaptiveMaxPool3d}, None),
    (lazynn.Dropout, (0.5,), {3: nn.Dropout1d, 4: nn.Dropout2d, 5: nn.Dropout3d}, None),
]
IDS = [c[0].__name__ for c in CASES]


def _input(rank: int, channels: int) -> torch.Tensor:
    return torch.randn((2, channels) + (5,) * (rank - 2))


@pytest.mark.parametrize(("cls", "args", "by_rank", "inferred"), CASES, ids=IDS)
@settings(max_examples=10, deadline=None)
@given(data=st.data(), channels=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
       train=st.booleans())
def test_becomes_the_class_of_the_rank_bit_for_bit(cls, args, by_rank, inferred, data,  # type: ignore[no-untyped-def]
                                                   channels, seed, train) -> None:
    rank = data.draw(st.sampled_from(sorted(by_rank)), label="rank")
    x = _input(rank, channels)
    torch.manual_seed(seed)
    lazy = cls(*args).train(train)
    y = lazy(x)
    torch.manual_seed(seed)
    sizes = {inferred: channels} if inferred else {}
    eager = by_rank[rank](*(args[:0]), **sizes, **_kwargs(cls, args)).train(train)
    assert type(lazy) is by_rank[rank]
    assert repr(lazy) == repr(eager)
    assert vars(lazy).keys() == vars(eager).keys()
    assert torch.equal(y, eager(x))
    for (k, a), (_, b) in zip(lazy.state_dict().items(), eager.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), k


def _kwargs(cls: type[nn.Module], args: tuple[Any, ...]) -> dict[str, Any]:
    names = {
        lazynn.Conv: ("out_channels", "kernel_size"),
        lazynn.ConvTranspose: ("out_channels", "kernel_size"),
        lazynn.MaxPool: ("kernel_size",),
        lazynn.AvgPool: ("kernel_size",),
        lazynn.AdaptiveAvgPool: ("output_size",),
        lazynn.AdaptiveMaxPool: ("output_size",),
        lazynn.Dropout: ("p",),
    }.get(cls, ())
    return dict(zip(names, args, strict=True))


@pytest.mark.parametrize(("cls", "args", "by_rank", "inferred"), CASES, ids=IDS)
def test_a_rank_it_cannot_place_is_a_clear_error(cls, args, by_rank, inferred) -> None:  # type: ignore[no-untyped-def]
    layer = nn.Sequential(cls(*args))
    bad = torch.randn(3) if 2 not in by_rank else torch.randn(2, 3, 4, 4, 4, 4)
    with pytest.raises(lazynn.InferenceError, match=rf"{cls.__name__} at '0'.*rank") as info:
        layer(bad)
    for rank in by_rank:
        assert f"{rank} ({by_rank[rank].__name__})" in str(info.value)
    assert lazynn.is_lazy(layer[0])
    assert type(layer[0]) is cls
    layer(_input(max(by_rank), 3))
    assert type(layer[0]) is by_rank[max(by_rank)]


def test_repr_copies_pickle_and_direct_forward() -> None:
    conv = lazynn.Conv(8, 3, stride=2)
    assert repr(conv) == "Conv(8, 3, rank=?)"
    with pytest.raises(lazynn.UnbuiltError, match=r"call the module"):
        conv.forward(torch.randn(1, 2, 9, 9))
    twin = copy.deepcopy(conv)
    loaded = pickle.loads(pickle.dumps(conv))
    twin(torch.randn(1, 2, 9))
    loaded(torch.randn(1, 2, 9, 9, 9))
    assert (type(twin), type(loaded), type(conv)) == (nn.Conv1d, nn.Conv3d, lazynn.Conv)


def test_checkpoints() -> None:
    source = nn.Conv2d(3, 4, 3)
    conv = lazynn.Conv(4, 3)
    conv.load_state_dict(source.state_dict())
    assert type(conv) is nn.Conv2d
    assert torch.equal(conv.weight, source.weight)
    norm = lazynn.BatchNorm()
    with pytest.raises(lazynn.CheckpointError, match="tells this layer's rank"):
        norm.load_state_dict(nn.BatchNorm2d(3).state_dict())
    assert lazynn.is_lazy(norm)


def test_build_and_summary_choose_the_same_classes() -> None:
    def model() -> nn.Sequential:
        return nn.Sequential(lazynn.Conv(4, 3), lazynn.BatchNorm(), nn.ReLU(), lazynn.MaxPool(2),
                             lazynn.Dropout(0.1), nn.Flatten(), lazynn.LazyLinear(2))

    summary = lazynn.summary(model(), (2, 3, 10, 10))
    assert [r.type for r in summary.rows[1:6]] == [
        "Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Dropout2d"]
    torch.manual_seed(0)
    built = lazynn.build(model(), (2, 3, 10, 10))
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Dropout2d(0.1), nn.Flatten(), nn.Linear(64, 2))
    assert [type(m) for m in built] == [type(m) for m in eager]
    assert summary.total_parameters == sum(p.numel() for p in built.parameters())
    for (k, a), (_, b) in zip(built.state_dict().items(), eager.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), k
