"""Small fixed models whose summaries are kept as golden files (tests/golden/<name>.txt).

Each case is a factory (a fresh model per call) and the example inputs the summary and the build
are given. The models are tiny, so the tables can be checked by hand:

* ``lazy_cnn``: a fully lazy CNN with BatchNorm, nested (``features.0`` ... ``classifier``);
* ``two_inputs``: three forward inputs, two float tensors concatenated and a ``long`` token input
  embedded by ``nn.Embedding``;
* ``tied_lm``: a decoder whose weight is the embedding's (shared, counted once);
* ``built_cnn``: ``lazy_cnn`` after ``lazynn.build``, its first conv frozen (non-trainable);
* ``blocks``: three identical residual blocks (collapsed into one row) sharing one ReLU
  (called four times);
* ``symbolic``: ``lazy_cnn`` for a symbolic batch, ``Bx3x8x8``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

import lazynn

__all__ = [
    "CASES",
    "Block",
    "Blocks",
    "Case",
    "TiedLM",
    "TwoInputs",
    "built_cnn",
    "lazy_cnn",
    "real_inputs",
]

IMAGE = (2, 3, 8, 8)


def lazy_cnn() -> nn.Sequential:
    """(N, 3, 8, 8) images -> (N, 10) logits; every size inferred."""
    return nn.Sequential(
        OrderedDict(
            features=nn.Sequential(
                lazynn.LazyConv2d(8, 3, padding=1),
                lazynn.LazyBatchNorm2d(),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ),
            flatten=nn.Flatten(),
            classifier=lazynn.LazyLinear(10),
        )
    )


class TwoInputs(nn.Module):
    """features (N, 5) and extra (N, 3), concatenated; tokens (N, T) long -> (N, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.fuse = lazynn.LazyLinear(16)
        self.embed = nn.Embedding(50, 8)
        self.head = lazynn.LazyLinear(4)

    def forward(
        self, features: torch.Tensor, extra: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        hidden = torch.relu(self.fuse(torch.cat([features, extra], dim=-1)))
        embedded = self.embed(tokens).mean(dim=1)
        return self.head(torch.cat([hidden, embedded], dim=-1))


class TiedLM(nn.Module):
    """tokens (N, T) long -> (N, T, 20) logits; ``decoder.weight`` is ``embed.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.hidden = lazynn.LazyLinear(8)
        self.act = nn.Tanh()
        self.decoder = nn.Linear(8, 20, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.act(self.hidden(self.embed(tokens))))


def built_cnn() -> nn.Sequential:
    """``lazy_cnn`` built for (2, 3, 8, 8), with ``features.0`` frozen."""
    model = lazynn.build(lazy_cnn(), IMAGE)
    model.features[0].requires_grad_(False)
    return model


class Block(nn.Module):
    """x + fc2(act(fc1(x))), with ``act`` given (shared between blocks)."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1 = lazynn.LazyLinear(12)
        self.fc2 = lazynn.LazyLinear(6)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Blocks(nn.Module):
    """(N, 6) -> (N, 2): three identical blocks, then a head; one ReLU for all."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.blocks = nn.Sequential(*(Block(self.relu) for _ in range(3)))
        self.head = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.relu(self.blocks(x)))


class Case(NamedTuple):
    factory: Callable[[], nn.Module]
    examples: tuple[Any, ...]


CASES: dict[str, Case] = {
    "lazy_cnn": Case(lazy_cnn, (IMAGE,)),
    "two_inputs": Case(TwoInputs, ((2, 5), (2, 3), lazynn.Spec((2, 7), torch.long))),
    "tied_lm": Case(TiedLM, (lazynn.Spec((2, 6), torch.long),)),
    "built_cnn": Case(built_cnn, (IMAGE,)),
    "blocks": Case(Blocks, ((4, 6),)),
    "symbolic": Case(lazy_cnn, (lazynn.Spec(("B", 3, 8, 8)),)),
}


def real_inputs(examples: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
    """Real tensors for shape examples (ones, or token id 0), drawing no random numbers."""
    tensors = []
    for example in examples:
        if isinstance(example, lazynn.Spec):
            tensors.append(torch.zeros(example.shape, dtype=example.dtype or torch.float32))
        else:
            tensors.append(torch.ones(example))
    return tuple(tensors)
