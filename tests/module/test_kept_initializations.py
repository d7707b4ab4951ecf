"""Initialization written on an unbuilt placeholder (the instance form): initializers that fill
every element by one rule wait for the build and run after the layer's construction, in the
order written; those that need the shape are refused, naming the factory form.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import lazynn

X = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))

#: initializations the build keeps: (id, what the program writes on a tensor)
KEPT: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("nn.init.normal_", lambda t: nn.init.normal_(t, 0.5, 2.0)),
    ("nn.init.uniform_", lambda t: nn.init.uniform_(t, -3.0, 3.0)),
    ("nn.init.trunc_normal_", lambda t: nn.init.trunc_normal_(t, std=0.02, a=-0.03, b=0.03)),
    ("nn.init.constant_", lambda t: nn.init.constant_(t, 0.25)),
    ("nn.init.zeros_", nn.init.zeros_),
    ("nn.init.ones_", nn.init.ones_),
    ("nn.init.kaiming_uniform_", lambda t: nn.init.kaiming_uniform_(t, a=1.0)),
    ("Tensor.normal_", lambda t: t.data.normal_(0, 0.02)),
    ("Tensor.uniform_", lambda t: t.data.uniform_(-0.1, 0.1)),
    ("Tensor.zero_", lambda t: t.data.zero_()),
    ("Tensor.fill_", lambda t: t.data.fill_(7.0)),
]

#: initializers that need the shape first: refused on a placeholder
REFUSED: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("nn.init.xavier_uniform_", nn.init.xavier_uniform_),
    ("nn.init.xavier_normal_", nn.init.xavier_normal_),
    ("nn.init.kaiming_normal_", nn.init.kaiming_normal_),
    ("nn.init.orthogonal_", nn.init.orthogonal_),
    ("nn.init.eye_", nn.init.eye_),
]


@pytest.mark.parametrize(("name", "init"), KEPT, ids=[n for n, _ in KEPT])
@pytest.mark.parametrize("how", ["first call", "build", "meta+materialize"])
def test_a_kept_initialization_gives_the_eager_layers_values(
    name: str, init: Callable[[torch.Tensor], Any], how: str
) -> None:
    torch.manual_seed(0)
    eager = nn.Linear(3, 4)
    init(eager.weight)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(4)
    init(layer.weight)  # kept: no data yet
    assert lazynn.is_lazy(layer.weight)
    if how == "first call":
        layer(X)
    elif how == "build":
        lazynn.build(layer, X)
    else:
        lazynn.materialize(lazynn.build(layer, X, device="meta"), "cpu")
    assert torch.equal(layer.weight, eager.weight)
    assert torch.equal(layer.bias, eager.bias)
    assert torch.equal(torch.get_rng_state(), after)


def test_kept_initializations_run_in_the_order_written() -> None:
    torch.manual_seed(0)
    eager = nn.Linear(3, 4)
    nn.init.normal_(eager.bias)
    nn.init.uniform_(eager.weight)
    eager.bias.data.fill_(2.0)
    nn.init.normal_(eager.weight)
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(4)
    nn.init.normal_(layer.bias)
    nn.init.uniform_(layer.weight)
    layer.bias.data.fill_(2.0)
    nn.init.normal_(layer.weight)
    layer(X)
    assert torch.equal(layer.weight, eager.weight)
    assert torch.equal(layer.bias, eager.bias)


class MLP(nn.Module):
    """Init loops as models write them: one at the end of __init__, and one per block."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(lazy, width) for width in (3, 8))
        self.head = lazynn.LazyLinear(2) if lazy else nn.Linear(8, 2)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, lazy: bool, width: int) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(8) if lazy else nn.Linear(width, 8)
        nn.init.normal_(self.fc.bias, std=3.0)  # written right after its construction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.mark.parametrize("device", [None, "meta"])
def test_build_runs_the_init_code_where_the_program_wrote_it(device: str | None) -> None:
    """Between the constructions (a block's own init) and after them (the model's loop): the
    instance form is the eager model when every sized layer is lazy."""
    torch.manual_seed(0)
    eager = MLP(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = MLP(lazy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazynn.build(model, X, device=device)
        if device == "meta":
            lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    for (name, a), b in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_full_checkpoint_replaces_kept_initializations_and_draws_nothing() -> None:
    source = nn.Linear(3, 4)
    layer = lazynn.LazyLinear(4)
    nn.init.normal_(layer.weight)
    rng = torch.get_rng_state()
    layer.load_state_dict(source.state_dict())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(layer.weight, source.weight)


def test_a_partial_checkpoint_runs_kept_initializations_before_its_values() -> None:
    source = nn.Linear(3, 4)
    torch.manual_seed(0)
    eager = nn.Linear(3, 4)
    nn.init.constant_(eager.bias, 5.0)
    eager.load_state_dict({"weight": source.weight}, strict=False)
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(4)
    nn.init.constant_(layer.bias, 5.0)
    layer.load_state_dict({"weight": source.weight}, strict=False)
    assert torch.equal(layer.weight, source.weight)
    assert torch.equal(layer.bias, eager.bias)  # 5.0: the bias the checkpoint lacks


def test_a_copy_carries_the_kept_initializations() -> None:
    layer = lazynn.LazyLinear(4)
    nn.init.constant_(layer.weight, 3.0)
    twin = copy.deepcopy(layer)
    twin(X)
    assert torch.equal(twin.weight, torch.full((4, 3), 3.0))
    assert lazynn.is_lazy(layer)


def test_a_failed_first_call_keeps_them_for_the_retry() -> None:
    layer = lazynn.LazyConv2d(2, 3)
    nn.init.constant_(layer.weight, 1.5)
    with pytest.raises(lazynn.InferenceError):
        layer(torch.randn(1, 3, 2, 2))  # a kernel larger than the input
    layer(torch.randn(1, 3, 4, 4))
    assert torch.equal(layer.weight, torch.full((2, 3, 3, 3), 1.5))


def test_the_data_of_a_placeholder_is_unbuilt_and_records_on_it() -> None:
    layer = lazynn.LazyLinear(4)
    data = layer.weight.data
    assert lazynn.is_lazy(data)
    assert data is not layer.weight
    data.fill_(0.5)
    layer(X)
    assert torch.equal(layer.weight, torch.full((4, 3), 0.5))


@pytest.mark.parametrize(("name", "init"), REFUSED, ids=[n for n, _ in REFUSED])
def test_an_initializer_that_needs_the_shape_is_refused_naming_the_factory_form(
    name: str, init: Callable[[torch.Tensor], Any]
) -> None:
    layer = lazynn.LazyLinear(4)
    with pytest.raises(lazynn.UnbuiltError, match=r"the 'weight' of LazyLinear") as caught:
        init(layer.weight)
    assert "lazynn.build(Net, example)" in str(caught.value)
    assert not layer.weight.__dict__.get("_lazynn_inits")  # nothing recorded
    layer(X)  # and it builds as usual
