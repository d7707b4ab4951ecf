"""The meta rehearsal (lazynn.build, lazynn.summary) runs the model's own call path on a twin of
it: never silently wrong, never changing the model, safe beside other threads, and its errors
say what happened.
"""

from __future__ import annotations

import copy
import threading
import types
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import lazynn
from pauses import MetaPause

# --- the model's real call path -------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


def doubled(self: Block, x: torch.Tensor) -> torch.Tensor:
    """A forward set on the instance, as patching and adapter libraries do."""
    return self.fc(torch.cat([x, x], dim=-1))  # type: ignore[no-any-return]


def test_a_forward_set_on_the_instance_is_the_one_rehearsed() -> None:
    model = nn.Sequential(Block(), Block())
    model[0].forward = types.MethodType(doubled, model[0])
    report = lazynn.summary(model, (2, 4))
    rows = {r.path: r for r in report.rows}
    assert rows["0.fc"].inputs[0][0] == (2, 8)  # the instance's forward
    assert rows["1.fc"].inputs[0][0] == (2, 3)  # the class's: the blocks are not collapsed
    lazynn.build(model, (2, 4))
    assert model[0].fc.in_features == 8
    assert model[1].fc.in_features == 3
    assert model(torch.randn(2, 4)).shape == (2, 3)


def plus_one(self: Block, x: torch.Tensor) -> torch.Tensor:
    return self.fc(x) + 1  # type: ignore[no-any-return]


def test_blocks_sharing_one_instance_forward_each_run_it() -> None:
    model = nn.Sequential(*[Block() for _ in range(3)])
    for block in model:
        block.forward = types.MethodType(plus_one, block)
    rows = {r.path: r for r in lazynn.summary(model, (2, 3)).rows}
    assert [rows[f"{i}.fc"].calls for i in range(3)] == [1, 1, 1]
    lazynn.build(model, (2, 3))
    with torch.no_grad():
        for block in model:
            block.fc.weight.zero_()
            block.fc.bias.zero_()
    assert torch.equal(model(torch.zeros(2, 3)), torch.ones(2, 3))  # each added its 1


def test_a_forward_that_summarizes_or_builds_its_own_submodule_works() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential(lazynn.LazyLinear(3))
            self.head = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lazynn.summary(self.inner, tuple(x.shape))
            return self.head(self.inner(x))  # type: ignore[no-any-return]

    model = lazynn.build(Outer(), (2, 4))
    assert not lazynn.is_lazy(model)
    assert lazynn.summary(Outer(), (2, 4)).total_parameters == 4 * 3 + 3 + 3 * 2 + 2


# --- the model is only read -----------------------------------------------------------------


def test_another_thread_reads_real_tensors_while_a_summary_rehearses() -> None:
    reached, go = threading.Event(), threading.Event()
    model = nn.Sequential(nn.Linear(4, 4), MetaPause(reached, go), nn.Linear(4, 2))
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(lazynn.summary(model, (2, 4))))
    thread.start()
    assert reached.wait(30)
    try:
        state = model.state_dict()  # a checkpoint thread, while the rehearsal is paused
    finally:
        go.set()
        thread.join(30)
    assert all(not t.is_meta for t in state.values())
    assert torch.equal(state["0.weight"], model[0].weight)
    assert isinstance(results[0], lazynn.Summary)


class DrawsOnCpu(nn.Module):
    """A mask drawn on the CPU by name: the rehearsal's meta device does not redirect it."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.rand(x.shape[0], 1, device="cpu") > 0.1
        return self.fc(x) * keep.to(x.device)


def test_a_forward_drawing_on_a_real_device_leaves_the_generator_where_it_was() -> None:
    """The rehearsal puts the generator back when its forward drew on a real device: a
    summary leaves it as it was, and build allocates what eager construction draws (no
    drift warning)."""
    before = torch.get_rng_state()
    lazynn.summary(DrawsOnCpu(), (2, 3))
    assert torch.equal(torch.get_rng_state(), before)

    torch.manual_seed(0)
    eager = DrawsOnCpu(lazy=False)
    after_eager = torch.get_rng_state()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built = lazynn.build(DrawsOnCpu(), (2, 3))
    assert torch.equal(built.fc.weight, eager.fc.weight)
    assert torch.equal(built.fc.bias, eager.fc.bias)
    assert torch.equal(torch.get_rng_state(), after_eager)


def test_another_threads_draws_during_a_rehearsal_are_not_rewound() -> None:
    """A rehearsal whose forward draws nothing on a real device leaves the generator alone:
    numbers another thread draws meanwhile do not come out again."""
    reached, go = threading.Event(), threading.Event()

    class Draws(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.rand(x.shape)  # no device: meta in the rehearsal, no draw

    model = nn.Sequential(lazynn.LazyLinear(3), MetaPause(reached, go), Draws())
    thread = threading.Thread(target=lambda: lazynn.summary(model, (2, 4)))
    thread.start()
    try:
        assert reached.wait(30)
        theirs = torch.rand(5)  # another thread's draw, while the rehearsal is paused
        after_theirs = torch.get_rng_state()
    finally:
        go.set()
        thread.join(30)
    assert torch.equal(torch.get_rng_state(), after_theirs)
    assert not torch.equal(torch.rand(5), theirs)


def test_the_model_on_meta_keeps_its_tensors_version_counters() -> None:
    model = nn.Sequential(lazynn.LazyLinear(4), nn.BatchNorm1d(4))
    lazynn.build(model, (3, 5), device="meta")
    versions = [t._version for t in model.buffers()]
    lazynn.summary(model, (3, 5))
    assert [t._version for t in model.buffers()] == versions


# --- what the rehearsal builds ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["build", "summary"])
def test_batchnorm_with_cumulative_averages_is_built_and_summarized(how: str) -> None:
    """momentum=None reads num_batches_tracked; its value decides no shape."""
    model = nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyBatchNorm1d(momentum=None))
    if how == "build":
        lazynn.build(model, (3, 5))
        assert model[1].num_batches_tracked.item() == 0
        assert model[1].momentum is None
    else:
        assert lazynn.summary(model, (3, 5)).total_parameters == 5 * 4 + 4 + 8


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        (nn.Module(), 'missing the required "forward"'),
        (nn.ReflectionPad2d(1), "not supported"),
    ],
    ids=["forward not written", "input not supported"],
)
def test_a_not_implemented_forward_is_not_called_a_meta_limitation(
    tail: nn.Module, says: str
) -> None:
    with pytest.raises(lazynn.InferenceError) as caught:
        lazynn.build(nn.Sequential(lazynn.LazyLinear(3), tail), (2, 4))
    assert not isinstance(caught.value, lazynn.NeedsValuesError)
    text = str(caught.value)
    assert says in text
    assert "write its forward, or check the example inputs" in text


def test_a_symbolic_batch_is_refused_where_the_cost_is_not_linear_in_it() -> None:
    class AcrossTheBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return h @ h.T

    with pytest.raises(lazynn.InferenceError, match="linear in the batch") as caught:
        lazynn.summary(AcrossTheBatch(), lazynn.Spec(("B", 5)))
    assert "give the batch as a number" in str(caught.value)
    exact = lazynn.summary(AcrossTheBatch(), (1, 5))  # the figure the user can check
    assert exact.total_flops == 2 * 1 * 5 * 4 + 2 * 1 * 4 * 1


# --- the training estimate -----------------------------------------------------------------


def test_the_training_estimate_copies_nothing_of_the_model() -> None:
    class Holding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()  # cannot be pickled or deep-copied
            self.cache = [torch.zeros(1000, 1000)]  # a tensor in a list
            self.fc = lazynn.LazyLinear(8)
            self.unreached = lazynn.LazyLinear(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    model = Holding()
    report = lazynn.summary(model, (2, 5), training=True)
    assert report.memory is not None
    assert report.memory.params == (5 * 8 + 8) * 4  # the unreached layer is not counted
    assert lazynn.is_lazy(model.fc)
    assert not model.cache[0].is_meta


# --- a first call inside torch.utils.checkpoint ----------------------------------------------


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_first_call_in_a_checkpoint_has_gradients_of_its_own_forward(reentrant: bool) -> None:
    """The recomputation in the backward builds nothing: the forward after the build draws
    what the recomputation draws (the build's draws are put back)."""
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    start = torch.get_rng_state()
    block = nn.Sequential(lazynn.LazyLinear(16), nn.Dropout(0.5), lazynn.LazyLinear(4))
    inputs = x.clone().requires_grad_(True)
    out = checkpoint(block, inputs, use_reentrant=reentrant)
    out.sum().backward()
    # the same forward, without checkpoint, from the same place in the stream
    twin = copy.deepcopy(block)
    torch.set_rng_state(start)
    again = x.clone().requires_grad_(True)
    expected = twin(again)
    expected.sum().backward()
    assert torch.equal(out, expected)
    assert torch.equal(inputs.grad, again.grad)


@pytest.mark.parametrize("reentrant", [False, True])
def test_layers_built_in_one_checkpoint_draw_on_as_a_plain_first_call(reentrant: bool) -> None:
    """The builds inside a checkpoint draw from a stream of their own that each continues:
    two layers of one shape get different weights, those of a first call outside it."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))

    def block() -> nn.Sequential:
        return nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(8))

    torch.manual_seed(0)
    plain = block()
    plain(x)
    for _ in range(2):  # (the second model, under the same seed, does not go on from the first)
        torch.manual_seed(0)
        checkpointed = block()
        inputs = x.clone().requires_grad_(True)
        checkpoint(checkpointed, inputs, use_reentrant=reentrant).sum().backward()
        assert not torch.equal(checkpointed[0].weight, checkpointed[2].weight)
        for mine, theirs in zip(checkpointed.parameters(), plain.parameters(), strict=True):
            assert torch.equal(mine, theirs)


class _Checkpointed(nn.Module):
    """The usual activation-checkpointing loop: each block checkpointed in turn."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(lazynn.LazyLinear(8), nn.ReLU()) for _ in range(3)
        )
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x


@pytest.mark.parametrize("reentrant", [False, True])
def test_blocks_checkpointed_one_after_another_get_a_plain_first_calls_weights(
    reentrant: bool,
) -> None:
    """Each block's build continues the builds of the one before (the same model): blocks of
    one shape get different weights, those of the same model called without checkpoint."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    plain = _Checkpointed(reentrant)
    nn.Sequential(*plain.blocks)(x)
    for _ in range(2):  # (the second model, under the same seed, does not go on from the first)
        torch.manual_seed(0)
        model = _Checkpointed(reentrant)
        model(x.clone().requires_grad_(True)).sum().backward()
        weights = [block[0].weight for block in model.blocks]
        assert not torch.equal(weights[0], weights[1])
        for mine, theirs in zip(model.parameters(), plain.parameters(), strict=True):
            assert torch.equal(mine, theirs)


class _CheckpointedThenHead(_Checkpointed):
    """Checkpointed blocks, then a head called outside any checkpoint."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__(reentrant)
        self.head = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(super().forward(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_layer_built_after_checkpointed_blocks_goes_on_with_their_stream(
    reentrant: bool,
) -> None:
    """The model's builds draw one stream in order, as without checkpointing: the head gets
    the weights a plain first call gives it, and the generator ends where that leaves it."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    plain = _CheckpointedThenHead(reentrant)
    nn.Sequential(*plain.blocks, plain.head)(x)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = _CheckpointedThenHead(reentrant)
    model(x.clone().requires_grad_(True)).sum().backward()
    for mine, theirs in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(torch.get_rng_state(), after)


@pytest.mark.parametrize("segments", [2, 3])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_sequential_gives_a_plain_first_calls_weights(
    reentrant: bool, segments: int
) -> None:
    """``checkpoint_sequential`` runs its last segment unchecked, through the same segment
    function as the checkpointed ones: the layers built there go on with the checkpointed
    builds' stream (they took other numbers before issue 36), and the generator ends where a
    plain first call leaves it."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))

    def model() -> nn.Sequential:
        return nn.Sequential(
            lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(3)
        )

    torch.manual_seed(0)
    plain = model()
    plain(x)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    checkpointed = model()
    inputs = x.clone().requires_grad_(True)
    checkpoint_sequential(checkpointed, segments, inputs, use_reentrant=reentrant).sum().backward()
    for mine, theirs in zip(checkpointed.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(torch.get_rng_state(), after)


# --- threads and warnings ---------------------------------------------------------------------


class PausedInit(nn.Module):
    """A layer whose construction on meta (a lazy layer's layout) waits for ``go`` once
    ``pause`` is given, having set ``reached``."""

    pause: tuple[threading.Event, threading.Event] | None = None

    def __init__(self, features: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(features, device=device, dtype=dtype))
        if self.weight.is_meta and PausedInit.pause is not None:
            reached, go = PausedInit.pause
            reached.set()
            go.wait(30)


LazyPausedInit = lazynn.lazy(PausedInit, features=lazynn.Infer(dim=-1))


def test_a_lazy_construction_changes_no_warning_filter_another_thread_would_keep() -> None:
    """Warning filters are the process's: a construction that silenced warnings with
    warnings.catch_warnings() would, meanwhile, hide every other thread's warnings, and a
    thread entering catch_warnings() then would put its "ignore" back when it leaves. Forced:
    one thread constructs a lazy layer and holds inside its layout on meta while another
    enters and leaves catch_warnings() around it."""
    filters = list(warnings.filters)
    reached, go = threading.Event(), threading.Event()
    PausedInit.pause = (reached, go)
    try:
        made: list[nn.Module] = []
        first = threading.Thread(target=lambda: made.append(LazyPausedInit()))
        first.start()
        assert reached.wait(30)
        assert warnings.filters == filters  # nothing silenced for the other threads
        with warnings.catch_warnings():
            go.set()
            first.join(30)
    finally:
        PausedInit.pause = None
        go.set()
    assert made
    assert lazynn.is_lazy(made[0])
    assert warnings.filters == filters


def test_a_probe_layout_that_would_warn_warns_nothing() -> None:
    """The layout's probe sizes make a zero-row tail (in_features=1 // div_value): its init
    would warn that it does nothing, where the real sizes warn nothing. Skipped, not silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = lazynn.LazyAdaptiveLogSoftmaxWithLoss(23, [7, 11], div_value=3.0)
    assert lazynn.is_lazy(layer)


def test_lazy_layers_constructed_in_two_threads_leave_no_filter_behind() -> None:
    filters = list(warnings.filters)

    def construct() -> None:
        for _ in range(50):
            lazynn.LazyAdaptiveLogSoftmaxWithLoss(20, [5, 10], div_value=2.0)

    threads = [threading.Thread(target=construct) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert warnings.filters == filters


@pytest.mark.parametrize("features", [5, 3])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("spatial", [1, 2])
def test_the_rehearsals_batch_norm_accepts_what_torchs_accepts(
    features: int, affine: bool, track: bool, training: bool, spatial: int
) -> None:
    """A rehearsal's BatchNorm computes only shapes; it refuses exactly the inputs torch's
    forward refuses (channels against the tensors it has; one value per channel where it
    uses batch statistics)."""
    shape = (1, 3, spatial, spatial)

    def norm() -> nn.BatchNorm2d:
        return nn.BatchNorm2d(features, affine=affine, track_running_stats=track)

    eager = nn.Sequential(nn.Conv2d(3, 5, 1), norm()).train(training)
    try:
        eager(torch.randn(shape))
        torch_accepts = True
    except (RuntimeError, ValueError):
        torch_accepts = False
    model = nn.Sequential(lazynn.LazyConv2d(5, 1), norm()).train(training)
    try:
        lazynn.build(model, shape)
        lazynn_accepts = True
    except lazynn.InferenceError:
        lazynn_accepts = False
    assert lazynn_accepts == torch_accepts


# --- user code the rehearsal runs while a lazy layer builds: under the meta device ------------
def _drawing_registration_hook(seen: list[str]) -> Any:
    """A global parameter registration hook (public torch API) that draws without a device,
    as a library sampling something per parameter would."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    def hook(module: nn.Module, name: str, param: Any) -> None:
        if param is not None and not isinstance(param, nn.UninitializedParameter):
            seen.append(torch.rand(()).device.type)

    return register_module_parameter_registration_hook(hook)


@pytest.mark.parametrize("form", ["instance", "factory", "summary"])
def test_user_code_a_layers_build_runs_stays_under_the_meta_device(form: str) -> None:
    """lazynn's own work on a layer steps out of its modes (``lifecycle.own_work``), but not
    the user's code that work calls: torch's registration hooks, run by a layout of the eager
    class (at construction, in the rehearsal, in a factory's draft), run under the meta
    device and draw nothing, and the build equals eager construction."""

    class Net(nn.Module):
        def __init__(self, lazy: bool = True) -> None:
            super().__init__()
            self.a = lazynn.LazyLinear(8) if lazy else nn.Linear(4, 8)
            self.b = lazynn.LazyLinear(3) if lazy else nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    from lazynn._layer.construct import _LAYOUTS

    _LAYOUTS.clear()  # (layouts are remembered: the first one of a class runs its __init__)
    seen: list[str] = []
    handle = _drawing_registration_hook(seen)
    try:
        torch.manual_seed(0)
        eager, eager_state = Net(False), torch.get_rng_state()
        _LAYOUTS.clear()
        torch.manual_seed(0)
        if form == "summary":
            model = Net()
            _LAYOUTS.clear()
            seen.clear()
            lazynn.summary(model, (2, 4))
            assert torch.equal(torch.get_rng_state(), torch.manual_seed(0).get_state())
            assert seen
            assert set(seen) == {"meta"}
            return
        built = lazynn.build(Net() if form == "instance" else Net, (2, 4))
    finally:
        handle.remove()
    assert torch.equal(torch.get_rng_state(), eager_state)
    for mine, theirs in zip(built.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


def test_a_placeholders_own_materialize_runs_under_the_meta_device() -> None:
    """A placeholder class with its own ``materialize()`` (tensordict's kind) that makes a
    tensor without a device: in the rehearsal it is a meta one, and the build leaves the
    generator where a first call does."""

    class Jittered(lazynn.UninitializedParameter):
        def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
            super().materialize(shape, device=device, dtype=dtype)
            self.__dict__.setdefault("made", []).append(torch.rand(()).device.type)

    def make() -> nn.Module:
        layer = lazynn.LazyLinear(5)
        layer.weight = Jittered()
        return layer

    torch.manual_seed(0)
    first = make()
    first(torch.ones(2, 4))
    after_first = torch.get_rng_state()
    torch.manual_seed(0)
    built = lazynn.build(make(), (2, 4))
    assert torch.equal(torch.get_rng_state(), after_first)
    assert torch.equal(built.weight, first.weight)
    assert torch.equal(built.bias, first.bias)
