"""Recurrent, attention, transformer and normalization layers called in ways the registry's
rows do not call them (tests/registry.py runs every guarantee over each of these layers):
a packed sequence, a key and value of declared other sizes, a target sequence of another
length than the source, two trailing normalized dimensions (the ``variants`` of their rows);
each against its eager twin bit for bit under one seed."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module
from registry import ROWS, Row, Twin


def flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "data") and hasattr(value, "batch_sizes"):
        return [value.data]
    return [t for v in value for t in flat(v)]


#: (row, variant) for every row's variants
VARIANTS = [(r, v) for r in ROWS for v in r.variants]


@pytest.mark.parametrize(("row", "variant"), VARIANTS, ids=[v.id for _, v in VARIANTS])
def test_equals_eager_after_first_call(row: Row, variant: Twin) -> None:
    torch.manual_seed(1)
    inputs = variant.inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own construction notes
        torch.manual_seed(0)
        lazy = variant.lazy()
        assert type(lazy) is row.lazy
        assert lazynn.is_lazy(lazy)
        out = lazy(*inputs)
        torch.manual_seed(0)
        eager = variant.eager()
        expected = eager(*inputs)
    assert type(eager) is row.eager
    assert_same_module(lazy, eager)
    for a, b in zip(flat(out), flat(expected), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("variant", [v for _, v in VARIANTS if v.checkpoint], ids=lambda v: v.id)
def test_checkpoint_builds_an_unbuilt_twin(variant: Twin) -> None:
    """(The others' checkpoints are the registry rows' LSTM and Transformer ones.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        eager = variant.eager()
        target = variant.lazy()
    target.load_state_dict(eager.state_dict())
    assert_same_module(target, eager)


def test_build_of_a_recurrent_tagger() -> None:
    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(20, 6)
            self.lstm = lazynn.LazyLSTM(8, batch_first=True)
            self.norm = lazynn.LazyLayerNorm()
            self.head = lazynn.LazyLinear(3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(self.emb(ids))
            return self.head(self.norm(out))

    torch.manual_seed(0)
    model = lazynn.build(Tagger(), lazynn.Spec((2, 7), torch.long))
    torch.manual_seed(0)
    emb, lstm, norm, head = (
        nn.Embedding(20, 6),
        nn.LSTM(6, 8, batch_first=True),
        nn.LayerNorm(8),
        nn.Linear(8, 3),
    )
    for mine, theirs in (
        (model.emb, emb),
        (model.lstm, lstm),
        (model.norm, norm),
        (model.head, head),
    ):
        assert_same_module(mine, theirs)
