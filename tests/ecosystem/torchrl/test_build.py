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
