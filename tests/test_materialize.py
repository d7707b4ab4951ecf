"""build(meta) then materialize equals eager construction for every kind of torch.nn layer
lazynn makes lazy, including those that initialize after their submodules
(nn.MultiheadAttention, nn.Transformer): same values, and the random stream left where an
eager construction leaves it. The models are the ``materialize`` of the rows of the layers
they exercise."""

from __future__ import annotations

import warnings

import pytest
import torch

import lazynn
from registry import ROWS, Row, Twin

#: (row, model) for every row's models to materialize
MODELS = [(r, m) for r in ROWS for m in r.materialize]


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize(("row", "twin"), MODELS, ids=[m.id for _, m in MODELS])
def test_build_equals_eager_construction(row: Row, twin: Twin, device: str) -> None:
    """build(device="meta") then materialize, or build() at once."""
    inputs = twin.inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own construction notes
        torch.manual_seed(0)
        eager = twin.eager()
        after_eager = torch.rand(3)
        torch.manual_seed(0)
        lazy = twin.lazy()
        assert row.lazy in {type(m) for m in lazy.modules()}
        model = lazynn.build(lazy, *inputs, device=device)
    if device == "meta":
        assert all(t.is_meta for t in model.state_dict().values())
        lazynn.materialize(model, "cpu")
    assert torch.equal(torch.rand(3), after_eager)
    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    mine, theirs = model.state_dict(), eager.state_dict()
    assert list(mine) == list(theirs)
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


class _TiedPair(torch.nn.Module):
    """Two lazy layers sharing one weight placeholder (tied before the build)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = lazynn.LazyLinear(8)
        self.proj2 = lazynn.LazyLinear(8)
        self.proj2.weight = self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj2(self.proj(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", ["build", "meta-materialize", "first-call"])
def test_lazy_layers_tied_before_the_build_stay_tied(path: str) -> None:
    """A weight tied between lazy layers is one tensor after every way of building, with the
    eager twin's numbers: build(device="meta") replaces the placeholder once, not per layer."""
    torch.manual_seed(0)
    model = _TiedPair()
    if path == "build":
        lazynn.build(model, (2, 8))
    elif path == "meta-materialize":
        lazynn.build(model, (2, 8), device="meta")
        assert model.proj.weight is model.proj2.weight
        assert model.proj.weight.is_meta
        lazynn.materialize(model, "cpu")
    else:
        model(torch.zeros(2, 8))
    assert model.proj.weight is model.proj2.weight
    assert sum(p.numel() for p in model.parameters()) == 64 + 8 + 8
    if path != "first-call":  # (a first call draws in call order; build in construction order)
        torch.manual_seed(0)
        first, second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        second.weight = first.weight
        for ours, theirs in zip(
            model.parameters(), [first.weight, first.bias, second.bias], strict=True
        ):
            assert torch.equal(ours, theirs)
