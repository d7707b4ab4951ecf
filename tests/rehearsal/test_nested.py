"""lazynn inside the forward it rehearses: a forward that calls ``lazynn.summary`` or
``lazynn.build`` on its own submodule. Each summary counts its own FLOPs, a build inside the
forward builds what an eager first call's would, and the model built or summarized from the
outside is the eager one."""

from __future__ import annotations

import concurrent.futures
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import lazynn


class Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))  # type: ignore[no-any-return]


#: the inner summaries a forward made: outside the model (what the model reaches, a
#: rehearsal puts back as it was; state outside it is written as a forward writes it)
SEEN: list[lazynn.Summary] = []


class Outer(nn.Module):
    """A body of blocks (memoized in a rehearsal: children of a Sequential with submodules)
    and a head; the forward does ``how`` with its body first."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.body = nn.Sequential(Sub(), Sub(), lazynn.LazyLinear(4))
        self.head = nn.Linear(4, 4)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "summary":
            SEEN.append(lazynn.summary(self.body, x))
        elif self.how == "summary_training":
            SEEN.append(lazynn.summary(self.body, x, training=True))
        elif self.how == "build":
            lazynn.build(self.body, x)
        elif self.how == "build_assigned":
            self.body = lazynn.build(self.body, x)
        return self.head(self.body(x))  # type: ignore[no-any-return]


class EagerSub(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(features, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))  # type: ignore[no-any-return]


class EagerOuter(nn.Module):
    """Outer with its sizes written, constructed as an eager program would."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(EagerSub(16), EagerSub(8), nn.Linear(8, 4))
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # type: ignore[no-any-return]


X = torch.randn(2, 16)
HOWS = ["summary", "summary_training", "build", "build_assigned"]


def _rows(report: lazynn.Summary) -> dict[str, Any]:
    return {r.path: (r.type, r.calls, r.flops, r.outputs) for r in report.rows}


@pytest.mark.parametrize("how", HOWS)
def test_a_summary_of_the_model_counts_the_forwards_flops_once(how: str) -> None:
    """Not the inner summary's (or build's) own rehearsal, which runs inside the forward."""
    plain = lazynn.summary(Outer("nothing"), X)
    model = Outer(how)
    report = lazynn.summary(model, X)
    linears = 2 * 16 * 8 + 2 * 8 * 8 + 2 * 8 * 4 + 2 * 4 * 4  # (batch x in x out each)
    assert report.total_flops == plain.total_flops == 2 * linears
    assert _rows(report) == _rows(plain)
    assert lazynn.is_lazy(model)


@pytest.mark.parametrize("how", ["summary", "summary_training"])
def test_each_nested_summary_counts_its_own(how: str) -> None:
    model = Outer(how)
    SEEN.clear()
    outer = lazynn.summary(model, X)
    (inner,) = SEEN
    body = lazynn.summary(Outer("nothing").body, X)
    assert inner.total_flops == body.total_flops == outer.total_flops - 2 * 2 * 4 * 4
    assert _rows(inner) == _rows(body)
    if how == "summary_training":
        assert inner.memory == lazynn.summary(Outer("nothing").body, X, training=True).memory


def test_a_nested_summary_counts_inside_a_symbolic_batch_too() -> None:
    spec = lazynn.Spec(("B", 16))
    assert lazynn.summary(Outer("summary"), spec).total_flops == (
        lazynn.summary(Outer("nothing"), spec).total_flops
    )


@pytest.mark.parametrize("how", HOWS)
def test_the_model_built_from_outside_is_the_eager_one(how: str) -> None:
    """lazynn.build(Outer(how), x) equals the eager program with its sizes written, bit for
    bit, and leaves the generator where that program leaves it; a summary moves nothing."""
    torch.manual_seed(0)
    eager = EagerOuter()
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = Outer(how)
    before = torch.get_rng_state()
    lazynn.summary(model, X)
    assert torch.equal(torch.get_rng_state(), before)
    assert lazynn.build(model, X) is model
    assert torch.equal(torch.get_rng_state(), after)
    assert not lazynn.is_lazy(model)
    assert type(model.body[0].fc) is nn.Linear
    for mine, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(model(X), eager(X))  # (its forward's build or summary: of a built body)


@pytest.mark.parametrize("how", ["build", "build_assigned"])
def test_a_build_inside_the_forward_builds_at_a_first_call(how: str) -> None:
    """As a build does, warning that the head drew after the body's construction."""
    model = Outer(how)
    with pytest.warns(UserWarning, match="drawn after the first lazy layer was constructed"):
        out = model(X)
    assert out.shape == (2, 4)
    assert not lazynn.is_lazy(model)
    assert model.body[2].in_features == 8


class ChannelsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(lazynn.LazyConv2d(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lazynn.build(self.body, x)
        return self.body(x)  # type: ignore[no-any-return]


def test_what_a_nested_build_read_ambiguously_is_warned_once_by_the_build_of_the_model() -> None:
    """Named by its path in the model, as a build of the model without the inner one warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lazynn.build(ChannelsLast(), (2, 32, 32, 3))
    assert [str(w.message).split(" reads")[0] for w in caught] == ["LazyConv2d at 'body.0'"]
    assert caught[0].category is lazynn.AmbiguousInputWarning


def test_a_nested_summary_whose_forward_uses_workers_counts_once_in_the_outer() -> None:
    """The inner summary's workers are its own: the outer run counts its own calls only."""
    pool = concurrent.futures.ThreadPoolExecutor(2)

    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([pool.submit(b, x).result(30) for b in self.branches]).sum(0)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = Branches()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lazynn.summary(self.body, x)
            return self.body(x)  # type: ignore[no-any-return]

    try:
        report = lazynn.summary(Outer(), (4, 8))
    finally:
        pool.shutdown(wait=True)
    rows = {r.path: (r.calls, r.flops) for r in report.rows}
    assert rows["body.branches.0"] == (1, 2 * 4 * 8 * 8)
    assert report.total_flops == 2 * 2 * 4 * 8 * 8
