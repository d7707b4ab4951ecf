"""The table of real models: ``MODELS`` maps a name to a :class:`RealModel`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import detr, diffusion_unet, efficientnet, hifigan, mamba, swin, t5
from .convnext import ConvNeXt
from .gpt import GPT
from .kit import LAZY, Kit
from .llama import Llama
from .lstm_lm import RNNModel
from .resnet import ResNet
from .unet import UNet
from .vit import ViT


def _images(*shape: int) -> Callable[[], tuple[Any, ...]]:
    return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(1)),)


def _tokens(vocab: int, *shape: int) -> Callable[[], tuple[Any, ...]]:
    return lambda: (torch.randint(vocab, shape, generator=torch.Generator().manual_seed(1)),)


def _lstm_inputs() -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    hidden = (torch.zeros(2, 3, 16), torch.zeros(2, 3, 16))
    return (torch.randint(50, (5, 3), generator=g), hidden)


@dataclass(frozen=True)
class RealModel:
    """A model: ``make(kit)`` constructs it; ``inputs()`` real example inputs."""

    make: Callable[[Kit], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    #: whether the instance form (``make(LAZY)``, no factory) can construct it: its init code
    #: uses only initializers that wait for the build
    instance: bool = True

    def factory(self, kit: Kit) -> Callable[[], nn.Module]:
        return lambda: self.make(kit)


MODELS: dict[str, RealModel] = {
    "resnet": RealModel(lambda kit: ResNet(kit), _images(2, 3, 32, 32), instance=False),
    "vit": RealModel(lambda kit: ViT(kit), _images(2, 3, 32, 32)),
    "convnext": RealModel(lambda kit: ConvNeXt(kit), _images(2, 3, 32, 32), instance=False),
    # (its head is tied into an eager embedding, which meets the unbuilt placeholder first)
    "gpt": RealModel(lambda kit: GPT(kit), _tokens(64, 2, 16), instance=False),
    "gpt_hf_tie": RealModel(lambda kit: GPT(kit, hf_tie=True), _tokens(64, 2, 16)),
    "llama": RealModel(lambda kit: Llama(kit), _tokens(64, 2, 16)),
    "unet": RealModel(lambda kit: UNet(kit), _images(2, 1, 32, 32), instance=False),
    "lstm_lm": RealModel(lambda kit: RNNModel(kit), _lstm_inputs),
    "efficientnet": RealModel(efficientnet.make, efficientnet.inputs, instance=False),
    "swin": RealModel(swin.make, swin.inputs),
    "mamba": RealModel(mamba.make, mamba.inputs, instance=False),
    "diffusion_unet": RealModel(diffusion_unet.make, diffusion_unet.inputs),
    # (its weight_norm waits for the build: an unbuilt instance has no 'weight_g' to load into)
    "hifigan": RealModel(hifigan.make, hifigan.inputs, instance=False),
    # (its transformer's _reset_parameters is xavier_uniform_, which reads the shapes)
    "detr": RealModel(detr.make, detr.inputs, instance=False),
    "t5": RealModel(t5.make, t5.inputs),
}


def lazy_model(name: str) -> nn.Module:
    """The lazy port of ``MODELS[name]``: a target for the command line
    (``lazynn summary "real_models:lazy_model('vit')" --input 2x3x32x32``, run in tests/)."""
    return MODELS[name].make(LAZY)


def every_tensor(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a model holds, by name: parameters, buffers (non-persistent too) and
    tensors kept as plain attributes (``freqs_cis``); a tied tensor under each name."""
    found: dict[str, torch.Tensor] = {}
    for path, module in model.named_modules():
        prefix = f"{path}." if path else ""
        for name, tensor in (*module._parameters.items(), *module._buffers.items()):
            if tensor is not None:
                found[prefix + name] = tensor
        for name, value in module.__dict__.items():
            if isinstance(value, torch.Tensor):
                found[prefix + name] = value
    return found
