"""Compilers and export see a lazynn model as torch.nn once built, and never half-build it.

Extends tests/ecosystem/test_ecosystem.py (fullgraph compile of nested layers, TorchScript,
functional_call / torch.func.grad as a first call on single layers) to a model nesting every
kind of lazy layer in a Sequential next to a LazyLayerNorm:

- ``torch.compile`` (inductor, fullgraph) of the unbuilt model builds it in one frame, equal to
  its eager twin; a built one never recompiles; ``dynamic=True`` / ``mark_dynamic`` work on an
  unbuilt model (torch's own ``nn.LazyLinear`` raises an internal error under ``dynamic=True``);
- ``torch.export.export`` (strict and non-strict) and ``torch.jit.trace`` of a built model match
  it; of an unbuilt one they refuse with a lazynn error naming the build (or build it exactly
  as a first call would), leaving it buildable;
- ``torch.func`` (functional_call, vmap, grad, the per-sample-gradient recipe) on a built model
  equals the eager twin bit for bit; on an unbuilt one it refuses clearly or builds correctly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch.func import functional_call, grad, jacrev, vmap

import lazynn
from lazynn._module.lifecycle import is_unbuilt
from lazynn._module.tensors import is_placeholder
from registry import assert_known_initial, lazy_tensors

pytestmark = pytest.mark.compile

#: the input every test uses: (N, C, H, W) = (2, 3, 8, 8), so Linear sees 4 * 6 * 6 features
SHAPE = (2, 3, 8, 8)
#: the lazy classes of Net(lazy=True), in module order, and what each becomes
LAZY_TYPES = [lazynn.LazyConv2d, lazynn.LazyBatchNorm2d, lazynn.LazyLinear, lazynn.LazyLayerNorm]
EAGER_TYPES = [nn.Conv2d, nn.BatchNorm2d, nn.Linear, nn.LayerNorm]


class Net(nn.Module):
    """A user model: a Sequential of conv, ReLU, batchnorm, Flatten, linear; then a LayerNorm."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        if lazy:
            self.features = nn.Sequential(
                lazynn.LazyConv2d(4, 3),
                nn.ReLU(),
                lazynn.LazyBatchNorm2d(),
                nn.Flatten(),
                lazynn.LazyLinear(5),
            )
            self.norm: nn.Module = lazynn.LazyLayerNorm()
        else:
            self.features = nn.Sequential(
                nn.Conv2d(3, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 5)
            )
            self.norm = nn.LayerNorm(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.features(x))


def lazy_net(train: bool = True) -> Net:
    """The unbuilt model, constructed under seed 0: build it before drawing random numbers."""
    torch.manual_seed(0)
    return Net(lazy=True).train(train)


def eager_net(train: bool = True) -> Net:
    """The eager twin: under seed 0, equal to a built lazy_net() bit for bit."""
    torch.manual_seed(0)
    return Net(lazy=False).train(train)


def built_net(how: str, x: torch.Tensor, train: bool = True) -> Net:
    model = lazy_net(train)
    if how == "build":
        lazynn.build(model, x)
    else:  # a first call (which, in training mode, also updates BatchNorm's statistics)
        model(x)
    assert not lazynn.is_lazy(model)
    return model


def lazy_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, lazynn.LazyModuleMixin)]


def assert_untouched(model: Net, layers: list[nn.Module]) -> None:
    """Still entirely unbuilt: every lazy layer keeps its class, hook and placeholders (and
    its known buffers, BatchNorm's num_batches_tracked, their value 0)."""
    assert lazynn.is_lazy(model)
    assert [type(m) for m in lazy_layers(model)] == LAZY_TYPES
    assert lazy_layers(model) == layers  # the same objects, in place
    for layer in layers:
        assert is_unbuilt(layer)
        tensors = lazy_tensors(layer)
        assert tensors
        assert all(is_placeholder(t) for t in tensors.values())
        assert_known_initial(layer)


def assert_built_like(model: nn.Module, eager: nn.Module, *, exact_buffers: bool = True) -> None:
    """Built into plain torch.nn equal to ``eager``: no hook, no placeholder, same state."""
    assert not lazynn.is_lazy(model)
    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    assert not any(is_unbuilt(m) or m._forward_pre_hooks for m in model.modules())
    ls, es = model.state_dict(), eager.state_dict()
    assert list(ls) == list(es)
    for name, p in model.named_parameters():
        assert type(p) is nn.Parameter, name
        assert torch.equal(p, es[name]), name
    for name, b in model.named_buffers():
        assert type(b) is torch.Tensor, name
        if exact_buffers:
            assert torch.equal(b, es[name]), name
        else:  # statistics updated by a compiled forward: inductor reorders float math
            torch.testing.assert_close(b, es[name], msg=name)


def error_chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def attempt(fn: Callable[..., Any], *args: Any) -> tuple[Any, Exception | None]:
    """``fn(*args)``: its result and no error, or no result and the error it raised."""
    try:
        return fn(*args), None
    except Exception as error:
        return None, error


def assert_clear_lazynn_error(error: BaseException) -> None:
    """A lazynn error (possibly wrapped by torch) naming the layer, and a message naming the
    build as the fix."""
    ours = next((e for e in error_chain(error) if isinstance(e, lazynn.LazynnError)), None)
    assert ours is not None, f"not a lazynn error: {type(error).__name__}: {error}"
    # the first lazy layer the input meets, by class or by its parameters' paths
    assert "LazyConv2d" in str(ours) or "'features.0.weight'" in str(ours), str(ours)
    assert "build" in str(error), str(error)


@pytest.fixture(autouse=True)
def dynamo_reset() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# --- torch.compile ----------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_compile_inductor_fullgraph_builds_unbuilt_model_in_one_frame() -> None:
    x = torch.randn(SHAPE)
    model = lazy_net()
    layers = lazy_layers(model)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    y = compiled(x)  # fullgraph=True: a graph break raises here
    eager = eager_net()
    y_eager = eager(x)
    assert all(type(m) is t for m, t in zip(layers, EAGER_TYPES, strict=True))  # same objects
    assert_built_like(model, eager, exact_buffers=False)
    torch.testing.assert_close(y, y_eager)
    for _ in range(3):  # the built model runs in the frame compiled while it was building
        torch.testing.assert_close(compiled(x), eager(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("how", ["build", "call"])
def test_compile_built_model_never_recompiles(how: str) -> None:
    x = torch.randn(SHAPE)
    model = built_net(how, x)
    eager = eager_net()
    if how == "call":
        eager(x)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for _ in range(4):
        assert torch.equal(compiled(x), eager(x))
        assert counter.frame_count == 1
    assert_built_like(model, eager)


def test_compile_counts_one_frame_across_build_and_later_calls() -> None:
    x = torch.randn(SHAPE)
    model = lazy_net()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    y = compiled(x)  # builds from seed 0 (no random numbers drawn since lazy_net())
    eager = eager_net()
    assert torch.equal(y, eager(x))
    assert counter.frame_count == 1
    for _ in range(3):
        assert torch.equal(compiled(x), eager(x))
        assert counter.frame_count == 1
    assert_built_like(model, eager)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["dynamic=True", "mark_dynamic"])
@pytest.mark.parametrize("kind", ["net", "linear"])
def test_compile_dynamic_batch_on_unbuilt_model(mode: str, kind: str) -> None:
    """The first call builds; a second batch size runs in the same compiled model.

    ``kind="linear"`` is the case where torch's own nn.LazyLinear fails under dynamic=True
    ("SymIntArrayRef expected to contain only concrete integers"); it compiles with inductor.
    The larger model uses aot_eager: the build happens while dynamo traces, the same for every
    backend, and inductor's dynamic-shape kernels cost ~40 s on a cold cache.
    """
    backend = "aot_eager" if kind == "net" else "inductor"
    if kind == "net":
        x, x2 = torch.randn(SHAPE), torch.randn(5, *SHAPE[1:])
        model: nn.Module = lazy_net()
    else:
        x, x2 = torch.randn(3, 6), torch.randn(7, 6)
        torch.manual_seed(0)
        model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))
    first = x.clone()
    if mode == "mark_dynamic":
        torch._dynamo.mark_dynamic(first, 0)
        compiled = torch.compile(model, backend=backend, fullgraph=True)
    else:
        compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    y = compiled(first)  # builds from seed 0 (no random numbers drawn since construction)
    if kind == "net":
        eager: nn.Module = eager_net()
    else:
        torch.manual_seed(0)
        eager = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    torch.testing.assert_close(y, eager(x))
    assert_built_like(model, eager, exact_buffers=False)
    torch.testing.assert_close(compiled(x2), eager(x2))
    torch.testing.assert_close(compiled(x), eager(x))


# --- torch.export and torch.jit.trace of a built model ----------------------------------------


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "nonstrict"])
@pytest.mark.parametrize("how", ["build", "call"])
def test_export_of_built_model_matches_it(how: str, strict: bool, train: bool) -> None:
    x = torch.randn(SHAPE)
    model = built_net(how, x, train)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    program = torch.export.export(model, (x,), strict=strict)
    for key, value in model.state_dict().items():  # tracing ran no real forward
        assert torch.equal(value, before[key]), key
    eager = eager_net(train)
    if how == "call":
        eager(x)  # the build call updated BatchNorm's statistics
    assert_built_like(model, eager)
    exported = program.module()
    x2 = torch.randn(SHAPE)
    for t in (x, x2):
        y = exported(t)
        assert torch.equal(y, model(t))
        assert torch.equal(y, eager(t))


@pytest.mark.parametrize("how", ["build", "call"])
def test_jit_trace_of_built_model_matches_it(how: str) -> None:
    x = torch.randn(SHAPE)
    model = built_net(how, x).eval()
    traced = torch.jit.trace(model, x)
    assert torch.equal(traced(x), model(x))
    x2 = torch.randn(5, *SHAPE[1:])
    y2 = traced(x2)
    assert torch.equal(y2, model(x2))
    eager = eager_net()
    if how == "call":
        eager(x)  # the build call updated BatchNorm's statistics
    eager.eval()
    assert torch.equal(y2, eager(x2))
    assert_built_like(model, eager)


# --- torch.export and torch.jit.trace of an unbuilt model -------------------------------------


def _trace(model: nn.Module, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.jit.trace(model, x)  # type: ignore[no-any-return]


def _export(strict: bool) -> Callable[[nn.Module, torch.Tensor], Callable[..., Any]]:
    def run(model: nn.Module, x: torch.Tensor) -> Callable[..., Any]:
        return torch.export.export(model, (x,), strict=strict).module()

    return run


UNBUILT_EXPORTERS = {
    "export_strict": _export(True),
    "export_nonstrict": _export(False),
    "jit_trace": _trace,
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize(
    "exporter",
    [
        "export_strict",
        "export_nonstrict",
        "jit_trace",
    ],
)
def test_export_or_trace_of_unbuilt_model_is_refused(exporter: str, train: bool) -> None:
    """Before the build: a clear lazynn error naming the build, and the model untouched (an
    export or a trace does not change the model) and still buildable."""
    x = torch.randn(SHAPE)
    model = lazy_net(train)
    layers = lazy_layers(model)
    _, error = attempt(UNBUILT_EXPORTERS[exporter], model, x)
    assert error is not None, f"{exporter} of an unbuilt model did not refuse"
    assert_clear_lazynn_error(error)
    assert_untouched(model, layers)
    torch.manual_seed(0)
    y = model(x)  # still buildable, as if nothing happened
    eager = eager_net(train)
    assert torch.equal(y, eager(x))
    assert_built_like(model, eager)


# --- torch.func on a built model --------------------------------------------------------------


def test_functional_call_on_built_model_equals_eager_twin() -> None:
    x = torch.randn(SHAPE)
    model, eager = built_net("build", x).eval(), eager_net().eval()
    for replace in [{}, {n: p * 2 for n, p in eager.named_parameters()}]:
        y = functional_call(model, {k: v.clone() for k, v in replace.items()}, (x,))
        assert torch.equal(y, functional_call(eager, replace, (x,)))
    assert_built_like(model, eager)  # the substitutes were not kept


def test_vmap_of_built_model_equals_eager_twin() -> None:
    x = torch.randn(SHAPE)
    model, eager = built_net("build", x).eval(), eager_net().eval()
    per_sample = x.unsqueeze(1)  # vmap over samples, each a batch of one

    y = vmap(model)(per_sample)
    assert torch.equal(y, vmap(eager)(per_sample))
    torch.testing.assert_close(y.squeeze(1), model(x))
    params = dict(model.named_parameters())
    yf = vmap(lambda xi: functional_call(model, params, (xi,)))(per_sample)
    assert torch.equal(yf, y)


def test_grad_of_built_model_equals_eager_twin() -> None:
    x = torch.randn(SHAPE)
    # eval: in training mode BatchNorm's in-place statistics update fails under grad (in torch)
    model, eager = built_net("build", x).eval(), eager_net().eval()

    def loss_of(net: nn.Module) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
        return lambda p: functional_call(net, p, (x,)).square().sum()

    grads = grad(loss_of(model))({k: v.detach() for k, v in model.named_parameters()})
    expected = grad(loss_of(eager))({k: v.detach() for k, v in eager.named_parameters()})
    assert list(grads) == list(expected)
    for name in expected:
        assert torch.equal(grads[name], expected[name]), name
    dx = grad(lambda t: model(t).square().sum())(x)
    assert torch.equal(dx, grad(lambda t: eager(t).square().sum())(x))
    assert_built_like(model, eager)


def test_per_sample_gradients_with_vmap_match_a_loop() -> None:
    """The standard recipe: vmap(grad(functional_call)) over samples, against a loop."""
    x = torch.randn(SHAPE)
    target = torch.tensor([1, 3])
    model, eager = built_net("build", x).eval(), eager_net().eval()

    def per_sample_grads(net: nn.Module) -> dict[str, torch.Tensor]:
        params = {k: v.detach() for k, v in net.named_parameters()}
        buffers = {k: v.detach() for k, v in net.named_buffers()}

        def loss(
            p: dict[str, torch.Tensor],
            b: dict[str, torch.Tensor],
            xi: torch.Tensor,
            ti: torch.Tensor,
        ) -> torch.Tensor:
            out = functional_call(net, (p, b), (xi.unsqueeze(0),))
            return F.cross_entropy(out, ti.unsqueeze(0))

        return vmap(grad(loss), in_dims=(None, None, 0, 0))(params, buffers, x, target)  # type: ignore[no-any-return]

    grads = per_sample_grads(model)
    expected = per_sample_grads(eager)
    assert list(grads) == [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert torch.equal(grads[name], expected[name]), name
        assert grads[name].shape == (len(x), *p.shape), name
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), target[i : i + 1]).backward()
        for name, p in model.named_parameters():
            assert p.grad is not None, name
            torch.testing.assert_close(grads[name][i], p.grad, msg=f"{name}[{i}]")


# --- torch.func on an unbuilt model -----------------------------------------------------------


def _vmap(model: nn.Module, x: torch.Tensor) -> Any:
    return vmap(model)(x.unsqueeze(1))


def _vmap_functional_call(model: nn.Module, x: torch.Tensor) -> Any:
    params = dict(model.named_parameters())
    return vmap(lambda xi: functional_call(model, params, (xi,)))(x.unsqueeze(1))


def _grad_input(model: nn.Module, x: torch.Tensor) -> Any:
    return grad(lambda t: model(t).sum())(x)


def _grad_params(model: nn.Module, x: torch.Tensor) -> Any:
    return grad(lambda p: functional_call(model, p, (x,)).sum())(dict(model.named_parameters()))


def _per_sample_grads(model: nn.Module, x: torch.Tensor) -> Any:
    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xi.unsqueeze(0),)).sum()

    return vmap(grad(loss), in_dims=(None, 0))(dict(model.named_parameters()), x)


def _jacrev(model: nn.Module, x: torch.Tensor) -> Any:
    return jacrev(model)(x[:1])


def _functional_call(model: nn.Module, x: torch.Tensor) -> Any:
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return functional_call(model, own, (x,))


FUNC_TRANSFORMS = {
    "vmap": _vmap,
    "vmap_functional_call": _vmap_functional_call,
    "grad_input": _grad_input,
    "grad_params": _grad_params,
    "per_sample_grads": _per_sample_grads,
    "jacrev": _jacrev,
    "functional_call": _functional_call,
}


@pytest.mark.parametrize("transform", list(FUNC_TRANSFORMS))
def test_func_on_unbuilt_model_refuses_or_builds_never_half(transform: str) -> None:
    x = torch.randn(SHAPE)
    model = lazy_net(train=False)  # eval: BatchNorm can run per sample under vmap
    layers = lazy_layers(model)
    _, error = attempt(FUNC_TRANSFORMS[transform], model, x)
    if error is not None:
        assert isinstance(error, lazynn.LazynnError), f"{type(error).__name__}: {error}"
        assert "LazyConv2d at 'features.0'" in str(error)  # which layer, where
        assert "build" in str(error)  # the fix
        assert_untouched(model, layers)
        torch.manual_seed(0)
        y = model(x)  # a plain call builds it correctly
    else:  # built by the call itself: exactly as eager construction
        y = model(x)
    eager = eager_net(train=False)
    assert torch.equal(y, eager(x))
    assert_built_like(model, eager)
    # and now the transform works, equal to the eager twin's
    out = FUNC_TRANSFORMS[transform](model, x)
    expected = FUNC_TRANSFORMS[transform](eager, x)
    if isinstance(expected, dict):
        assert list(out) == list(expected)
        for name in expected:
            assert torch.equal(out[name], expected[name]), name
    else:
        assert torch.equal(out, expected)


@pytest.mark.parametrize("layer", [lambda: lazynn.MaxPool(2), lambda: lazynn.Conv(4, 3)],
                         ids=["MaxPool", "Conv"])  # fmt: skip
def test_unbuilt_rank_agnostic_layer_under_compile_is_refused_then_compiles_built(
    layer: Callable[[], nn.Module],
) -> None:
    """dynamo fixes the class it traces before it builds a lazy module; a rank-agnostic
    layer's class is its first input's: with fullgraph=True, refused in dynamo's own words
    (a graph break, not an internal error) with lazynn's fix, and fine once built."""
    x = torch.randn(2, 3, 8, 8)
    model = nn.Sequential(layer())
    with pytest.raises(torch._dynamo.exc.Unsupported) as info:
        torch.compile(model, backend="eager", fullgraph=True)(x)
    text = str(info.value)
    assert "lazynn: build under torch.compile" in text
    assert "lazynn.build(model, example), then compile" in text
    assert "please report" not in text.lower()
    assert lazynn.is_lazy(model)
    built = lazynn.build(model, x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(built, backend="eager", fullgraph=True)(x), built(x))


# --- frames dynamo compiles: lazynn's machinery is never traced -------------------------------


class _Recurrent(nn.Module):
    """A user model around a lazy LSTM: dynamo graph-breaks at the RNN (it does not trace
    RNNs) and then compiles, frame by frame, what the layer's first call runs."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.rnn = lazynn.LazyLSTM(5, batch_first=True) if lazy else nn.LSTM(4, 5, batch_first=True)

    def forward(self, x: torch.Tensor) -> Any:
        # (its output as it is: after the graph break, dynamo 2.15 reads .grad of a plain
        # nn.LSTM's output that the frame goes on using, which warns, an error here)
        return self.rnn(x)


def test_a_nested_lstm_builds_from_its_first_compiled_call() -> None:
    # dynamo 2.15 traced the build's functorch check (which reads "inside a transform" when
    # traced) and the error path's frame walk (a warning, which the test settings make an
    # error); the build now runs as Python
    x = torch.randn(2, 3, 4)
    torch.manual_seed(0)
    model = _Recurrent(lazy=True)
    out, _ = torch.compile(model, backend="eager")(x)
    torch.manual_seed(0)
    eager = _Recurrent(lazy=False)
    assert type(model.rnn) is nn.LSTM
    assert torch.equal(out, eager(x)[0])
    assert_built_like(model, eager)


@pytest.mark.parametrize(
    ("make", "shape"),
    [(lambda: lazynn.LazyLinear(3), (2, 4)), (lambda: lazynn.LazyLSTM(3), (2, 5, 4))],
    ids=["LazyLinear", "LazyLSTM"],
)
def test_a_first_call_in_a_frame_dynamo_compiles_builds_as_python(
    make: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    # nn.Module.__call__ on an unbuilt layer inside a compiled function: dynamo traces the
    # call, its pre-hook among it (on torch 2.13 as on 2.15, before the fix: a refusal
    # "inside torch.func" worded by a traced frame walk)
    layer = make()
    x = torch.ones(*shape)
    out = torch.compile(lambda x: nn.Module.__call__(layer, x), backend="eager")(x)
    assert not lazynn.is_lazy(layer)
    torch.testing.assert_close(out, layer(x))


def test_a_traced_module_path_names_the_class_without_a_frame_walk() -> None:
    from lazynn._errors import module_path
    from lazynn._module.refusals import refuse_under_functorch

    model = nn.Sequential(nn.Sequential(lazynn.LazyLinear(3)))
    layer = model[0][0]

    def path(x: torch.Tensor) -> tuple[torch.Tensor, str]:
        refuse_under_functorch(layer)  # (no transform here: never refused, traced or not)
        return x + 1, module_path(layer)

    out, name = torch.compile(path, backend="eager", fullgraph=True)(torch.zeros(1))
    assert name == "LazyLinear"
    assert torch.equal(out, torch.ones(1))
