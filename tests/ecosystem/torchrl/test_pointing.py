"""The job tests what it says: torchrl's and tensordict's lazy classes are lazynn's here (and
torch's own under ``--plain-torch``)."""

from __future__ import annotations

import pytest
import torch
from tensordict.utils import _BatchedUninitializedParameter
from torch import nn
from torchrl.modules import MLP, ConvNet
from torchrl.modules.models.exploration import LazygSDEModule, NoisyLazyLinear

import lazynn


@pytest.fixture
def patched(request: pytest.FixtureRequest) -> bool:
    return not request.config.getoption("--plain-torch")


def test_torchrl_models_are_made_of_lazynn_layers(patched: bool) -> None:
    mlp, conv = MLP(out_features=2, num_cells=[4]), ConvNet(num_cells=[4], kernel_sizes=3)
    assert isinstance(mlp[0], lazynn.LazyLinear) is patched
    assert isinstance(conv[0], lazynn.LazyConv2d) is patched
    assert isinstance(mlp[0], lazynn.LazyModuleMixin) is patched
    mlp(torch.randn(3, 5))
    assert type(mlp[0]) is nn.Linear
    assert mlp[0].in_features == 5


def test_torchrl_own_lazy_modules_use_lazynn_mixin_and_placeholders(patched: bool) -> None:
    noisy, gsde = NoisyLazyLinear(3), LazygSDEModule()
    assert isinstance(noisy, lazynn.LazyModuleMixin) is patched
    assert isinstance(gsde, lazynn.LazyModuleMixin) is patched
    assert isinstance(noisy.weight_mu, lazynn.UninitializedParameter) is patched
    assert isinstance(gsde.log_sigma, lazynn.UninitializedParameter) is patched
    assert isinstance(noisy.weight_epsilon, lazynn.UninitializedBuffer) is patched


def test_tensordict_batched_placeholder_subclasses_lazynn(patched: bool) -> None:
    assert issubclass(_BatchedUninitializedParameter, lazynn.UninitializedParameter) is patched
    # torch's own check sees lazynn's placeholders: it is left as torch's
    assert nn.parameter.is_lazy(lazynn.UninitializedParameter())
