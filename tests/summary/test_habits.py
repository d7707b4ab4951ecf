"""Habits from torchinfo and Keras, answered: torchinfo's keywords refused in lazynn's words
(or passed to a forward that takes them), Keras's ``None`` batch read as a free batch, a bare
int refused with the shape it meant."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import lazynn
from lazynn._rehearsal.habits import TORCHINFO


def mlp() -> nn.Sequential:
    return nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(2))


@pytest.mark.parametrize("keyword", sorted(TORCHINFO))
@pytest.mark.parametrize("form", ["instance", "class"])
def test_torchinfo_keywords_are_refused_before_anything_in_lazynn_words(
    keyword: str, form: str
) -> None:
    model = mlp()
    state = torch.get_rng_state()
    target = model if form == "instance" else nn.Sequential
    with pytest.raises(lazynn.ArgumentError) as info:
        lazynn.summary(target, (4, 16), **{keyword: 1})
    text = str(info.value)
    assert text.startswith("lazynn.summary: expected example inputs for the model's forward")
    assert f"received {keyword}=, torchinfo's keyword, which Sequential.forward does not take" in (
        text
    )
    assert text.endswith(f"Fix: {TORCHINFO[keyword]}")
    assert lazynn.is_lazy(model)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_fixes_name_lazynns_own_words() -> None:
    report = lazynn.summary(mlp(), (4, 16))
    assert "render(depth=1)" in TORCHINFO["depth"]
    report.render(depth=1)  # (the words it gives are lazynn's, and they run)
    assert "columns=('input', 'output', 'params', 'flops')" in TORCHINFO["col_names"]
    report.render(columns=("input", "output", "params", "flops", "param_shapes"))
    report.render(width=120)
    assert "lazynn.Spec((1, 1024), torch.long)" in TORCHINFO["dtypes"]


class TakesDevice(nn.Module):
    """A forward with an argument of torchinfo's name (``depth=``, doubling its input that
    often): the forward's, not torchinfo's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor, depth: int = 0) -> torch.Tensor:
        for _ in range(depth):
            x = torch.cat([x, x], dim=-1)
        return self.fc(x)  # type: ignore[no-any-return]


def test_a_forward_that_takes_the_keyword_gets_it() -> None:
    report = lazynn.summary(TakesDevice(), (4, 16), depth=2)
    assert report.total_parameters == 64 * 3 + 3  # (the forward doubled its input twice)
    assert lazynn.build(TakesDevice(), (4, 16), depth=2).fc.in_features == 64


def test_a_factory_whose_forward_is_not_known_before_it_runs_is_told_at_its_failure() -> None:
    with pytest.raises(lazynn.InferenceError, match=r"Fix: choose the depth when rendering"):
        lazynn.summary(lambda: mlp(), (4, 16), depth=1)


# --- Keras's None batch -----------------------------------------------------------------------


def test_a_none_batch_is_the_symbolic_batch() -> None:
    keras = lazynn.summary(mlp(), (None, 16))
    named = lazynn.summary(mlp(), lazynn.Spec(("B", 16)))
    assert keras.batch == "B"
    assert str(keras) == str(named)
    assert [r.outputs for r in keras.rows] == [r.outputs for r in named.rows]


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_a_build_runs_a_none_batch_as_two_and_equals_eager(form: str) -> None:
    def net() -> nn.Sequential:
        return nn.Sequential(lazynn.LazyLinear(8), lazynn.LazyBatchNorm1d(), nn.ReLU())

    torch.manual_seed(0)
    built = lazynn.build(net() if form == "instance" else net, (None, 16))
    after = torch.get_rng_state()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU())
    assert torch.equal(after, torch.get_rng_state())
    for a, b in zip(built.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # (BatchNorm in training takes a batch of 2, not 1)


class Flattens(nn.Module):
    """A layer whose size follows the batch: the batch flattened into the features."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(-1))  # type: ignore[no-any-return]


@pytest.mark.parametrize("model", [Flattens, Flattens()], ids=["factory", "instance"])
def test_a_build_refuses_a_free_batch_its_sizes_follow(model: object) -> None:
    with pytest.raises(lazynn.InferenceError, match=r"'fc.weight': expected parameter and buffer"):
        lazynn.build(model, (None, 4))  # type: ignore[call-overload]
    assert lazynn.build(Flattens(), (2, 4)).fc.in_features == 8  # (a number is the batch)


def test_none_elsewhere_than_the_batch_is_not_a_shape() -> None:
    with pytest.raises(lazynn.InferenceError):
        lazynn.build(mlp(), (4, None))


# --- a bare int -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model", [mlp, lambda: nn.Sequential(nn.Linear(16, 2))], ids=["lazy", "eager"]
)
def test_a_bare_int_is_refused_with_the_shape_it_meant(model: object) -> None:
    with pytest.raises(lazynn.InferenceError, match=r"a shape is a tuple, \(16,\) or \(4, 16\)"):
        lazynn.summary(model(), 16)  # type: ignore[operator]


def test_the_examples_tuple_is_not_read_as_one_shape() -> None:
    """Two int examples are two ints (a forward taking ints gets them), not a (4, 16) tensor
    unpacked into four rows."""

    class Repeat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(2)

        def forward(self, n: int, width: int) -> torch.Tensor:
            return self.fc(torch.ones(n, width))  # type: ignore[no-any-return]

    report = lazynn.summary(Repeat(), 4, 16)
    assert report.rows[1].inputs[0].shape == (4, 16)
    assert functools.reduce(int.__mul__, report.outputs[0].shape) == 8


def test_the_examples_are_not_a_keras_shape_themselves() -> None:
    """``summary(model, None, 16)``: a None and an int example, not the shape (None, 16)."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(2)

        def forward(self, mask: torch.Tensor | None, width: int) -> torch.Tensor:
            assert mask is None
            return self.fc(torch.ones(3, width))  # type: ignore[no-any-return]

    assert lazynn.summary(Masked(), None, 16).rows[1].inputs[0].shape == (3, 16)
    assert lazynn.build(Masked(), None, 16).fc.in_features == 16


class CallTakesDevice(nn.Module):
    """A ``__call__`` of its own that takes ``device=`` and calls the forward without it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)

    def __call__(self, x: torch.Tensor, device: str = "cpu") -> torch.Tensor:
        return super().__call__(x)  # type: ignore[no-any-return]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


def test_the_keyword_check_reads_the_forward_the_call_runs() -> None:
    """A forward set on the instance, and a __call__ of the class's own, take what they take:
    the check reads what the call runs, not the class's forward."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    replaced = Plain()
    replaced.forward = TakesDevice.forward.__get__(replaced)  # type: ignore[method-assign]
    assert lazynn.summary(replaced, (4, 16), depth=1).total_parameters == 32 * 3 + 3
    assert lazynn.summary(CallTakesDevice(), (4, 16), device="cpu").total_parameters == 51
    assert lazynn.summary(CallTakesDevice, (4, 16), device="cpu").total_parameters == 51


@pytest.mark.compile
def test_a_compiled_models_forward_is_its_originals() -> None:
    compiled = torch.compile(lazynn.build(TakesDevice(), (4, 16), depth=1))
    assert lazynn.summary(compiled, (4, 16), depth=1).total_parameters == 32 * 3 + 3
