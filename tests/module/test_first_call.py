"""The first call: as light as torch's own lazy modules, and safe under threads and failures.

* it does no meta work: a fresh process that builds a lazynn model by its first call imports
  neither sympy nor torch._dynamo (torch's Python meta kernels import both on first use);
* a bad input is still refused before the model changes: the real forward is the check, and
  a refusal is a lazynn.InferenceError (also a ValueError and a RuntimeError, as torch raises
  either) naming the layer's path, with torch's own words;
* a construction that draws random numbers and then fails leaves every generator as it was;
* a first call under torch.inference_mode() builds ordinary (trainable) parameters;
* a built checkpoint into an unbuilt model draws nothing, and with assign=True takes the
  checkpoint's tensors;
* a failed build puts list attributes back; a plain tensor attribute does not stop build();
  a materialize that fails part way leaves the generator as it was; wording an error keeps
  nothing the caller drops alive; requires_grad can be set on a placeholder, GroupNorm takes
  float16/bfloat16 inputs, as torch's own allow;
* forced interleavings of two threads (paused with sys.settrace at the chosen line): a thread
  that checked "unbuilt" while another builds gets the built module's forward, not a crash;
  a thread's first call waits while another is half way through its build, so no snapshot
  ever sees a half-built layer.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module
from lazynn._module.lifecycle import is_unbuilt
from lazynn._module.mixin import LazyModuleMixin
from lazynn._module.placeholder import fill
from lazynn._module.tensors import is_placeholder
from pauses import MetaPause


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_first_call_imports_nothing_torch_lazy_modules_do_not() -> None:
    out = _run(
        """
        import sys, torch, lazynn
        from torch import nn
        model = nn.Sequential(
            lazynn.LazyConv2d(4, 3), lazynn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(),
            lazynn.LazyLinear(8), lazynn.LazyLayerNorm(), lazynn.LazyLinear(2),
        )
        model(torch.randn(2, 3, 8, 8))
        assert not lazynn.is_lazy(model)
        print(sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules))
        """
    )
    assert out == "[]"


def test_loading_a_built_checkpoint_touches_no_meta_kernel() -> None:
    out = _run(
        """
        import sys, torch, lazynn
        from torch import nn
        source = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 2))
        target = nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyLayerNorm(), lazynn.LazyLinear(2))
        target.load_state_dict(source.state_dict())
        assert not lazynn.is_lazy(target)
        print(sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules))
        """
    )
    assert out == "[]"


@pytest.mark.parametrize(
    ("make", "bad", "match"),
    [
        (lambda: lazynn.LazyConv2d(4, 5), (1, 3, 4, 4), "Kernel size can't be greater"),
        (lambda: lazynn.LazyBatchNorm1d(), (1, 4), "more than 1 value per channel"),
    ],
    ids=["kernel-larger-than-input", "batchnorm-batch-of-one"],
)
def test_a_forward_refusal_is_an_inference_error_with_torchs_words(
    make: Callable[[], nn.Module], bad: tuple[int, ...], match: str
) -> None:
    model = nn.Sequential(nn.Identity(), make())
    x = torch.randn(bad)
    rng = torch.get_rng_state()
    with pytest.raises(lazynn.InferenceError, match=match) as caught:
        model(x)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, RuntimeError)
    assert str(caught.value).startswith(f"{type(model[1]).__name__} at '1': expected an input")
    assert is_unbuilt(model[1])
    assert torch.equal(torch.get_rng_state(), rng)


class Drawing(nn.Module):
    """Draws random numbers at construction, then refuses sizes above 4."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        if features > 4:
            raise ValueError(f"at most 4 features, received {features}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


LazyDrawing = lazynn.lazy(Drawing, features=lazynn.Infer(dim=-1))


def test_a_construction_that_draws_then_fails_leaves_the_generator_as_it_was() -> None:
    torch.manual_seed(0)
    layer = LazyDrawing()
    rng = torch.get_rng_state()
    with pytest.raises(lazynn.InferenceError, match="at most 4 features"):
        layer(torch.ones(2, 6))
    assert torch.equal(torch.get_rng_state(), rng)
    assert is_unbuilt(layer)
    layer(torch.ones(2, 3))
    torch.manual_seed(0)
    assert_same_module(layer, Drawing(3))


class DrawsThenRaises(LazyModuleMixin, nn.Module):
    """A custom initialize_parameters that draws, then raises."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = lazynn.UninitializedParameter()

    def initialize_parameters(self, x: torch.Tensor) -> None:  # type: ignore[override]
        with torch.no_grad():
            self.weight.materialize((x.shape[-1],))
            self.weight.normal_()
        raise RuntimeError("refused after drawing")


def test_a_custom_build_that_draws_then_fails_leaves_the_generator_as_it_was() -> None:
    layer = DrawsThenRaises()
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="refused after drawing"):
        layer(torch.ones(2, 3))
    assert torch.equal(torch.get_rng_state(), rng)
    assert is_placeholder(layer.weight)


@pytest.mark.parametrize("how", ["first-call", "build"])
def test_a_build_under_inference_mode_gives_trainable_parameters(how: str) -> None:
    model = nn.Sequential(lazynn.LazyLinear(3), nn.ReLU(), lazynn.LazyLinear(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.inference_mode():
        if how == "first-call":
            model(torch.randn(4, 5))
        else:
            lazynn.build(model, (4, 5))
    assert not any(p.is_inference() for p in model.parameters())
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    assert all(p.grad is not None for p in model.parameters())


# --- forced interleavings -----------------------------------------------------------------


def _line_of(function: Callable[..., Any], text: str) -> int:
    """The line number of the first line of ``function`` that contains ``text``."""
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _pause_at(code: Any, line: int, reached: threading.Event, go: threading.Event) -> None:
    """In the calling thread: when ``code`` reaches ``line``, set ``reached``, wait for ``go``."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line:
            sys.settrace(None)
            frame.f_trace = None
            reached.set()
            go.wait(30)
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    sys.settrace(tracer)


def _outcome(fn: Callable[[], Any], into: list[Any]) -> Callable[[], None]:
    """A thread target that appends fn()'s result, or the error it raised, to ``into``."""

    def run() -> None:
        try:
            into.append(fn())
        except BaseException as error:
            into.append(error)
        finally:
            sys.settrace(None)

    return run


def _second_waits(
    first: Callable[[], None],
    reached: threading.Event,
    go: threading.Event,
    second: Callable[[], None],
) -> None:
    """Run ``first`` in a thread until it pauses (``reached``), then ``second`` in another,
    which must still be waiting half a second later (for the build lock); then let ``first``
    go on (``go``) and wait for both."""
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert reached.wait(30)
    threads[1].start()
    threads[1].join(0.5)
    assert threads[1].is_alive()  # waiting for the build lock
    go.set()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


def test_a_thread_that_saw_the_module_unbuilt_while_another_built_it_gets_its_forward() -> None:
    layer = lazynn.LazyLinear(3)
    x = torch.randn(2, 4)
    reached, go = threading.Event(), threading.Event()
    result: list[Any] = []
    call = LazyModuleMixin.__call__
    line = _line_of(call, "with BUILD_LOCK:")

    def first() -> None:
        _pause_at(call.__code__, line, reached, go)  # after its unlocked "unbuilt?" check
        try:
            result.append(layer(x))
        except BaseException as error:
            result.append(error)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=first)
    thread.start()
    assert reached.wait(30)
    other = layer(x)  # this thread builds the layer meanwhile
    assert type(layer) is nn.Linear
    go.set()
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(result[0], torch.Tensor), result[0]
    assert torch.equal(result[0], other)


def test_no_snapshot_sees_a_half_built_layer() -> None:
    """Thread A is paused between filling weight and bias (its first call will fail in the
    forward); thread B's first call (which fails too) must not snapshot meanwhile, else its
    rollback would restore the half-built layer."""
    layer = lazynn.LazyBatchNorm1d()
    one = torch.randn(1, 4)  # a batch of one: the forward refuses it in training
    reached, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    fills = {"count": 0}

    line = _line_of(fill, "placeholder.__class__ = target")

    def a() -> None:
        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            if frame.f_code is fill.__code__:
                fills["count"] += 1
                if fills["count"] == 2:  # the second tensor: the first is filled already
                    return local
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_lineno == line:
                sys.settrace(None)
                frame.f_trace = None
                reached.set()
                go.wait(30)
            return local

        sys.settrace(tracer)
        _outcome(lambda: layer(one), errors)()

    _second_waits(a, reached, go, _outcome(lambda: layer(one), errors))
    assert len(errors) == 2
    assert all(isinstance(e, lazynn.InferenceError) for e in errors)
    assert is_unbuilt(layer)
    assert type(layer) is lazynn.LazyBatchNorm1d
    assert all(is_placeholder(t) for t in layer.parameters())
    assert [n for n, t in layer.named_buffers() if not is_placeholder(t)] == ["num_batches_tracked"]
    assert torch.equal(layer.num_batches_tracked, torch.tensor(0))
    x = torch.randn(3, 4)
    eager = nn.BatchNorm1d(4)
    assert torch.equal(layer(x), eager(x))
    assert_same_module(layer, eager)


def _checkpoint_pair() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    source = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    target = nn.Sequential(
        lazynn.LazyLinear(4), lazynn.LazyLayerNorm(), lazynn.LazyBatchNorm1d(), lazynn.LazyLinear(2)
    )
    return target, source.state_dict()


def test_a_built_checkpoint_into_an_unbuilt_model_draws_no_random_numbers() -> None:
    target, checkpoint = _checkpoint_pair()
    rng = torch.get_rng_state()
    target.load_state_dict(checkpoint)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not lazynn.is_lazy(target)
    for key, value in target.state_dict().items():
        assert torch.equal(value, checkpoint[key]), key


def test_a_partial_checkpoint_initializes_the_rest_as_eager_construction_does() -> None:
    target = lazynn.LazyLinear(3)
    weight = torch.randn(3, 4)
    torch.manual_seed(0)
    target.load_state_dict({"weight": weight}, strict=False)
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    assert torch.equal(target.weight, weight)
    assert torch.equal(target.bias, eager.bias)


def test_assign_takes_the_checkpoints_tensors_without_a_copy() -> None:
    target, checkpoint = _checkpoint_pair()
    target.load_state_dict(checkpoint, assign=True)
    for key, value in target.state_dict().items():
        assert value.data_ptr() == checkpoint[key].data_ptr(), key


def test_a_build_waits_for_another_threads_build_of_the_same_model() -> None:
    """Thread A is paused between its rehearsal and its allocation; thread B's build of the
    same model must wait (else A allocates from a stale rehearsal), then find it built."""
    import lazynn._build.build as _build

    def make() -> nn.Module:
        return nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))

    torch.manual_seed(0)
    model = make()
    reached, go = threading.Event(), threading.Event()
    results: list[Any] = []
    line = _line_of(_build.build_from, "allocate(")

    def a() -> None:
        _pause_at(_build.build_from.__code__, line, reached, go)
        _outcome(lambda: lazynn.build(model, (3, 5)), results)()

    _second_waits(a, reached, go, _outcome(lambda: lazynn.build(model, (3, 5)), results))
    assert results == [model, model]
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    assert_same_module(model, eager)


def test_an_error_keeps_nothing_the_caller_drops_alive() -> None:
    """Wording an error reads the calling frames (the module's path); what a caller drops
    after catching it must be freed at once, not when the caller returns."""
    import weakref

    class Payload:
        pass

    def caller() -> bool:
        payload = Payload()
        alive = weakref.ref(payload)
        model = nn.Sequential(nn.Sequential(lazynn.LazyConv2d(4, 5)))
        with pytest.raises(lazynn.InferenceError, match=r"at '0\.0'"):
            model(torch.randn(1, 3, 2, 2))
        del payload
        return alive() is None

    assert caller()


class Recording(nn.Module):
    """Appends to a list attribute in its forward, then fails on a wide input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(2)
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(tuple(x.shape))
        if x.shape[-1] > 4:
            raise ValueError("too wide")
        return self.fc(x)


def test_a_failed_build_puts_list_attributes_back() -> None:
    model = Recording()
    with pytest.raises(lazynn.InferenceError, match="too wide"):
        lazynn.build(model, (3, 6))
    assert model.seen == []
    assert lazynn.is_lazy(model)


class Masked(nn.Module):
    """Keeps a plain tensor attribute (not a buffer), as some models keep masks."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)
        self.scale = torch.full((3,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def test_build_takes_a_model_with_a_plain_tensor_attribute() -> None:
    model = Masked()
    scale = model.scale
    lazynn.build(model, (2, 5))
    assert model.fc.in_features == 5
    assert model.scale is scale  # put back after the rehearsal
    assert model(torch.ones(2, 5)).shape == (2, 3)


class DrawsThenFails(nn.Module):
    """A module whose reset_parameters draws, then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4))

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        raise RuntimeError("init failed after drawing")


def test_a_materialize_that_fails_part_way_leaves_the_generator_as_it_was() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 4), DrawsThenFails())
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="init failed after drawing"):
        lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.is_meta for p in model.parameters())


def test_requires_grad_can_be_set_on_a_placeholder_as_torch_allows() -> None:
    layer = lazynn.LazyLinear(2)
    layer.weight.requires_grad = False
    assert not layer.weight.requires_grad
    layer(torch.randn(3, 4))
    assert not layer.weight.requires_grad
    assert layer.bias.requires_grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_group_norm_takes_lower_precision_inputs_as_eager_does(dtype: torch.dtype) -> None:
    x = torch.randn(2, 4, 3).to(dtype)
    lazy, eager = lazynn.LazyGroupNorm(2), nn.GroupNorm(2, 4)
    assert torch.equal(lazy(x), eager(x))


class KeepsItsClass(LazyModuleMixin, nn.Module):
    """A custom lazy module that stays its own class once built (cls_to_become = None)."""

    cls_to_become = None

    def __init__(self) -> None:
        super().__init__()
        self.weight = lazynn.UninitializedParameter()

    def initialize_parameters(self, x: torch.Tensor) -> None:  # type: ignore[override]
        with torch.no_grad():
            self.weight.materialize((x.shape[-1],))
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_a_built_module_that_keeps_its_class_is_built_for_is_lazy_and_data_parallel() -> None:
    module = KeepsItsClass()
    assert lazynn.is_lazy(module)
    with pytest.raises(lazynn.UnbuiltError, match="DataParallel"):
        module._replicate_for_data_parallel()
    module(torch.ones(2, 3))
    assert type(module) is KeepsItsClass
    assert not lazynn.is_lazy(module)
    replica = module._replicate_for_data_parallel()  # (DataParallel then gives it tensors)
    assert type(replica) is KeepsItsClass
    assert replica._is_replica


def test_a_tied_weight_of_another_shape_is_named_as_such() -> None:
    first, second = lazynn.LazyLinear(4), lazynn.LazyLinear(4)
    second.weight = first.weight  # tied before the build; the inputs give them other shapes
    model = nn.Sequential(first, nn.ReLU(), second)
    with pytest.raises(lazynn.InferenceError, match="a weight tied to another layer") as caught:
        model(torch.randn(2, 3))
    assert "at '2'" in str(caught.value)
    assert "lazynn.on_build" in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_allocation_failure_names_the_layer_and_changes_nothing() -> None:
    model = nn.Sequential(nn.ReLU(), lazynn.LazyLinear(10**6))  # (4 TB of weight: refused)
    with pytest.raises(lazynn.InferenceError, match=r"LazyLinear at '1': expected to allocate"):
        lazynn.build(model, (2, 10**6))
    assert is_unbuilt(model[1])
    assert all(is_placeholder(p) for p in model.parameters())
    if not torch.cuda.is_available():  # (a device the machine lacks: refused at the door)
        with pytest.raises(lazynn.ArgumentError, match="this machine has no cuda"):
            lazynn.build(model, (2, 4), device="cuda")
        assert is_unbuilt(model[1])


def test_a_forward_waits_while_another_thread_runs_the_on_build_queue() -> None:
    """Thread A's first call builds the model and runs its queued init, which pauses; thread
    B's call must wait for it (else B's forward would meet half-initialized weights), then
    both get the output of the initialized model, and the init ran once."""
    reached, go = threading.Event(), threading.Event()
    runs: list[int] = []

    def init(model: nn.Module) -> None:
        runs.append(1)
        reached.set()
        go.wait(30)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(0.5)

    model = nn.Sequential(lazynn.LazyLinear(3), nn.ReLU(), lazynn.LazyLinear(2))
    lazynn.on_build(model, init)
    x = torch.ones(2, 4)
    results: list[Any] = []
    _second_waits(
        _outcome(lambda: model(x), results), reached, go, _outcome(lambda: model(x), results)
    )
    assert runs == [1]
    expected = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        for p in expected.parameters():
            p.fill_(0.5)
    assert len(results) == 2
    for out in results:
        assert isinstance(out, torch.Tensor), out
        assert torch.equal(out, expected(x))


def test_a_first_call_during_another_threads_summary_waits_for_it() -> None:
    """A rehearsal runs the model itself, building its lazy layers on meta for the run, under
    the build lock: another thread's first call waits for it (still waiting half a second
    later), then builds the model as it was; the summary is the model's."""
    reached, go = threading.Event(), threading.Event()
    model = nn.Sequential(MetaPause(reached, go), nn.Linear(4, 4), lazynn.LazyLinear(2))
    results: list[Any] = []
    calls: list[Any] = []
    _second_waits(
        _outcome(lambda: lazynn.summary(model, (2, 4)), results),
        reached,
        go,
        _outcome(lambda: model(torch.ones(2, 4)), calls),
    )
    (out,) = calls
    assert isinstance(out, torch.Tensor), out
    assert out.shape == (2, 2)
    assert not lazynn.is_lazy(model)
    (summary,) = results
    assert isinstance(summary, lazynn.Summary), summary
    assert summary.total_parameters == 4 * 4 + 4 + 4 * 2 + 2


def test_a_first_call_during_another_threads_build_waits_and_meets_the_built_model() -> None:
    """lazynn.build holds the build lock through its rehearsal and allocation: a first call
    from another thread waits, then runs the model build made (the eager twin's numbers)."""
    reached, go = threading.Event(), threading.Event()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Identity(), nn.Linear(4, 4), nn.Linear(4, 2))
    torch.manual_seed(0)
    model = nn.Sequential(MetaPause(reached, go), lazynn.LazyLinear(4), lazynn.LazyLinear(2))
    builds: list[Any] = []
    builder = threading.Thread(target=_outcome(lambda: lazynn.build(model, (2, 4)), builds))
    builder.start()
    assert reached.wait(30)  # build's rehearsal is paused, holding the build lock
    calls: list[Any] = []
    caller = threading.Thread(target=_outcome(lambda: model(torch.ones(2, 4)), calls))
    caller.start()
    go.set()
    builder.join(30)
    caller.join(30)
    assert builds == [model]
    (out,) = calls
    assert isinstance(out, torch.Tensor), out
    for a, b in zip(model[1:].parameters(), eager[1:].parameters(), strict=True):
        assert torch.equal(a, b)  # built once, by build, as the eager twin
    assert torch.equal(out, eager(torch.ones(2, 4)))


def _signal_at_layer(at_layer: threading.Event) -> None:
    """In the calling thread: set ``at_layer`` when its call of a layer the rehearsal built
    on meta waits for the build lock (lazynn's ``_first_call_elsewhere``), or, had it not
    waited, when ``nn.Linear.forward`` has run on whatever tensors the layer held."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event in ("return", "exception"):
            at_layer.set()
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name == "_first_call_elsewhere":
            at_layer.set()
        return local if frame.f_code is nn.Linear.forward.__code__ else None

    sys.settrace(tracer)


@pytest.mark.parametrize("door", ["build", "summary"])
def test_a_first_call_of_a_layer_the_rehearsal_built_on_meta_waits_for_the_lock(door: str) -> None:
    """Another thread's first call reaching a lazy layer after the rehearsal built it on meta
    for the run (its class the eager one, its build hook gone) waits for the build lock, as
    a first call does, and meets the layer built (by build, or by its own first call after a
    summary): it never computes with the rehearsal's meta tensors."""
    reached, go, at_layer = threading.Event(), threading.Event(), threading.Event()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 2))
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), MetaPause(reached, go), lazynn.LazyLinear(2))
    results: list[Any] = []
    run = (
        (lambda: lazynn.build(model, (2, 4)))
        if door == "build"
        else (lambda: lazynn.summary(model, (2, 4)))
    )
    rehearsal = threading.Thread(target=_outcome(run, results))
    rehearsal.start()
    assert reached.wait(30)  # paused after building model[0] on meta for the run
    assert type(model[0]) is nn.Linear
    assert model[0].weight.is_meta
    calls: list[Any] = []

    def call() -> torch.Tensor:
        _signal_at_layer(at_layer)
        return model(torch.ones(2, 4))

    caller = threading.Thread(target=_outcome(call, calls))
    caller.start()
    assert at_layer.wait(30)
    go.set()
    rehearsal.join(30)
    caller.join(30)
    (out,) = calls
    assert isinstance(out, torch.Tensor), out
    assert not lazynn.is_lazy(model)
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)  # built once, as the eager twin (by build, or the first call)
    assert torch.equal(out, eager(torch.ones(2, 4)))
    (result,) = results
    if door == "build":
        assert result is model
    else:
        assert result.total_parameters == 4 * 4 + 4 + 4 * 2 + 2


def test_remembered_layouts_share_nothing_mutable_between_layers() -> None:
    # The second layer of a configuration copies the first one's meta layout: each must still
    # have its own containers, hooks and tensors.
    from lazynn._layer.construct import new

    first, second = lazynn.LazyConv2d(8, 3, padding=1), lazynn.LazyConv2d(8, 3, padding=1)
    for key, value in first.__dict__.items():
        if isinstance(value, (dict, set, list)) and key != "_lazynn":
            assert second.__dict__[key] is not value, key
    first._non_persistent_buffers_set.add("x")
    assert not second._non_persistent_buffers_set
    first.register_forward_hook(lambda *a: None)
    assert not second._forward_hooks
    kwargs = {"in_features": 3, "out_features": 2}
    a, b = new(nn.Linear, kwargs, "meta", None), new(nn.Linear, kwargs, "meta", None)
    assert a.weight is not b.weight
    assert a._parameters is not b._parameters
    a.weight.requires_grad_(False)
    assert b.weight.requires_grad
    assert new(nn.Linear, kwargs, "meta", None).weight.requires_grad
    # (1 and True are different arguments: eager keeps what it was given)
    assert lazynn.LazyBatchNorm1d(affine=True).affine is True
    assert type(lazynn.LazyBatchNorm1d(affine=1).affine) is int


def test_a_class_of_the_users_own_is_laid_out_by_its_own_init_every_time() -> None:
    made: list[int] = []

    class Counting(nn.Linear):
        def __init__(self, in_features: int, out_features: int) -> None:
            made.append(in_features)
            super().__init__(in_features, out_features)

    LazyCounting = lazynn.lazy(Counting, in_features=lazynn.Infer(dim=-1))
    LazyCounting(out_features=2), LazyCounting(out_features=2)
    assert len(made) == 2
