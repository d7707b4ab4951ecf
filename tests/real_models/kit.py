"""The two kits: the sized constructors a model uses, eager (:data:`EAGER`) or lazy
(:data:`LAZY`, the size the input tells dropped).
"""

from __future__ import annotations

from typing import Any

from torch import nn

import lazynn


class Kit:
    """The sized constructors a model uses, eager."""

    lazy = False

    def Linear(self, i: int, o: int, **kw: Any) -> nn.Module:
        return nn.Linear(i, o, **kw)

    def Conv2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.Conv2d(i, o, k, **kw)

    def ConvTranspose2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.ConvTranspose2d(i, o, k, **kw)

    def BatchNorm2d(self, c: int, **kw: Any) -> nn.Module:
        return nn.BatchNorm2d(c, **kw)

    def LayerNorm(self, d: int, **kw: Any) -> nn.Module:
        return nn.LayerNorm(d, **kw)

    def LSTM(self, i: int, h: int, n: int, **kw: Any) -> nn.Module:
        return nn.LSTM(i, h, n, **kw)

    def Conv1d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.Conv1d(i, o, k, **kw)

    def ConvTranspose1d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.ConvTranspose1d(i, o, k, **kw)

    def GroupNorm(
        self, groups: int, c: int, cls: type[nn.GroupNorm] = nn.GroupNorm, **kw: Any
    ) -> nn.Module:
        """``cls(groups, c)``: ``nn.GroupNorm`` or a subclass of it (guided-diffusion's
        ``GroupNorm32``)."""
        return cls(groups, c, **kw)


class LazyKit(Kit):
    """The same constructors, lazy: the size the input tells is dropped."""

    lazy = True

    def Linear(self, i: int, o: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLinear(o, **kw)

    def Conv2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConv2d(o, k, **kw)

    def ConvTranspose2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConvTranspose2d(o, k, **kw)

    def BatchNorm2d(self, c: int, **kw: Any) -> nn.Module:
        return lazynn.LazyBatchNorm2d(**kw)

    def LayerNorm(self, d: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLayerNorm(**kw)

    def LSTM(self, i: int, h: int, n: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLSTM(h, n, **kw)

    def Conv1d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConv1d(o, k, **kw)

    def ConvTranspose1d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConvTranspose1d(o, k, **kw)

    def GroupNorm(
        self, groups: int, c: int, cls: type[nn.GroupNorm] = nn.GroupNorm, **kw: Any
    ) -> nn.Module:
        if cls is nn.GroupNorm:
            return lazynn.LazyGroupNorm(groups, **kw)
        # any class lazy in one line (the channels read from dim 1; the groups divide the probe)
        lazy_cls = lazynn.lazy(cls, num_channels=lazynn.Infer(dim=1, probe="num_groups"))
        return lazy_cls(groups, **kw)


EAGER, LAZY = Kit(), LazyKit()
