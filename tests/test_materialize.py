"""build(meta) then materialize equals eager construction for every kind of torch.nn layer
lazynn makes lazy, including those that initialize after their submodules
(nn.MultiheadAttention, nn.Transformer): same values, and the random stream left where an
eager construction leaves it."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import lazynn

X = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))

CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], nn.Module], tuple[Any, ...]]] = {
    "mha": (lambda: lazynn.LazyMultiheadAttention(2), lambda: nn.MultiheadAttention(8, 2),
            (X, X, X)),
    "encoder-layer": (lambda: lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16),
                      lambda: nn.TransformerEncoderLayer(8, 2, 16), (X,)),
    "decoder-layer": (lambda: lazynn.LazyTransformerDecoderLayer(2, dim_feedforward=16),
                      lambda: nn.TransformerDecoderLayer(8, 2, 16), (X, X)),
    "transformer": (
        lambda: lazynn.LazyTransformer(nhead=2, num_encoder_layers=2, num_decoder_layers=1,
                                       dim_feedforward=16),
        lambda: nn.Transformer(8, 2, 2, 1, 16), (X, X)),
    "lstm": (lambda: lazynn.LazyLSTM(4, num_layers=2, bidirectional=True),
             lambda: nn.LSTM(8, 4, num_layers=2, bidirectional=True), (X,)),
    "gru-cell": (lambda: lazynn.LazyGRUCell(4), lambda: nn.GRUCell(8, 4), (X[0],)),
    "bilinear": (lambda: lazynn.LazyBilinear(3), lambda: nn.Bilinear(8, 8, 3), (X, X)),
    "encoder-of-copies": (
        lambda: nn.TransformerEncoder(lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16),
                                      3, enable_nested_tensor=False),
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 3,
                                      enable_nested_tensor=False), (X,)),
    "group-norm-prelu": (
        lambda: nn.Sequential(lazynn.LazyGroupNorm(1), lazynn.LazyPReLU()),
        lambda: nn.Sequential(nn.GroupNorm(1, 5), nn.PReLU(5)), (X,)),
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_build_equals_eager_construction(name: str, device: str) -> None:
    """build(device="meta") then materialize, or build() at once."""
    make_lazy, make_eager, inputs = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own construction notes
        torch.manual_seed(0)
        eager = make_eager()
        after_eager = torch.rand(3)
        torch.manual_seed(0)
        model = lazynn.build(make_lazy(), *inputs, device=device)
    if device == "meta":
        assert all(t.is_meta for t in model.state_dict().values())
        lazynn.materialize(model, "cpu")
    assert torch.equal(torch.rand(3), after_eager)
    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    mine, theirs = model.state_dict(), eager.state_dict()
    assert list(mine) == list(theirs)
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
