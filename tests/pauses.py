"""A module that holds a rehearsal still, so a test can act while it runs (another thread's
call, read or save) and then let it finish."""

from __future__ import annotations

import threading

import torch
from torch import nn


class MetaPause(nn.Module):
    """Identity; on meta inputs (a rehearsal) it sets ``reached`` and waits for ``go``."""

    def __init__(self, reached: threading.Event, go: threading.Event) -> None:
        super().__init__()
        self.reached, self.go = reached, go

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:
            self.reached.set()
            self.go.wait(30)
        return x
