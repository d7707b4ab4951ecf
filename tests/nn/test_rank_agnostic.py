"""Rank-agnostic layers: the first input's rank picks the 1d/2d/3d class, exactly.

tests/registry.py has a row per (rank-agnostic class, rank): every registry-driven guarantee
(equivalence with the class of the rank, moves, copies, checkpoints, bad inputs...) runs over
each, the class of the rank written out in the row (``eager`` at ``input_rank``). Here, what
the rows do not cover: the message of a rank no class takes (listing the classes of the
class's rows), copies of one unbuilt layer building at different ranks, and build / summary
of a model choosing the same classes.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import lazynn
from registry import ROWS, Row

#: every rank-agnostic class's rows, a row per input rank it takes
BY_CLASS: dict[type[nn.Module], list[Row]] = {}
for _row in ROWS:
    if _row.agnostic:
        BY_CLASS.setdefault(_row.lazy, []).append(_row)


def _input(rank: int, channels: int) -> torch.Tensor:
    return torch.randn((2, channels) + (5,) * (rank - 2))


@pytest.mark.parametrize("cls", list(BY_CLASS), ids=lambda c: c.__name__)
def test_a_rank_it_cannot_place_is_a_clear_error(cls: type[nn.Module]) -> None:
    rows = BY_CLASS[cls]
    for row in rows:  # the rows' inputs are of the rank the row says
        assert row.input_rank is not None, row.id
        assert row.example().dim() == row.input_rank, row.id
    by_rank = {row.input_rank: row.eager for row in rows}
    layer = nn.Sequential(cls(**rows[0].simple))
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


def test_build_and_summary_choose_the_same_classes() -> None:
    def model() -> nn.Sequential:
        return nn.Sequential(
            lazynn.Conv(4, 3),
            lazynn.BatchNorm(),
            nn.ReLU(),
            lazynn.MaxPool(2),
            lazynn.ChannelDropout(0.1),
            nn.Flatten(),
            lazynn.LazyLinear(2),
        )

    summary = lazynn.summary(model(), (2, 3, 10, 10))
    assert [r.type for r in summary.rows[1:6]] == [
        "Conv2d",
        "BatchNorm2d",
        "ReLU",
        "MaxPool2d",
        "Dropout2d",
    ]
    torch.manual_seed(0)
    built = lazynn.build(model(), (2, 3, 10, 10))
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout2d(0.1),
        nn.Flatten(),
        nn.Linear(64, 2),
    )
    assert [type(m) for m in built] == [type(m) for m in eager]
    assert summary.total_parameters == sum(p.numel() for p in built.parameters())
    for (k, a), (_, b) in zip(built.state_dict().items(), eager.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
