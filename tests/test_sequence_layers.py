"""Recurrent, attention, transformer and normalization layers called in ways the registry's
rows do not call them (tests/registry.py runs every guarantee over each of these layers):
a packed sequence, a key and value of declared other sizes, a target sequence of another
length than the source, two trailing normalized dimensions; each against its eager twin bit
for bit under one seed."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import lazynn
from compare import assert_same_module


def flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "data") and hasattr(value, "batch_sizes"):
        return [value.data]
    return [t for v in value for t in flat(v)]


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], nn.Module], Callable[[], tuple]]] = {
    "lstm-packed": (
        lambda: lazynn.LazyLSTM(4),
        lambda: nn.LSTM(5, 4),
        lambda: (pack_padded_sequence(torch.randn(6, 3, 5), torch.tensor([6, 4, 2])),)),
    "mha-declared-kdim": (
        lambda: lazynn.LazyMultiheadAttention(2, kdim=6, vdim=7),
        lambda: nn.MultiheadAttention(8, 2, kdim=6, vdim=7),
        lambda: (torch.randn(5, 3, 8), torch.randn(4, 3, 6), torch.randn(4, 3, 7))),
    "transformer": (
        lambda: lazynn.LazyTransformer(nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                       dim_feedforward=16, dropout=0.0, batch_first=True),
        lambda: nn.Transformer(8, 2, 1, 1, 16, 0.0, batch_first=True),
        lambda: (torch.randn(2, 3, 8), torch.randn(2, 4, 8))),
    "layer-norm-2-dims": (lambda: lazynn.LazyLayerNorm(dims=2), lambda: nn.LayerNorm((3, 5)),
                          lambda: (torch.randn(4, 3, 5),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_equals_eager_after_first_call(name: str) -> None:
    make_lazy, make_eager, make_inputs = CASES[name]
    torch.manual_seed(1)
    inputs = make_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own construction notes
        torch.manual_seed(0)
        lazy = make_lazy()
        assert lazynn.is_lazy(lazy)
        out = lazy(*inputs)
        torch.manual_seed(0)
        eager = make_eager()
        expected = eager(*inputs)
    assert_same_module(lazy, eager)
    for a, b in zip(flat(out), flat(expected), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["mha-declared-kdim", "layer-norm-2-dims"])
def test_checkpoint_builds_an_unbuilt_twin(name: str) -> None:
    """(The others' checkpoints are the registry rows' LSTM and Transformer ones.)"""
    make_lazy, make_eager, _ = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        eager = make_eager()
        target = make_lazy()
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
    emb, lstm, norm, head = nn.Embedding(20, 6), nn.LSTM(6, 8, batch_first=True), \
        nn.LayerNorm(8), nn.Linear(8, 3)
    for mine, theirs in ((model.emb, emb), (model.lstm, lstm), (model.norm, norm),
                         (model.head, head)):
        assert_same_module(mine, theirs)
