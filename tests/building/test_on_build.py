"""lazynn.on_build where the eager program's order matters: checkpoints, per-block queues,
models built inside a queued function, torch.compile, other threads.

Each test's eager program is what the lazy one must equal: construct, initialize (the queued
function), then load or run.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.nn.utils.parametrizations import weight_norm

import lazynn

X = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))


def zero_weights(m: nn.Sequential) -> None:
    for i in (0, 2):
        nn.init.zeros_(m[i].weight)


def make() -> tuple[nn.Sequential, lazynn.OnBuildHandle]:
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))
    return model, lazynn.on_build(model, zero_weights)


# --- checkpoints: loaded values always win ------------------------------------------------


@pytest.mark.parametrize("assign", [False, True])
def test_a_checkpoint_into_a_model_with_queued_init_keeps_the_checkpoints_values(
    assign: bool,
) -> None:
    source, _ = make()
    lazynn.build(source, X)
    with torch.no_grad():
        source[0].weight.fill_(1.0)
    target, handle = make()
    target.load_state_dict(source.state_dict(), assign=assign)
    assert not handle.pending  # it ran: before the values were copied
    for a, b in zip(target.state_dict().values(), source.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_load_with_queued_init_draws_as_the_eager_program() -> None:
    """construct (draws), initialize, load: the stream ends where the eager program's does."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    zero_weights(eager)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    target, _ = make()
    target.load_state_dict(eager.state_dict())
    assert torch.equal(torch.get_rng_state(), after)


def test_a_queued_weight_norm_takes_a_checkpoint_saved_with_weight_norm() -> None:
    source = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    weight_norm(source[0])
    with torch.no_grad():
        source[0].parametrizations.weight.original1.mul_(3.0)
    target = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))
    lazynn.on_build(target, lambda m: weight_norm(m[0]))
    target.load_state_dict(source.state_dict())
    assert target.state_dict().keys() == source.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    assert torch.equal(target(X), source(X))


def test_a_queued_copy_sees_the_constructed_values_never_uninitialized_memory() -> None:
    source, _ = make()
    lazynn.build(source, X)
    seen: list[torch.Tensor] = []
    torch.manual_seed(3)
    target = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))
    lazynn.on_build(target, lambda m: seen.append(m[0].weight.detach().clone()))
    target.load_state_dict(source.state_dict())
    torch.manual_seed(3)
    assert torch.equal(seen[0], nn.Linear(5, 4).weight)  # as constructed, before the load


# --- the order of the eager program ---------------------------------------------------------


class Block(nn.Module):
    """Initializes its own layer at the end of its __init__, through on_build."""

    def __init__(self, lazy: bool, width: int) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(width, 4)
        if lazy:
            lazynn.on_build(self, lambda b: nn.init.normal_(b.fc.weight))
        else:
            nn.init.normal_(self.fc.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["build", "meta+materialize", "first call"])
def test_per_block_queues_run_between_the_blocks_constructions(how: str) -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(Block(False, 5), Block(False, 4), Block(False, 4))
    torch.manual_seed(0)
    model = nn.Sequential(Block(True, 5), Block(True, 4), Block(True, 4))
    lazynn.on_build(model, lambda m: None)  # (a first call then builds the whole model)
    if how == "build":
        lazynn.build(model, X)
    elif how == "meta+materialize":
        lazynn.materialize(lazynn.build(model, X, device="meta"), "cpu")
    else:
        model(X)
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:lazynn.build. random numbers were drawn")  # (the outer drew)
@pytest.mark.parametrize("how", ["build", "first call", "materialize"])
def test_a_model_built_inside_a_queued_function_runs_its_own_queue(how: str) -> None:
    inner, inner_handle = make()
    outer, outer_handle = make()

    def fn(_: nn.Module) -> None:
        if how == "build":
            lazynn.build(inner, X)
        elif how == "first call":
            inner(X)
        else:
            lazynn.materialize(lazynn.build(inner, X, device="meta"), "cpu")

    lazynn.on_build(outer, fn)
    lazynn.build(outer, X)
    assert not outer_handle.pending
    assert not inner_handle.pending
    assert inner[0].weight.count_nonzero() == 0


# --- torch.compile --------------------------------------------------------------------------


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_model_builds_and_runs_its_queue_before_it_is_traced(fullgraph: bool) -> None:
    torch.manual_seed(0)
    model, handle = make()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=fullgraph)
    out = compiled(X)
    assert not handle.pending
    assert model[0].weight.count_nonzero() == 0
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    zero_weights(eager)
    assert torch.equal(out, eager(X))
    compiled(X)
    assert counter.frame_count >= 1  # it compiled (the model, built)
    assert "_initialize_hook" not in model.__dict__  # the protocol's attributes are gone


@pytest.mark.compile
@pytest.mark.slow
def test_a_compiled_function_calling_a_model_with_a_waiting_queue_warns() -> None:
    model, handle = make()

    @torch.compile(backend="eager")
    def step(x: torch.Tensor) -> torch.Tensor:
        return model(x)  # type: ignore[no-any-return]

    with pytest.warns(UserWarning, match=r"lazynn\.on_build: torch\.compile is building"):
        step(X)
    assert handle.pending  # it waits, and said so
    other = torch.compile(nn.Linear(5, 2), backend=CompileCounter())
    other(X)  # (nothing of the compiler is left broken)


# --- threads --------------------------------------------------------------------------------


def test_concurrent_first_calls_of_a_model_with_a_queue_all_get_their_output() -> None:
    """The first call builds the whole model from a twin (the model untouched meanwhile);
    the other threads wait at the build lock, then run the finished model."""
    release = threading.Event()
    model = nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(2))
    calls = []

    def paused(m: nn.Module) -> None:  # the queued function holds the build for a while
        calls.append(1)
        release.wait(30)

    lazynn.on_build(model, paused)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            out = model(X)
        except Exception as error:  # reported to the test
            out = error
        with lock:
            results.append(out)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    while not calls:  # the first thread is inside the queue, holding the build lock
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(30)
    assert calls == [1]
    assert all(isinstance(r, torch.Tensor) for r in results), results
    assert all(torch.equal(r, results[0]) for r in results)


def test_no_warning_is_left_by_on_build() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, _ = make()
        lazynn.build(model, X)


@pytest.mark.parametrize("how", ["run", "removed"])
def test_a_finished_queue_leaves_no_hook_behind(how: str) -> None:
    """Once the queue has run, or its handles are removed, the module holds none of its
    hooks (forward or load), however many times on_build was called."""
    model = nn.Sequential(lazynn.LazyLinear(3))
    hooks = (
        dict(model._forward_pre_hooks),
        dict(model._load_state_dict_pre_hooks),
        dict(model._load_state_dict_post_hooks),
    )
    handles = [lazynn.on_build(model, lambda m: None) for _ in range(3)]
    if how == "run":
        model(torch.randn(2, 5))
    else:
        for handle in handles:
            handle.remove()
    assert (
        dict(model._forward_pre_hooks),
        dict(model._load_state_dict_pre_hooks),
        dict(model._load_state_dict_post_hooks),
    ) == hooks


# --- a build on meta: queued work recorded, or run at materialize -----------------------------


def _lsuv(model: nn.Sequential) -> None:
    """A data-dependent init (LSUV-like): real data through the model, then a scale."""
    with torch.no_grad():
        out = model(X)
        model[0].weight.div_(out.std())


def test_work_that_feeds_real_data_through_the_model_gives_the_eager_numbers() -> None:
    """Real data through meta weights: each step that mixes them is computed for real (the
    weights' values from the program so far), and what it writes on the model is recorded."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4))
    _lsuv(eager)
    after = torch.rand(3)
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4))
    lazynn.on_build(model, _lsuv)
    lazynn.materialize(lazynn.build(model, X, device="meta"))
    assert torch.equal(model[0].weight, eager[0].weight)
    assert torch.equal(model[0].bias, eager[0].bias)
    assert torch.equal(torch.rand(3), after)


def _writes_then_fails(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[0].weight.normal_()
        model[0].weight.add_(X.sum())  # (fine)
        if model[0].weight.is_meta:  # (work that cannot run on meta, say)
            raise RuntimeError("needs allocated memory")


def test_work_that_fails_on_meta_is_refused_naming_it() -> None:
    """Refused (not run again later: its Python ran once already), the model left unbuilt
    and the generator where it was."""
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4))
    lazynn.on_build(model, _writes_then_fails)
    before = torch.get_rng_state()
    with pytest.raises(lazynn.LazynnError) as info:
        lazynn.build(model, X, device="meta")
    text = str(info.value)
    assert text.startswith("Sequential: expected work queued with lazynn.on_build that runs")
    assert "received _writes_then_fails, which failed there." in text
    assert "Fix: build on the device (lazynn.build(model, example))" in text
    assert isinstance(model[0], lazynn.LazyLinear)
    assert torch.equal(torch.get_rng_state(), before)


def _through_meta(make: Any, fns: list[Any]) -> nn.Module:
    model = make(lazy=True)
    for fn in fns:
        lazynn.on_build(model, fn)
    return lazynn.materialize(lazynn.build(model, X, device="meta"))


def _net(lazy: bool, bias: bool = True) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(5, 5))
    model.append(lazynn.LazyLinear(4, bias=bias) if lazy else nn.Linear(5, 4, bias=bias))
    return model.extend([nn.ReLU(), nn.Linear(4, 3)])


_OUTSIDE = nn.Linear(4, 3)  # (a tensor outside the model that queued work writes)


def _scale_by_output(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[1].weight.div_(model(X).std())  # (real data through meta weights)


def _write_real_from_meta(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[0].bias.add_(model[1].weight.sum())  # (an eager layer's real tensor)
        _OUTSIDE.weight.zero_().add_(model[3].weight)


def _zero_the_head(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[3].bias.zero_()


def _reads_the_head(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[1].weight.mul_(model[3].bias.sum())


@pytest.mark.parametrize(
    ("bias", "fns"),
    [
        (False, [_scale_by_output]),
        (True, [_write_real_from_meta]),
        (True, [_reads_the_head, _zero_the_head]),
        (True, [_scale_by_output, _zero_the_head, _write_real_from_meta]),
    ],
    ids=["no bias", "real from meta", "read then overwritten", "all"],
)
def test_queued_work_mixing_real_and_meta_tensors_gives_the_eager_numbers(
    bias: bool, fns: list[Any]
) -> None:
    """Steps that mix the model's meta tensors with real ones (a real batch, an eager layer's
    tensors, a tensor outside the model) are computed for real where torch would return
    uninitialized memory or do nothing (found by review); each function runs once."""
    _OUTSIDE.weight.data.fill_(7.0)
    torch.manual_seed(0)
    eager = _net(False, bias)
    for fn in fns:
        fn(eager)
    expected_outside = _OUTSIDE.weight.detach().clone()
    after = torch.rand(3)
    _OUTSIDE.weight.data.fill_(7.0)
    torch.manual_seed(0)
    model = _through_meta(lambda lazy: _net(lazy, bias), fns)
    assert torch.equal(torch.rand(3), after)
    for (name, mine), theirs in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
    assert torch.equal(_OUTSIDE.weight, expected_outside)


@pytest.mark.parametrize("door", ["build", "meta", "threads"])
def test_a_queued_function_that_calls_the_model_runs_to_its_end_before_the_next(
    door: str,
) -> None:
    """Its call of the model does not run the queue's next function first (the forward's
    queue hook waits while a function of that queue runs), as eager code runs them in order
    (found by review: the next one ran inside the first one's forward)."""
    log: list[str] = []

    def scale(model: nn.Sequential) -> None:
        log.append("scale")
        with torch.no_grad():
            model[0].weight.div_(model(X).std())
        log.append("scaled")

    def zero(model: nn.Sequential) -> None:
        log.append("zero")
        with torch.no_grad():
            model[2].bias.zero_()

    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    scale(eager)
    zero(eager)
    expected, log[:] = list(log), []
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(3))
    lazynn.on_build(model, scale)
    lazynn.on_build(model, zero)
    if door == "meta":
        lazynn.materialize(lazynn.build(model, X, device="meta"))
    else:
        lazynn.build(model, X, threads=2 if door == "threads" else 1)
    assert log == expected
    for mine, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(mine, theirs)
