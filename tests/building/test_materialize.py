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


# --- never uninitialized memory: tensors that reset_parameters() does not set -------------


class Attention(torch.nn.Module):
    """Tensors its __init__ makes that its reset_parameters() leaves alone: a causal mask, a
    gain filled with 0.5, rotary frequencies (as GPT, layer-scale and LLaMA code has them)."""

    def __init__(self, lazy: bool, d: int = 8) -> None:
        super().__init__()
        self.q = lazynn.LazyLinear(d) if lazy else torch.nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(4, 4)))
        self.gain = torch.nn.Parameter(torch.full((d,), 0.5))
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> None:
        """(its own: sets nothing of the above)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.gain + self.mask.sum() + self.inv_freq.sum()  # type: ignore[no-any-return]


def _stack(lazy: bool) -> torch.nn.Module:
    first = lazynn.LazyLinear(8) if lazy else torch.nn.Linear(8, 8)
    return torch.nn.Sequential(first, Attention(lazy))


def test_a_meta_build_keeps_the_tensors_an_initializer_cannot_remake() -> None:
    torch.manual_seed(0)
    eager = _stack(lazy=False)
    torch.manual_seed(0)
    model = lazynn.build(_stack(lazy=True), (2, 8), device="meta")
    kept = {n for n, t in (*model.named_parameters(), *model.named_buffers()) if not t.is_meta}
    assert kept == {"1.mask", "1.gain", "1.inv_freq"}  # their constructed values stay
    lazynn.materialize(model, "cpu")
    for (name, a), (_, b) in zip(
        (*model.named_parameters(), *model.named_buffers()),
        (*eager.named_parameters(), *eager.named_buffers()),
        strict=True,
    ):
        assert torch.equal(a, b), name


def test_materialize_refuses_tensors_no_initializer_writes_and_leaves_the_model_on_meta() -> None:
    with torch.device("meta"):
        model = _stack(lazy=False)  # an eager model constructed on meta
    with pytest.raises(lazynn.LazynnError, match="no initializer writes whole") as caught:
        lazynn.materialize(model, "cpu")
    for name in ("1.mask", "1.gain", "1.inv_freq"):
        assert f"'{name}'" in str(caught.value)
    assert "lazynn.build(Net, example, device='meta')" in str(caught.value)  # the fix
    assert all(t.is_meta for t in (*model.parameters(), *model.buffers()))


def test_the_factory_form_materializes_every_tensor_of_its_init() -> None:
    torch.manual_seed(0)
    eager = _stack(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = lazynn.build(lambda: _stack(lazy=True), (2, 8), device="meta")
    lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    for a, b in zip(model.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(model[1].inv_freq, eager[1].inv_freq)  # (not in the state_dict)


# --- an eager head tied to the embedding, with its own bias ----------------------------------


class TiedHead(torch.nn.Module):
    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(20, 8)
        self.body = lazynn.LazyLinear(8) if lazy else torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 20)  # eager, after the first lazy layer
        self.head.weight = self.wte.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.wte(x)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("device", [None, "meta"])
def test_a_tied_head_after_a_lazy_layer_gets_its_bias_from_its_eager_place(
    device: str | None,
) -> None:
    torch.manual_seed(0)
    eager = TiedHead(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: nothing to warn about
        model = lazynn.build(TiedHead(lazy=True), lazynn.Spec((2, 3), torch.long), device=device)
        if device == "meta":
            lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    assert model.head.weight is model.wte.weight
    for a, b in zip(model.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_freed_written_temporary_does_not_make_a_later_tensor_look_written() -> None:
    """Writes tells storages apart by identity, not address: an initializer's temporary,
    written then freed, leaves its address to later tensors that nothing wrote."""
    from lazynn._build.writes import Writes

    with Writes() as writes:
        for _ in range(200):
            temporary = torch.empty(3)
            temporary.fill_(1.0)
            del temporary
        fresh = [torch.empty(3) for _ in range(200)]
    assert not any(writes.wrote(t) for t in fresh)
