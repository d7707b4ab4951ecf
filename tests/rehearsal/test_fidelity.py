"""The rehearsal's contract (docs/design.md, "The rehearsal runs the model itself"): during
``build`` and ``summary``, the user's Python (forward, hooks, the functions they call) sees
what an eager forward of the same model sees: the same module objects (identity, ``id()``,
``type()``), shared lists, dicts, sets, closures and attributes, global and module hooks, every
call in order; what it writes to shared state is seen by what runs later in the same forward;
afterwards the model and the state it reaches are as they were.

Each model here is run three ways and compared: eager (sizes written in), ``lazynn.build``
(sizes learnt by the rehearsal), ``lazynn.summary`` (its table's output shape); the state the
forward shares is checked unchanged by the rehearsal.
"""

from __future__ import annotations

import array
import concurrent.futures
import copy
import dataclasses
import functools
import pickle
import random
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import lazynn

# --- shared state between blocks, one model per case -----------------------------------------


class FeatureList(nn.Module):
    """Blocks append their features to a list the model holds and concatenates (a U-Net's
    skip list, a feature pyramid's outputs)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.features: list[torch.Tensor] = []
        self.blocks = nn.ModuleList(_Append(self.features, lazy) for _ in range(3))
        self.head = lazynn.LazyLinear(2) if lazy else nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.features.clear()
        for block in self.blocks:
            x = block(x)
        return self.head(torch.cat(self.features, dim=-1))  # type: ignore[no-any-return]


class _Append(nn.Module):
    def __init__(self, features: list[torch.Tensor], lazy: bool) -> None:
        super().__init__()
        self.features = features  # the model's own list, shared
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        self.features.append(out)
        return out  # type: ignore[no-any-return]


class SharedCache(nn.Module):
    """One block writes a tensor to a dict the blocks share; a later block reads it (a
    cache of a shape, or of an earlier output)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        cache: dict[str, torch.Tensor] = {}
        self.writer = _Writer(cache, lazy)
        self.reader = _Reader(cache, lazy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reader(self.writer(x))  # type: ignore[no-any-return]


class _Writer(nn.Module):
    def __init__(self, cache: dict[str, torch.Tensor], lazy: bool) -> None:
        super().__init__()
        self.cache = cache
        self.fc = lazynn.LazyLinear(8) if lazy else nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        self.cache["skip"] = out
        return out  # type: ignore[no-any-return]


class _Reader(nn.Module):
    def __init__(self, cache: dict[str, torch.Tensor], lazy: bool) -> None:
        super().__init__()
        self.cache = cache
        self.fc = lazynn.LazyLinear(2) if lazy else nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([x, self.cache["skip"]], dim=-1))  # type: ignore[no-any-return]


#: a registry keyed by id(block), filled in __init__, outside the model
WIDTHS: dict[int, int] = {}


class IdRegistry(nn.Module):
    """Blocks look their widths up by ``id(self)`` in a global registry (filled in
    ``__init__``) and in one the model holds."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.by_id: dict[int, int] = {}
        self.blocks = nn.ModuleList(_Registered(self.by_id, lazy, i) for i in range(3))
        for i, block in enumerate(self.blocks):
            WIDTHS[id(block)] = 4 + i
            self.by_id[id(block)] = i + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _Registered(nn.Module):
    def __init__(self, by_id: dict[int, int], lazy: bool, i: int) -> None:
        super().__init__()
        self.by_id = by_id
        # (what the eager layer takes: the block before's width, repeated i + 1 times)
        self.fc = lazynn.LazyLinear(4 + i) if lazy else nn.Linear((4, 8, 15)[i], 4 + i)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.fc.out_features == WIDTHS[id(self)]
        return self.fc(x.repeat(1, self.by_id[id(self)]))  # type: ignore[no-any-return]


class CountedCalls(nn.Module):
    """Identical blocks count their calls in a global counter; a later block's width depends
    on it (the memo of repeated blocks skipped the counting)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(_Counter(lazy, i) for i in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALLS[0] = 0
        return self.blocks(x)  # type: ignore[no-any-return]


CALLS = [0]


class _Counter(nn.Module):
    def __init__(self, lazy: bool, i: int) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(4 * max(i, 1), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALLS[0] += 1
        return self.fc(x.repeat(1, max(CALLS[0] - 1, 1)))  # type: ignore[no-any-return]


class CachesOutput(nn.Module):
    """Each block caches its output on itself; the next block reads the cache of the block
    before it (and so widens)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(_Cached(lazy, i) for i in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        previous: _Cached | None = None
        for block in self.blocks:
            x = block(x, previous)
            previous = block
        return x


class _Cached(nn.Module):
    def __init__(self, lazy: bool, i: int) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(4 if i == 0 else 8, 4)
        self.out: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, previous: _Cached | None) -> torch.Tensor:
        if previous is not None and previous.out is not None:
            x = torch.cat([x, previous.out], dim=-1)
        self.out = self.fc(x)
        return self.out


class BranchesOnType(nn.Module):
    """A forward that dispatches on ``type()`` of a module in a later identical block."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4), nn.GELU())
              for _ in range(3))
        )  # fmt: skip
        self.head = lazynn.LazyLinear(2) if lazy else nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)
        if type(self.blocks[2][1]) is nn.GELU:  # (not isinstance: exactly the class)
            x = torch.cat([x, x], dim=-1)
        return self.head(x)  # type: ignore[no-any-return]


#: name -> (factory(lazy), example shape, the eager output shape)
MODELS: dict[str, tuple[Callable[[bool], nn.Module], tuple[int, ...]]] = {
    "feature-list": (FeatureList, (2, 4)),
    "shared-cache": (SharedCache, (2, 4)),
    "id-registry": (IdRegistry, (2, 4)),
    "counted-calls": (CountedCalls, (2, 4)),
    "caches-output": (CachesOutput, (2, 4)),
    "branches-on-type": (BranchesOnType, (2, 4)),
}


def _same_values(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa
    )


@pytest.mark.parametrize("name", MODELS)
def test_build_equals_the_eager_model(name: str) -> None:
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    eager = factory(False)
    x = torch.randn(shape)
    expected = eager(x)
    torch.manual_seed(0)
    built = lazynn.build(factory(True), shape)
    assert _same_values(built, eager)
    assert torch.equal(built(x), expected)
    torch.manual_seed(0)
    assert _same_values(lazynn.build(factory, shape), eager)


@pytest.mark.parametrize("name", MODELS)
def test_the_summary_reports_the_eager_output(name: str) -> None:
    factory, shape = MODELS[name]
    eager = factory(False)
    out = eager(torch.randn(shape))
    for target in (factory(True), eager, factory):
        report = lazynn.summary(target, shape)
        assert report.rows[0].outputs[0].shape == tuple(out.shape), target
        assert report.total_parameters == sum(p.numel() for p in eager.parameters())


def _graph(model: nn.Module) -> dict[str, Any]:
    """The Python state the forward shares: each module's attributes (tensors by identity),
    the lists and dicts they hold, copied one level down."""
    out: dict[str, Any] = {}
    for path, module in model.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, (list, dict)):
                out[f"{path}:{key}"] = copy.copy(value)
            elif isinstance(value, (torch.Tensor, nn.Module)) or value is None:
                out[f"{path}:{key}"] = id(value)
            elif isinstance(value, (int, float, str, bool)):
                out[f"{path}:{key}"] = value
    return out


@pytest.mark.parametrize("name", MODELS)
def test_the_model_is_as_it_was_after_a_rehearsal(name: str) -> None:
    """After a summary, and a summary with the training estimate (which runs the model's
    forward again, on fake tensors: the same contract)."""
    factory, shape = MODELS[name]
    size = 4 * sum(p.numel() for p in factory(False).parameters())
    for model in (factory(True), factory(False)):
        before = _graph(model)
        rng = torch.get_rng_state()
        lazynn.summary(model, shape)
        assert _graph(model) == before
        memory = lazynn.summary(model, shape, training=True).memory
        assert memory is not None
        assert memory.params == size
        assert _graph(model) == before
        assert torch.equal(torch.get_rng_state(), rng)


# --- hooks -------------------------------------------------------------------------------------


def test_a_global_hook_sees_every_call_in_order() -> None:
    """A global forward hook (a profiler's) sees the model's own modules, every call of each,
    in the eager order: the four identical blocks are all run."""

    def make(lazy: bool) -> nn.Module:
        return nn.Sequential(
            *(nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4), nn.GELU())
              for _ in range(4))
        )  # fmt: skip

    seen: list[tuple[int, str]] = []

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        seen.append((id(module), type(module).__name__))

    eager = make(False)
    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        eager(torch.randn(2, 4))
        expected = list(seen)
        seen.clear()
        model = make(True)
        lazynn.summary(model, (2, 4))
        in_summary = list(seen)
        seen.clear()
        lazynn.build(model, (2, 4))
        in_build = list(seen)
    finally:
        handle.remove()
    ids = {id(m): p for p, m in model.named_modules()}
    eager_ids = {id(m): p for p, m in eager.named_modules()}
    as_paths = [(eager_ids[i], k) for i, k in expected]
    assert [(ids[i], k) for i, k in in_summary] == as_paths
    assert [(ids[i], k) for i, k in in_build] == as_paths


# --- functions and modes blocks share ---------------------------------------------------------


def test_blocks_reaching_one_module_through_a_shared_function_each_run() -> None:
    """Blocks alike but for a function they share that calls one module of the model (a
    router, a gate, whose counter picks the expert): each call reaches that module."""

    class Router(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(lazynn.LazyLinear(8) for _ in range(3))
            self.k = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.k += 1
            return self.experts[(self.k - 1) % 3](x)  # type: ignore[no-any-return]

    class Block(nn.Module):
        def __init__(self, route: Any) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.route = route

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.route(self.fc(x))  # type: ignore[no-any-return]

    class Net(nn.Module):
        def __init__(self, how: str) -> None:
            super().__init__()
            self.router = router = Router()

            def route(x: torch.Tensor) -> torch.Tensor:
                return router(x)  # type: ignore[no-any-return]

            shared = {
                "closure": route,
                "method": router.__call__,
                "partial": functools.partial(router),
            }
            self.blocks = nn.ModuleList(Block(shared[how]) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    for how in ("closure", "method", "partial"):
        report = lazynn.summary(Net(how), (2, 8))
        calls = {r.path: r.calls for r in report.rows if r.path.startswith("router")}
        assert calls == {
            "router": 3,
            "router.experts": 0,
            **{f"router.experts.{i}": 1 for i in range(3)},
        }, how
        built = lazynn.build(Net(how), (2, 8))
        assert [e.in_features for e in built.router.experts] == [8, 8, 8]


def test_each_block_runs_in_its_own_mode() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y if self.training else y[:, :2]

    model = nn.Sequential(Block(), Block(), lazynn.LazyLinear(3))
    model[1].eval()
    assert lazynn.build(model, (2, 8))[2].in_features == 2


# --- threads -----------------------------------------------------------------------------------


def test_another_thread_reads_and_runs_the_real_model_while_it_rehearses() -> None:
    """The rehearsal sees the model's tensors as meta on its own thread only: another thread
    reading them meanwhile reads the real ones, and its call of an eager module runs on them,
    at once (forced: the forward waits on events)."""
    reached, go = threading.Event(), threading.Event()

    class Pause(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.is_meta:
                reached.set()
                assert go.wait(30)
            return x

    model = nn.Sequential(nn.Linear(4, 4), Pause(), lazynn.LazyLinear(2))
    weight = model[0].weight
    summary = threading.Thread(target=lambda: lazynn.summary(model, (2, 4)))
    summary.start()
    try:
        assert reached.wait(30)
        assert not weight.is_meta
        assert model[0].weight is weight
        out = model[0](torch.ones(1, 4))  # (another thread's call: its own, real)
    finally:
        go.set()
        summary.join(30)
    assert torch.equal(out, torch.nn.functional.linear(torch.ones(1, 4), weight, model[0].bias))
    assert lazynn.is_lazy(model[2])


def test_a_worker_left_running_by_a_failed_forward_ends_without_the_runs_modes() -> None:
    """A forward that fails while a worker still runs a block of it: the rehearsal does not
    wait; the worker's call ends under the run's modes, then its thread is left without them
    (a tensor made there later is a real one). Forced: the worker goes on once the summary
    has raised."""
    started, finish = threading.Event(), threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(1)

    class Slow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            started.set()
            assert finish.wait(30)
            return x * 2

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.slow = Slow()
            self.fc = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.running = pool.submit(self.slow, x)
            assert started.wait(30)
            raise ValueError("the forward fails while its worker runs")

    model = Net()
    try:
        with pytest.raises(lazynn.InferenceError, match="the forward fails"):
            lazynn.summary(model, (2, 4))
        finish.set()
        assert pool.submit(lambda: torch.zeros(1).device.type).result(30) == "cpu"
        assert not nn.modules.module._global_forward_hooks  # (the run's: gone with it)
    finally:
        finish.set()
        pool.shutdown(wait=True)


def test_a_build_whose_forward_runs_blocks_on_other_threads_finishes() -> None:
    """A forward that runs blocks on worker threads, in a build (whose thread holds the build
    lock throughout): the workers' calls run under the rehearsal's device (their blocks'
    tensors seen as meta), and are recorded."""

    class Branch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Sequential(nn.Linear(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    pool = concurrent.futures.ThreadPoolExecutor(2)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList(Branch() for _ in range(3))
            self.head = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            outs = [pool.submit(b, x[: i + 1]).result(30) for i, b in enumerate(self.branches)]
            return self.head(torch.cat(outs))  # type: ignore[no-any-return]

    try:
        done: list[nn.Module] = []
        thread = threading.Thread(target=lambda: done.append(lazynn.build(Net(), (3, 8))))
        thread.start()
        thread.join(60)
        assert done, "the build did not finish"
        assert done[0].head.in_features == 8
    finally:
        pool.shutdown(wait=False)


# --- generated forwards that share state between blocks ---------------------------------------

#: how a block touches the state it shares: (name, what it does with x and the shared state)
_KINDS = ("list", "dict", "counter", "id-registry", "previous-output", "hook")


class _Shared(nn.Module):
    """Blocks that share Python state one way each (a list, a dict, a counter, a registry by
    id, the previous block's output, a hook that widens the input) and so widen their input
    by what they read."""

    def __init__(self, kinds: list[str], widths: list[int]) -> None:
        super().__init__()
        self.state: dict[str, Any] = {"list": [], "dict": {}, "counter": [0], "ids": {}}
        self.blocks = nn.ModuleList(
            _SharedBlock(kind, width, self.state) for kind, width in zip(kinds, widths, strict=True)
        )
        for i, block in enumerate(self.blocks):
            self.state["ids"][id(block)] = i % 2 + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state["list"].clear()
        self.state["dict"].clear()
        self.state["counter"][0] = 0
        previous = None
        for block in self.blocks:
            x, previous = block(x, previous), x
        return x


class _SharedBlock(nn.Module):
    def __init__(self, kind: str, width: int, state: dict[str, Any]) -> None:
        super().__init__()
        self.kind, self.state = kind, state
        self.fc = lazynn.LazyLinear(width)
        if kind == "hook":
            self.register_forward_pre_hook(_widen_hook)

    def forward(self, x: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        state, kind = self.state, self.kind
        if kind == "list":
            state["list"].append(x)
            x = torch.cat(state["list"], dim=-1)
        elif kind == "dict":
            if "last" in state["dict"]:
                x = torch.cat([x, state["dict"]["last"]], dim=-1)
            state["dict"]["last"] = x
        elif kind == "counter":
            state["counter"][0] += 1
            x = x.repeat(1, state["counter"][0])
        elif kind == "id-registry":
            x = x.repeat(1, state["ids"][id(self)])
        elif kind == "previous-output" and previous is not None:
            x = torch.cat([x, previous], dim=-1)
        return self.fc(x)  # type: ignore[no-any-return]


def _widen_hook(block: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, previous = args
    return (torch.cat([x, x], dim=-1), previous)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(_KINDS), min_size=2, max_size=5),
    widths=st.lists(st.integers(1, 5), min_size=5, max_size=5),
)
def test_generated_shared_state_forwards_build_and_summarize_as_eager(
    kinds: list[str], widths: list[int]
) -> None:
    widths = widths[: len(kinds)]
    x = torch.randn(2, 3)
    model = _Shared(kinds, widths)
    after_construction = torch.get_rng_state()
    # The eager program: a first call runs the forward once, for real, on a deep copy (whose
    # registry deepcopy keeps keyed by the original blocks' ids: rekeyed), drawing the
    # weights eager construction draws from here.
    reference = copy.deepcopy(model)
    reference.state["ids"] = {id(b): i % 2 + 1 for i, b in enumerate(reference.blocks)}
    expected = reference(x)
    torch.set_rng_state(after_construction)
    before = (list(model.state["list"]), dict(model.state["dict"]), list(model.state["counter"]))
    report = lazynn.summary(model, (2, 3))
    assert report.rows[0].outputs[0].shape == tuple(expected.shape)
    assert report.total_parameters == sum(p.numel() for p in reference.parameters())
    assert (
        list(model.state["list"]),
        dict(model.state["dict"]),
        list(model.state["counter"]),
    ) == before
    assert torch.equal(torch.get_rng_state(), after_construction)
    built = lazynn.build(model, (2, 3))
    assert _same_values(built, reference)
    assert torch.equal(built(x), expected)


# --- what torch's kernels refuse ---------------------------------------------------------------


class _SubtractsMask(nn.Module):
    """A mask inverted with ``-`` (torch refuses it: ``~`` or ``logical_not()``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.fc = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x > 0
        inverted = {"bool - 1": mask - 1, "1 - bool": 1 - mask, "float - bool": x - mask}
        return self.fc(x * inverted[self.how])  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["bool - 1", "1 - bool", "float - bool"])
def test_a_forward_torch_refuses_is_refused_by_build_and_summary(how: str) -> None:
    """The meta kernels take a bool subtraction; torch's real kernels refuse it, and so do
    ``build`` and ``summary``, in torch's words, naming the module."""
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool") as eager:
        _SubtractsMask(how)(torch.randn(2, 4))
    model = _SubtractsMask(how)
    for run in (lambda: lazynn.build(model, (2, 4)), lambda: lazynn.summary(model, (2, 4))):
        with pytest.raises(lazynn.InferenceError, match=r"_SubtractsMask \(root\)") as info:
            run()
        assert str(eager.value) in str(info.value)
        assert lazynn.is_lazy(model)


# --- the figures are the model's --------------------------------------------------------------


class _GrowsItsBuffer(nn.Module):
    """timm's ConViT: a non-persistent buffer the forward replaces by one of the input's size
    (its relative positions, computed at the first call)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(8, 4)
        self.register_buffer("rel_indices", torch.zeros(1, 1, 1, 3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        if self.rel_indices.shape[1] != n:
            self.rel_indices = torch.zeros(1, n, n, 3, device=x.device)
        return self.fc(x) + self.rel_indices.sum()  # type: ignore[no-any-return]


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_the_summarys_figures_are_the_models_not_the_forwards(form: str) -> None:
    """The summary's totals equal the model's as built: a buffer the forward replaces counts
    as the model holds it."""
    target = _GrowsItsBuffer() if form == "instance" else _GrowsItsBuffer
    report = lazynn.summary(target, (2, 16, 8))
    built = lazynn.build(_GrowsItsBuffer, (2, 16, 8))
    assert report.buffer_bytes == sum(b.nbytes for b in built.buffers()) == 12
    assert report.total_parameters == sum(p.numel() for p in built.parameters())


# --- state of other kinds, copies, modes (found by review) ------------------------------------


class _HoldsState(nn.Module):
    """A forward that moves or fills what its model holds besides modules and tensors: a
    Python and numpy random generators (LayerDrop), arrays, a weak dictionary of modules, an
    instance's lru_cache (a full one too), a slot the forward sets (on a class whose
    __getattr__ answers for unset ones), an object of a dataclass made by make_dataclass, a
    distribution's parameters, a dead weak proxy (a trainer's back reference)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)
        self.python_random = random.Random(0)
        self.numpy_random = np.random.default_rng(0)
        self.legacy_random = np.random.RandomState(0)
        self.bits = np.random.PCG64(0)
        self.counts = array.array("d", [0.0, 0.0, 0.0])
        self.log = bytearray()
        self.seen: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()
        self.shape_of = functools.lru_cache(maxsize=None)(lambda n: (n, 3))
        self.last = functools.lru_cache(maxsize=1)(lambda x: x * 2)
        self.last(0)  # (full)
        trainer = _Slotted()
        self.gone = weakref.proxy(trainer)  # (dead once __init__ returns)
        self.slotted = _Slotted()
        self.made = dataclasses.make_dataclass("Made", [("calls", int)])(0)
        self.prior = torch.distributions.Normal(torch.zeros(3), torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.python_random.random()
        self.numpy_random.random()
        self.legacy_random.random_sample()
        self.bits.random_raw()
        for i in range(3):
            self.counts[i] += 1
        self.log += b"called"
        self.seen[self.fc] = x
        self.shape_of(x.shape[0])
        self.last(x)
        self.slotted.cache = x
        self.made.calls += 1
        return self.fc(x) + self.prior.loc  # type: ignore[no-any-return]


class _Slotted:
    __slots__ = ("__weakref__", "cache")

    def __getattr__(self, name: str) -> Any:
        return None  # (an unset slot reads None here: a default)


def test_state_of_other_kinds_is_put_back() -> None:
    model = _HoldsState()
    before = (
        model.python_random.random(),
        model.numpy_random.random(),
        model.legacy_random.random_sample(),
        model.bits.random_raw(),
    )
    model = _HoldsState()
    lazynn.summary(model, (2, 4))
    lazynn.build(model, (2, 4))
    after = (
        model.python_random.random(),
        model.numpy_random.random(),
        model.legacy_random.random_sample(),
        model.bits.random_raw(),
    )
    assert after == before
    assert model.counts.tolist() == [0, 0, 0]
    assert model.log == bytearray()
    assert model.last.cache_info().currsize == 0  # (its one entry was the run's: dropped)
    assert len(model.seen) == 0
    assert model.shape_of.cache_info().currsize == 0
    with pytest.raises(AttributeError):
        _Slotted.cache.__get__(model.slotted)  # type: ignore[attr-defined]
    assert model.made.calls == 0
    assert model(torch.ones(2, 4)).shape == (2, 3)  # (nothing of the run left to trip on)


class _CopiesItself(nn.Module):
    """A forward that keeps a copy (an EMA teacher made at the first call) and pickles one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        teacher = copy.deepcopy(self.fc)
        pickle.dumps(self.fc)
        return self.head(self.fc(x) + teacher(x))  # type: ignore[no-any-return]


def test_a_forward_that_copies_or_pickles_a_module_is_rehearsed() -> None:
    assert lazynn.summary(_CopiesItself(), (2, 4)).rows[0].outputs[0].shape == (2, 2)
    assert lazynn.build(_CopiesItself(), (2, 4)).head.in_features == 4


class _Ema(nn.Module):
    """A forward inside torch.inference_mode() that updates a buffer in place, then one
    outside it that does so again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)
        self.register_buffer("average", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            y = self.fc(x)
            self.average.mul_(0.9)
        self.average.add_(0.1)
        return y + self.average  # type: ignore[no-any-return]


def test_stand_ins_made_inside_inference_mode_take_writes_outside_it() -> None:
    assert lazynn.summary(_Ema(), (2, 4)).rows[0].outputs[0].shape == (2, 3)


class _KeepsAWeight(nn.Module):
    """A lazy layer's weight kept in a dict in __init__ and read after the layer's call."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = lazynn.LazyLinear(3)
        self.shared = {"w": self.enc.weight}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(x) @ self.shared["w"]  # type: ignore[no-any-return]


def test_a_lazy_layers_weight_held_elsewhere_is_the_layers_in_the_run() -> None:
    assert lazynn.summary(_KeepsAWeight(), (2, 3)).rows[0].outputs[0].shape == (2, 3)
    model = lazynn.build(_KeepsAWeight(), (2, 3))
    assert model.shared["w"] is model.enc.weight


def test_modules_run_on_workers_count_their_flops() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(2)

    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            outs = [pool.submit(b, x).result(30) for b in self.branches]
            return torch.stack(outs).sum(0)

    try:
        report = lazynn.summary(Branches(), (4, 8))
    finally:
        pool.shutdown(wait=True)
    rows = {r.path: r.flops for r in report.rows}
    assert rows["branches.0"] == rows["branches.2"] == 2 * 4 * 8 * 8
    assert report.total_flops == 3 * 2 * 4 * 8 * 8
