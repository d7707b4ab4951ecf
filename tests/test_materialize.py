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
