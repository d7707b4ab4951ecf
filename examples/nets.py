"""Small models for the command line's examples in docs/summary.md: a CNN, a language model
whose forward takes a tuple, and a model the summary cannot describe.

Each is a factory that ``lazynn summary`` calls, with no arguments or with those its target
gives in Python call syntax::

    lazynn summary examples/nets.py:Net --input 2x3x32x32
    lazynn summary 'examples/nets.py:make(100)' --input 2x3x32x32
    lazynn summary examples/nets.py:LanguageModel --input 4x16:long --input '(2x4x32, 2x4x32)'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import lazynn


def make(num_classes: int = 10) -> Net:
    """:class:`Net` for ``num_classes`` classes."""
    return Net(num_classes)


class Branchy(nn.Module):
    """A forward that reads its input's values (``if x.sum() > 0``): its shapes do not follow
    from the input's shapes alone, so the summary, which runs it on meta tensors (they hold
    no values), refuses it, naming this file's line."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = -x
        return self.fc(x)  # type: ignore[no-any-return]


class LanguageModel(nn.Module):
    """Token ids ``(N, T)`` and an LSTM state ``(h0, c0)``, each ``(2, N, hidden)``, ->
    logits ``(N, T, vocab)`` and the new state: a forward whose second argument is a tuple."""

    def __init__(self, vocab: int = 50, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.lstm = lazynn.LazyLSTM(hidden, num_layers=2, batch_first=True)
        self.head = lazynn.LazyLinear(vocab)

    def forward(
        self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, state = self.lstm(self.embed(tokens), state)
        return self.head(out), state


class Net(nn.Module):
    """Images ``(N, 3, H, W)`` -> logits ``(N, num_classes)``; every size inferred."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = lazynn.LazyConv2d(16, 3, padding=1)
        self.bn1 = lazynn.LazyBatchNorm2d()
        self.conv2 = lazynn.LazyConv2d(32, 3, padding=1, stride=2)
        self.bn2 = lazynn.LazyBatchNorm2d()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = lazynn.LazyLinear(num_classes)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Net:
        """A class's alternative constructor, as a target: ``'examples/nets.py:Net.from_config
        ({"num_classes": 100})'``."""
        return cls(config["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(self.pool(x).flatten(1))  # type: ignore[no-any-return]
