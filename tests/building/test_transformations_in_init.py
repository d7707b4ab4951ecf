"""Transformations a factory's ``__init__`` applies to a lazy layer, as eager code applies them
to a built one: ``weight_norm``, ``spectral_norm`` (old and parametrization forms), a
parametrization of one's own, pruning (every vocoder and GAN discriminator in the wild).

The factory's first run lays such a layer out as its eager class on meta (the transformation
needs its tensors) and learns its sizes through the run's own forward; the real run constructs
it with them, so the transformation runs where the eager program runs it. Each door gives the
eager model and leaves the generator where eager construction leaves it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune

import lazynn

X = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(1))


class _Scale(nn.Module):
    """A parametrization of one's own, with a right inverse."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 2

    def right_inverse(self, w: torch.Tensor) -> torch.Tensor:
        return w / 2


def _own(conv: nn.Module) -> nn.Module:
    parametrize.register_parametrization(conv, "weight", _Scale())
    return conv


def _pruned(conv: nn.Module) -> nn.Module:
    prune.l1_unstructured(conv, "weight", amount=0.5)
    return conv


TRANSFORMS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "weight_norm": nn.utils.weight_norm,
    "spectral_norm": nn.utils.spectral_norm,
    "parametrizations.weight_norm": parametrizations.weight_norm,
    "parametrizations.spectral_norm": parametrizations.spectral_norm,
    "register_parametrization": _own,
    "parametrizations.orthogonal": parametrizations.orthogonal,
    "prune": _pruned,
}


class _Vocoder(nn.Module):
    """A transformed lazy layer, an eager layer drawn after it, a lazy layer sized by the
    first's output, and an init loop over every convolution (HiFi-GAN's ``init_weights``)."""

    def __init__(self, how: str, lazy: bool = True) -> None:
        super().__init__()
        transform = TRANSFORMS[how]
        self.pre = transform(lazynn.LazyConv1d(6, 3) if lazy else nn.Conv1d(3, 6, 3))
        self.mid = nn.Conv1d(6, 6, 1)
        self.post = transform(lazynn.LazyConv1d(2, 3) if lazy else nn.Conv1d(6, 2, 3))
        self.noise = torch.randn(3)  # (a value drawn after them: the stream must agree)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(torch.relu(self.mid(self.pre(x))))  # type: ignore[no-any-return]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _eager(how: str) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (torch's old weight_norm)
        model = _Vocoder(how, lazy=False)
    after = torch.get_rng_state()
    return _state(model), model.noise, after


DOORS = ["build", "meta+materialize", "threads=2", "meta, assign load"]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("how", sorted(TRANSFORMS))
def test_a_transformation_in_init_on_a_lazy_layer_gives_the_eager_model(
    how: str, door: str
) -> None:
    expected, noise, after = _eager(how)
    factory = functools.partial(_Vocoder, how)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if door == "build":
            model = lazynn.build(factory, X)
        elif door == "threads=2":
            model = lazynn.build(factory, X, threads=2)
        else:
            model = lazynn.build(factory, X, device="meta")
            if door == "meta, assign load":
                model.load_state_dict(expected, assign=True)
            lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    assert torch.equal(model.noise, noise)
    got = _state(model)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected), [
        k for k in expected if not torch.equal(got[k], expected[k])
    ]
    assert type(model.pre).__name__ in ("Conv1d", "ParametrizedConv1d")
    model(X)  # (its forward runs, as eager's)


@pytest.mark.parametrize("how", ["weight_norm", "parametrizations.spectral_norm"])
def test_a_summary_of_such_a_factory_moves_no_generator(how: str) -> None:
    before = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        report = lazynn.summary(functools.partial(_Vocoder, how), X)
    assert torch.equal(torch.get_rng_state(), before)
    assert "post" in str(report)


class _Unreached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.utils.weight_norm(lazynn.LazyConv1d(4, 3))
        self.spare = nn.utils.weight_norm(lazynn.LazyConv1d(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)  # type: ignore[no-any-return]


def test_a_transformed_lazy_layer_the_forward_never_calls_is_refused_naming_it() -> None:
    before = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(lazynn.InferenceError) as raised:
            lazynn.build(_Unreached, X)
    text = str(raised.value)
    assert "never called 'spare', whose tensors the factory's __init__ transforms" in text
    assert "give them their sizes" in text.split("Fix: ", 1)[1]
    assert torch.equal(torch.get_rng_state(), before)


class _Heads(nn.Module):
    """Two transformed lines, and an untransformed lazy layer the forward does not reach."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.utils.weight_norm(lazynn.LazyConv1d(4, 3))
        self.b = parametrizations.spectral_norm(lazynn.LazyConv1d(4, 3))
        self.aux = lazynn.LazyLinear(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


def test_only_the_lines_that_transform_are_laid_out_eager_even_with_dynamo_imported() -> None:
    """(Found by review.) A wrapper of dynamo's between lazynn and the user's line is not the
    line that constructs: the untransformed layer stays lazy, and its refusal is the usual."""
    import torch._dynamo  # noqa: F401  (transformers, Lightning and FSDP import it)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(lazynn.InferenceError, match="never called 'aux'") as raised:
            lazynn.build(_Heads, X)
    assert "transforms" not in str(raised.value)


class _Mono(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.utils.weight_norm(lazynn.LazyConv1d(16, 15, padding=7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)  # type: ignore[no-any-return]


def test_a_transformed_layer_warns_of_an_ambiguous_input_as_a_lazy_one_does() -> None:
    """(Found by review.) Mono audio without its channel dimension, (4, 8000), reads as 4
    channels: the layer laid out eager reads its input as the lazy layer does, and says so."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.warns(lazynn.AmbiguousInputWarning, match="Conv1d at 'conv'"):
            lazynn.build(_Mono, torch.randn(4, 800))


class _Global(nn.Module):
    """prune.global_unstructured over two lazy layers: one step needs both."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(6) if lazy else nn.Linear(10, 6)
        self.b = lazynn.LazyLinear(2) if lazy else nn.Linear(6, 2)
        pairs = [(self.a, "weight"), (self.b, "weight")]
        prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x.sum(1)))  # type: ignore[no-any-return]


def test_a_step_over_several_lazy_layers_lays_each_out_eager() -> None:
    """(Found by review: a bare KeyError before.)"""
    torch.manual_seed(0)
    eager = _Global(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = lazynn.build(_Global, X)
    assert torch.equal(torch.get_rng_state(), after)
    got, expected = _state(model), _state(eager)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_the_instance_form_refuses_as_torch_refuses_an_unbuilt_weight() -> None:
    """Drop-in: torch's own lazy layers meet the same ``ValueError`` (its check runs before
    any tensor op lazynn could see); the factory form, or ``lazynn.on_build``, is the port."""
    for lazy in (nn.LazyConv1d(4, 3), lazynn.LazyConv1d(4, 3)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with pytest.raises(ValueError, match="uninitialized parameters"):
                nn.utils.weight_norm(lazy)
