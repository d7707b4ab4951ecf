"""Tensors computed in ``__init__`` replayed in bands of rows (issue 37): a rope cache (LLaMA's
``freqs_cis``, GPT-NeoX's ``cat`` of frequencies) is made a few rows at a time when every step
that makes it and its large intermediates is row-wise, so that a replay holds the tensor and
one band, bit for bit the whole computation's values; what is not row-wise (a transcendental
function, a step that mixes rows, an intermediate something else reads) is computed whole.

Bands are made small (a budget of a few KiB) so that small tensors take many bands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import lazynn._program.bands as bands_module
from allocations import Allocations
from lazynn._program.bands import plan
from lazynn._program.record import Recorder
from lazynn._program.replay import Replay


def llama_freqs_cis(dim: int = 16, end: int = 300, theta: float = 10000.0) -> torch.Tensor:
    """Meta's ``precompute_freqs_cis`` (torchtitan's llama3 keeps it as a buffer)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def neox_frequencies(dim: int = 16, end: int = 300) -> torch.Tensor:
    """GPT-NeoX's rotary table before its cos and sin: float positions, ``cat`` of two halves."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    t = torch.arange(end, dtype=inv_freq.dtype)
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    return torch.cat((freqs, freqs), dim=-1)


def shifted_views() -> torch.Tensor:
    """Views into rows (a column slice), broadcasting both ways, a cast, an alpha of 1."""
    base = torch.arange(500 * 7).view(500, 7).float()
    scale = torch.rand(1, 6)
    mixed = base[:, 1:] * scale + torch.ones(500, 6, dtype=torch.float64)
    return mixed.to(torch.bfloat16).add(torch.full((6,), 0.5, dtype=torch.bfloat16), alpha=1)


def three_dims() -> torch.Tensor:
    """A 3-D table, an int arange cast, division, negation, zeros and a clone."""
    pos = torch.arange(256).view(256, 1, 1)
    table = (pos / torch.rand(4, 5)).neg() - torch.zeros(256, 4, 5)
    return table.clone()


CASES: dict[str, Callable[[], torch.Tensor]] = {
    "llama_freqs_cis": llama_freqs_cis,
    "neox_frequencies": neox_frequencies,
    "shifted_views": shifted_views,
    "three_dims": three_dims,
}


def _record(make: Callable[[], Any]) -> tuple[Recorder, Any]:
    with torch.device("meta"), Recorder() as recorder:
        made = make()
    return recorder, made


def _bands(make: Callable[[], torch.Tensor], budget: int = 4096) -> list[Any]:
    recorder, made = _record(make)
    target = recorder.view_of(made).storage
    return list(plan(recorder.tape, {target}, budget=budget).values())


@pytest.mark.parametrize("budget", [256, 4096, 1 << 22])
@pytest.mark.parametrize("name", list(CASES))
def test_a_computed_tensor_in_bands_is_the_whole_computation_bit_for_bit(
    name: str, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    make = CASES[name]
    monkeypatch.setattr(bands_module, "BUDGET", budget)
    (band,) = _bands(make, budget)
    assert band.rows > band.per or budget == 1 << 22, (band.rows, band.per)
    for seed in range(3):
        torch.manual_seed(seed)
        eager = make()
        end = torch.get_rng_state()
        recorder, made = _record(make)
        torch.manual_seed(seed)
        replay = Replay(recorder.tape, "cpu")
        (value,) = replay.run({recorder.view_of(made): None}).values()
        replay.finish()
        assert value.dtype == eager.dtype
        assert torch.equal(value, eager), (name, seed)
        assert torch.equal(torch.get_rng_state(), end)


def test_a_replay_holds_the_tensor_and_one_band() -> None:
    """LLaMA's ``freqs_cis`` of 4096 x 64: the whole computation holds two float tables of its
    size beside it (the angles and the ones); in bands, one budget's worth."""
    make = lambda: llama_freqs_cis(128, 4096)  # noqa: E731
    recorder, made = _record(make)
    kept = made.numel() * made.element_size()
    for banded in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not banded:
                patch.setattr(bands_module, "_POINTWISE", frozenset())
            with Allocations() as allocated:
                Replay(recorder.tape, "cpu").run({recorder.view_of(made): None})
        if banded:
            assert allocated.peak <= kept + bands_module.BUDGET, allocated.peak
        else:
            assert allocated.peak >= 2 * kept, allocated.peak


def _cos_table() -> torch.Tensor:
    return torch.outer(torch.arange(300).float(), torch.rand(8)).cos()


def _cos_inside() -> torch.Tensor:
    angles = torch.outer(torch.arange(300).float(), torch.rand(8)).cos()
    return torch.polar(torch.ones_like(angles), angles)


def _cumsum() -> torch.Tensor:
    return torch.ones(300, 8).cumsum(0) * 2


def _alpha() -> torch.Tensor:
    return torch.ones(300, 8).add(torch.rand(300, 8), alpha=0.5)


def _complex_product() -> torch.Tensor:
    angles = torch.outer(torch.arange(300).float(), torch.rand(8))
    return torch.polar(torch.ones_like(angles), angles) * torch.polar(torch.ones(8), torch.ones(8))


def _read_elsewhere() -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.outer(torch.arange(300), torch.rand(8))
    return torch.polar(torch.ones_like(angles), angles), angles.sum()


def _written_between() -> torch.Tensor:
    scale = torch.ones(8)
    angles = torch.outer(torch.arange(300), scale)
    scale.mul_(3.0)  # (an input read whole, written after its reader and before the target)
    return torch.polar(torch.ones_like(angles), angles * scale)


def _float_arange_too_long() -> torch.Tensor:
    """bfloat16 holds whole numbers to 256 only: the arange is computed whole."""
    positions = torch.arange(300, dtype=torch.bfloat16).view(300, 1)
    return positions * torch.ones(300, 4, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("make", "banded"),
    [
        (_cos_table, set()),  # (a transcendental function makes it: whole)
        (_cos_inside, {"aten::ones_like.default", "aten::polar.default"}),  # (cos whole)
        (_cumsum, set()),  # (a step that mixes rows: its output whole, so the product too)
        (_alpha, set()),  # (a fused multiply on vectors: whole)
        (_complex_product, set()),  # (complex products are fused on vectors: whole)
        (_read_elsewhere, {"aten::ones_like.default", "aten::polar.default"}),
        (_written_between, set()),
        (_float_arange_too_long, {"aten::ones.default", "aten::mul.Tensor"}),
    ],
)
def test_what_is_not_row_wise_is_computed_whole_and_still_exact(
    make: Callable[[], Any], banded: set[str]
) -> None:
    recorder, made = _record(make)
    first = made[0] if isinstance(made, tuple) else made
    target = recorder.view_of(first).storage
    found = list(plan(recorder.tape, {target}, budget=1024).values())
    ops = {recorder.tape.steps[i].op for band in found for i in band.makes}
    assert ops == banded, ops
    torch.manual_seed(0)
    eager = make()
    eager = eager[0] if isinstance(eager, tuple) else eager
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bands_module, "BUDGET", 1024)
        torch.manual_seed(0)
        (value,) = Replay(recorder.tape, "cpu").run({recorder.view_of(first): None}).values()
    assert torch.equal(value, eager)
