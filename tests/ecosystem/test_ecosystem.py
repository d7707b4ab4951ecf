"""The torch ecosystem sees lazynn modules as lazy, and works with them.

torch.compile (dynamo's lazy-module protocol), TorchScript and DataParallel's replication
refuse or build an unbuilt lazynn model the way they do torch's own lazy modules
(DistributedDataParallel and FSDP2: tests/building/test_distributed.py).
``torch.func.functional_call``,
direct ``.forward()`` calls, input-reshaping forward pre-hooks and ``torch.func.grad`` as the
first call either build the module correctly or fail with a clear lazynn error that leaves it
unbuilt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

import lazynn
from compare import assert_same_module
from lazynn._module.lifecycle import is_unbuilt
from lazynn._module.tensors import is_placeholder
from registry import TENSOR_ROWS, Row, assert_known_initial, has_tensors, lazy_tensors


def _all_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def assert_unbuilt(module: nn.Module, row: Row) -> None:
    """Still entirely unbuilt: lazy class, build hook attached, every tensor a placeholder
    (a layer with no tensors of its own, a pool, has none) but the known buffers, which hold
    their value before the build (the lazy norms' num_batches_tracked: tensor(0))."""
    assert type(module) is row.lazy
    assert is_unbuilt(module)
    assert lazynn.is_lazy(module)
    tensors = lazy_tensors(module)
    assert bool(tensors) == has_tensors(row)
    for t in tensors.values():
        assert type(t) in (lazynn.UninitializedParameter, lazynn.UninitializedBuffer)
    assert_known_initial(module)


def eager_twin(row: Row, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return row.new_eager(row.simple, row.simple_size)


# --- recognized as lazy -----------------------------------------------------------------------


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_torch_is_lazy_recognizes_placeholders(row: Row) -> None:
    layer = row.lazy(**row.simple)
    tensors = lazy_tensors(layer)
    assert tensors
    for t in tensors.values():
        assert torch.nn.parameter.is_lazy(t)
    assert_known_initial(layer)  # num_batches_tracked: a real tensor, not lazy, already
    row.call(layer, row.example())
    for t in _all_tensors(layer):
        assert not torch.nn.parameter.is_lazy(t)


# --- torch.compile ----------------------------------------------------------------------------


class _Net(nn.Module):
    """A user model: conv, batchnorm, and a Sequential head with Flatten + Linear."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        if lazy:
            self.conv: nn.Module = lazynn.LazyConv2d(4, 3)
            self.bn: nn.Module = lazynn.LazyBatchNorm2d()
            self.head = nn.Sequential(nn.Flatten(), lazynn.LazyLinear(5))
        else:
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))))


@pytest.fixture
def dynamo_reset() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.compile
@pytest.mark.usefixtures("dynamo_reset")
def test_compile_fullgraph_builds_nested_lazy_layers() -> None:
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    model = _Net(lazy=True)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    y = compiled(x)  # fullgraph=True: any graph break raises here
    torch.manual_seed(0)
    eager = _Net(lazy=False)
    y_eager = eager(x)

    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    assert not any(is_unbuilt(m) or m._forward_pre_hooks for m in model.modules())
    assert not lazynn.is_lazy(model)
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        assert type(p) is nn.Parameter, name
        assert torch.equal(p, q), name  # built eagerly under the same seed: bit-equal
    # Inductor may fuse and reorder float math, so the outputs (and the running statistics
    # they update) are close, not bit-equal.
    torch.testing.assert_close(y, y_eager)
    for (name, b), (_, c) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=name)
    # The compiled model keeps working on the built modules.
    torch.testing.assert_close(compiled(x), eager(x))


@pytest.mark.compile
@pytest.mark.usefixtures("dynamo_reset")
def test_compile_fullgraph_of_a_bare_lazy_layer() -> None:
    # torch's own nn.LazyLinear compiles with fullgraph=True as the root module.
    x = torch.randn(2, 5)
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(3)
    y = torch.compile(layer, backend="inductor", fullgraph=True)(x)
    torch.manual_seed(0)
    eager = nn.Linear(5, 3)
    # compiled alike: torch marks a compiled module (_is_torch_compile), eager or not
    torch.testing.assert_close(y, torch.compile(eager, backend="inductor", fullgraph=True)(x))
    assert_same_module(layer, eager)


# --- DistributedDataParallel: tests/building/test_distributed.py (2 gloo ranks) ----------------


# --- TorchScript ------------------------------------------------------------------------------


def scripted_output(module: nn.Module, row: Row, x: torch.Tensor) -> torch.Tensor | Exception:
    """The scripted module's output, or the error of scripting or running it."""
    try:
        return row.call(torch.jit.script(module), x)
    except Exception as error:  # reported by the caller
        return error


# torch's own warning when scripting nn.Transformer (eager alike), not about lazynn
@pytest.mark.filterwarnings("ignore:'norm' was found in ScriptModule constants")
@pytest.mark.parametrize("nested", [False, True], ids=["bare", "nested"])
def test_jit_script_refuses_unbuilt_then_scripts_built(row: Row, nested: bool) -> None:
    layer = row.lazy(**row.simple)
    model = nn.Sequential(nn.Identity(), layer) if nested else layer
    with pytest.raises(RuntimeError, match=r"uninitialized (parameters|buffers)"):
        torch.jit.script(model)
    assert_unbuilt(layer, row)
    x = row.example()
    model.eval()
    y = row.call(layer, x)
    eager = nn.Sequential(nn.Identity(), eager_twin(row)) if nested else eager_twin(row)
    if nested and len(row.args(layer, x)) > 1:
        # nn.Sequential passes one input: script the built layer itself, found in the model
        model, eager = model[1], eager[1]
    ours = scripted_output(model, row, x)
    theirs = scripted_output(eager.eval(), row, x)
    if isinstance(theirs, Exception):
        # torch cannot script (or run scripted) the eager twin either (torch 2.13:
        # SyncBatchNorm.forward calls torch.distributed.is_available(), which script cannot
        # resolve; a bare RNN/LSTM/GRU scripts into a module without forward;
        # AdaptiveLogSoftmaxWithLoss's head is not typed as script wants;
        # LinearCrossEntropyLoss's options class has no source script can read): the built
        # layer fails as it does, with torch's error, no longer lazynn's. Not the same
        # messages: script caches the class, so a second attempt says "Can't redefine method".
        assert isinstance(ours, Exception), f"scripts, unlike its eager twin: {theirs!r}"
        assert not isinstance(ours, lazynn.LazynnError), ours
        return
    assert not isinstance(ours, Exception), ours
    assert torch.equal(ours, y)


# --- DataParallel replication -----------------------------------------------------------------


def test_data_parallel_replication_refuses_unbuilt(row: Row) -> None:
    layer = row.lazy(**row.simple)
    with pytest.raises(lazynn.UnbuiltError, match=row.lazy.__name__) as info:
        layer._replicate_for_data_parallel()
    text = str(info.value)
    assert "DataParallel" in text
    assert "Fix: build the model before wrapping it" in text
    assert "call it once on an example input" in text
    assert_unbuilt(layer, row)


# --- item 10: first calls that are not plain calls --------------------------------------------


def test_functional_call_with_real_tensors_builds_own_placeholders(row: Row) -> None:
    x = row.example()
    substitutes = dict(eager_twin(row, seed=123).state_dict())
    torch.manual_seed(0)
    layer = row.lazy(**row.simple)
    own = {name: id(t) for name, t in (*layer.named_parameters(), *layer.named_buffers())}
    copies = {k: v.clone() for k, v in substitutes.items()}
    y = row.out(functional_call(layer, copies, row.args(layer, x)))
    # the module's own placeholders were built (same objects), under the current seed
    assert {n: id(t) for n, t in (*layer.named_parameters(), *layer.named_buffers())} == own
    # the eager twin through the same call: nn.RNN keeps the substitutes in _flat_weights
    # after a functional_call (torch's own behaviour; its next forward refreshes them)
    twin = eager_twin(row, seed=0)
    twin_copies = {k: v.clone() for k, v in substitutes.items()}
    functional_call(twin, twin_copies, row.args(twin, x))
    assert_same_module(layer, twin)
    reference = eager_twin(row, seed=123)
    expected = functional_call(reference, dict(reference.state_dict()), row.args(reference, x))
    assert torch.equal(y, row.out(expected))


def test_functional_call_with_own_placeholders_builds(row: Row) -> None:
    x = row.example()
    torch.manual_seed(0)
    layer = row.lazy(**row.simple)
    own = {**dict(layer.named_parameters()), **dict(layer.named_buffers())}
    y = row.out(functional_call(layer, own, row.args(layer, x)))
    eager = eager_twin(row)
    assert torch.equal(y, row.call(eager, x))
    assert_same_module(layer, eager)
    built = dict((*layer.named_parameters(), *layer.named_buffers()))
    for name, t in own.items():  # the dict's placeholders are the built tensors
        assert not is_placeholder(t), name
        assert t is built[name], name  # (a known buffer too: reset in place, as torch's)
        assert torch.equal(t, built[name]), name


def test_direct_forward_call_is_refused_clearly(row: Row) -> None:
    """`.forward()` skips hooks, so it cannot build: a clear error, and nothing changes.

    (lazynn layers keep the eager `forward`, so `torch.compile` of a bare lazy layer can
    inline it; see test_compile_fullgraph_of_a_bare_lazy_layer.)
    """
    x = row.example()
    layer = row.lazy(**row.simple)
    # a rank-agnostic layer, whose class is not chosen yet, refuses in its own forward
    advice = r"a call of the module, which builds it \(model\(x\)\), received a direct \.forward"
    if not row.agnostic:  # the placeholders refuse, in the eager forward
        advice = r"model\(x\), not model\.forward\(x\)"
    with pytest.raises(lazynn.UnbuiltError, match=advice):
        layer.forward(*row.args(layer, x))
    assert lazynn.is_lazy(layer)
    assert type(layer) is row.lazy
    torch.manual_seed(0)
    y = row.call(layer, x)
    eager = eager_twin(row)
    assert torch.equal(y, row.call(eager, x))
    assert_same_module(layer, eager)


def _flattening_hook(with_kwargs: bool) -> Any:
    if with_kwargs:

        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (args[0].flatten(1),), kwargs

        return hook
    return lambda module, args: (args[0].flatten(1),)


@pytest.mark.parametrize("with_kwargs", [False, True])
def test_pre_hooks_run_around_the_build_as_torchs(with_kwargs: bool) -> None:
    """The build hook runs where torch's does: after pre-hooks registered before it (or with
    prepend=True: a reshaping hook then decides the sizes), before those registered later
    (tensordict's to_module registers one that must see the built parameters)."""
    n, c, h, w = 2, 3, 4, 5
    x = torch.randn(n, c, h, w)
    layer = lazynn.LazyLinear(3)
    layer.register_forward_pre_hook(
        _flattening_hook(with_kwargs), with_kwargs=with_kwargs, prepend=True
    )
    y = layer(x)
    assert type(layer) is nn.Linear
    assert layer.in_features == c * h * w
    assert y.shape == (n, 3)
    assert len(layer._forward_pre_hooks) == 1  # the user's hook stays, the build hook is gone

    seen: dict[str, Any] = {}
    for library in (nn, lazynn):
        later = library.LazyLinear(3)
        later.register_forward_pre_hook(
            lambda module, args, name=library.__name__: seen.__setitem__(name, type(module.weight))
        )
        later(torch.randn(n, w))
    assert seen == {"torch.nn": nn.Parameter, "lazynn": nn.Parameter}  # built before the hook


def test_func_grad_over_functional_call_first_call(row: Row) -> None:
    x = row.example()
    torch.manual_seed(0)
    layer = row.lazy(**row.simple)
    params = dict(layer.named_parameters())

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return row.out(functional_call(layer, p, row.args(layer, x))).sum()

    try:
        grads = torch.func.grad(loss)(params)
    except lazynn.LazynnError as error:
        text = str(error)
        assert row.lazy.__name__ in text
        assert "Fix:" in text
        assert_unbuilt(layer, row)  # never half-built
        torch.manual_seed(0)
        row.call(layer, x)
        eager = eager_twin(row)
        row.call(eager, x)
        assert_same_module(layer, eager)
    else:  # it worked: the module is built, equal to eager, and the gradients are right
        eager = eager_twin(row)
        assert_same_module(layer, eager)
        expected = torch.func.grad(
            lambda p: row.out(functional_call(eager, p, row.args(eager, x))).sum()
        )(dict(eager.named_parameters()))
        assert grads.keys() == expected.keys()
        for name in expected:
            assert torch.equal(grads[name], expected[name]), name
