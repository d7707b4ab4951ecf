"""Memoized rehearsal: identical repeated blocks reuse one block's result.

The rehearsal with memoization must learn exactly what the plain rehearsal learns (every
module's call shapes, every lazy layer's sizes, every tensor), only faster.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import lazynn
from lazynn._rehearsal.learnt import Rehearsal
from lazynn._rehearsal.rehearse import rehearse
from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import models

CASES = {
    **{name: (ref.lazy, ref.example) for name, ref in models.REFERENCE.items()},
    "llama_tiny": models.LAZY_ONLY["llama_tiny"],
}


def learnt(model: nn.Module, r: Rehearsal) -> dict[str, object]:
    paths = {id(m): p for p, m in model.named_modules()}
    return {
        "calls": {p: (c.inputs, c.outputs) for p, c in r.calls.items()},
        "types": r.types,
        "tensors": {
            p: [(i.name, i.shape, i.dtype, i.requires_grad) for i in t]
            for p, t in r.tensors.items()
        },
        "sizes": {paths[id(m)]: s for m, s in r.sizes.items()},
        "unreached": r.unreached,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_memoized_rehearsal_learns_the_same(name: str) -> None:
    factory, example = CASES[name]
    model = factory()
    x = example("cpu")
    plain = learnt(model, rehearse(model, (x,), {}, memoize=False))
    memo = learnt(model, rehearse(model, (x,), {}, memoize=True))
    assert memo == plain


def test_identical_blocks_are_skipped() -> None:
    calls: list[int] = []

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return self.fc(x)

    model = nn.Sequential(*[Block() for _ in range(6)])
    r = rehearse(model, ((2, 8),), {})
    assert len(calls) == 1  # one block ran; five reused its result
    assert len(r.sizes) == 6
    assert all(s == {"in_features": 8} for s in r.sizes.values())
    built = lazynn.build(model, (2, 8))
    assert all(type(b.fc) is nn.Linear for b in built)


def test_blocks_that_differ_or_carry_hooks_run() -> None:
    calls: list[int] = []

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return self.fc(x)

    model = nn.Sequential(Block(8), Block(8), Block(8), Block(4))
    model[1].register_forward_hook(lambda m, a, o: None)
    rehearse(model, ((2, 8),), {})
    # block 0 runs, 1 carries a hook so it runs, 2 reuses 0's result, 3 differs so it runs
    assert len(calls) == 3


def test_training_mode_is_part_of_a_block_identity() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y if self.training else y[:, :2]

    model = nn.Sequential(Block(), Block(), lazynn.LazyLinear(3))
    model[1].eval()
    plain = learnt(model, rehearse(model, ((2, 8),), {}, memoize=False))
    memo = learnt(model, rehearse(model, ((2, 8),), {}, memoize=True))
    assert memo == plain
    assert memo["sizes"]["2"] == {"in_features": 2}
