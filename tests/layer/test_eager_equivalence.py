"""Same seed, same numbers: a lazy layer after its first call equals its eager twin, bit for bit.

For every row of the registry, over hypothesis-drawn options and sizes: parameters, buffers
(running statistics after the call), outputs and gradients are identical, and the module
is exactly the eager class, with the same attributes and state_dict layout.
"""

from __future__ import annotations

import warnings

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import lazynn
from compare import assert_same_module
from lazynn._errors import shape_str
from registry import ROWS, UNBATCHED, Row


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
@settings(max_examples=12, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1), train=st.booleans(), batched=st.booleans())
def test_lazy_equals_eager(
    row: Row, data: st.DataObject, seed: int, train: bool, batched: bool
) -> None:
    options = data.draw(row.options, label="options")
    size = data.draw(row.sizes(options), label=row.inferred)
    batched = batched or row.lazy not in UNBATCHED
    x = row.input(options, size, batched)
    torch.manual_seed(seed)
    lazy = row.lazy(**options).train(train)
    x_lazy = x.clone().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", lazynn.AmbiguousInputWarning)
        y_lazy = row.call(lazy, x_lazy)
    # an unbatched first input is accepted, as torch does, and said to be read as one sample
    # (a layer with a channel dimension: convolutions, instance norms); a batched one may
    # be said to look channels-last (a channel count equal to a spatial size)
    noted = [str(w.message) for w in caught if w.category is lazynn.AmbiguousInputWarning]
    specs = getattr(row.lazy, "inferred", {}).values()
    if not batched and any(spec.layouts for spec in specs):
        assert len(noted) == 1, noted
        assert "as one unbatched" in noted[0]
    else:
        assert all("channels-last" in text for text in noted), noted
    torch.manual_seed(seed)
    eager = row.new_eager(options, size).train(train)
    x_eager = x.clone().requires_grad_()
    y_eager = row.call(eager, x_eager)
    if row.sized:
        assert row.size(lazy) == row.size(eager) == size, shape_str(x.shape)
    assert torch.equal(y_lazy, y_eager)
    assert_same_module(lazy, eager)
    y_lazy.sum().backward()
    y_eager.sum().backward()
    # a parameter the forward did not use (a cluster no target fell in) has no gradient
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad), name
    assert (x_lazy.grad is None) == (x_eager.grad is None)
    if x_eager.grad is not None:
        assert torch.equal(x_lazy.grad, x_eager.grad)


def test_registry_covers_torch_lazy_layers() -> None:
    """Every lazy layer torch ships has a lazynn twin of the same name in the registry."""
    torch_lazy = {n for n in dir(torch.nn) if n.startswith("Lazy") and n != "LazyModuleMixin"}
    assert torch_lazy <= {r.lazy.__name__ for r in ROWS}
