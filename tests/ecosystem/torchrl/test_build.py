"""``lazynn.build`` on torchrl's own models (torchrl's tests never call it)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torchrl.modules.models.model_based import ObsDecoder

import lazynn


def test_build_of_dreamer_decoder_warns_nothing(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--plain-torch"):
        pytest.skip("made of torch's lazy layers, the build rightly warns it cannot replay them")
    # ObsDecoder constructs its layers in reverse order of use (the first ConvTranspose2d last)
    state, hidden = torch.randn(2, 30), torch.randn(2, 200)
    torch.manual_seed(0)
    decoder = ObsDecoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazynn.build(decoder, state, hidden)
    assert decoder(state, hidden).shape == (2, 3, 64, 64)


def test_a_soft_update_of_an_unbuilt_value_network() -> None:
    """torchrl's target updater on an unbuilt network with ``delay_value=True``: it asks
    ``target.is_set_to(source.data)`` and copies ``source.data`` into its empty targets (an
    UnbuiltError before issue 36); once the network is built, a step gives the targets the
    source's values, as with torch's lazy layers."""
    from tensordict import TensorDict
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.LazyLinear(32), torch.nn.ReLU(), torch.nn.LazyLinear(4))
    actor = QValueActor(network, in_keys=["observation"], spec=OneHot(4))
    loss = DQNLoss(actor, delay_value=True, action_space="one-hot")
    updater = SoftUpdate(loss, eps=0.5)
    actions = torch.nn.functional.one_hot(torch.randint(4, (5,)), 4)
    batch = TensorDict(
        {
            "observation": torch.randn(5, 3),
            "action": actions,
            ("next", "observation"): torch.randn(5, 3),
            ("next", "reward"): torch.randn(5, 1),
            ("next", "done"): torch.zeros(5, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(5, 1, dtype=torch.bool),
        },
        [5],
    )
    loss(batch)["loss"].backward()
    updater.step()
    sources = loss.value_network_params.flatten_keys()
    targets = loss.target_value_network_params.flatten_keys()
    assert targets["module.0.module.0.weight"].shape == (32, 3)
    for key in sources.keys():  # noqa: SIM118 (iterating a TensorDict goes over its batch)
        assert torch.equal(targets[key].data, sources[key].data), key
