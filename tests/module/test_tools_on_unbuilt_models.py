"""Transforms before the build: what users do right after constructing a model, on an unbuilt one.

Each either works through lazynn.on_build (run as soon as the module is built, in the order
queued, with the numbers an eager model gets) or raises lazynn's UnbuiltError naming the fix,
leaving the model as it was. None silently does nothing.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune
from torch.nn.utils.parametrizations import orthogonal, spectral_norm, weight_norm
from torch.optim.swa_utils import AveragedModel

import lazynn

X = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))


class Net(nn.Module):
    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.fc1 = lazynn.LazyLinear(6) if lazy else nn.Linear(5, 6)
        self.norm = lazynn.LazyBatchNorm1d() if lazy else nn.BatchNorm1d(6)
        self.fc2 = lazynn.LazyLinear(3) if lazy else nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.xavier_normal_(m.weight)
        nn.init.uniform_(m.bias, -0.1, 0.1)


def same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def unchanged(model: nn.Module, before: list[tuple[str, torch.Tensor]]) -> None:
    assert lazynn.is_lazy(model)
    after = list(model.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(p is q for (_, p), (_, q) in zip(after, before, strict=True))


# --- on_build ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["build", "first-call", "meta+materialize", "checkpoint"])
def test_custom_init_equals_eager_apply(how: str) -> None:
    torch.manual_seed(0)
    eager = Net(lazy=False).apply(init)
    after_eager = torch.get_rng_state()
    torch.manual_seed(0)
    model = Net(lazy=True)
    handle = lazynn.on_build(model, lambda m: m.apply(init))
    assert handle.pending
    if how == "build":
        lazynn.build(model, X)
    elif how == "first-call":
        out = model(X)  # built whole, then initialized, then run
        assert torch.equal(out, Net.forward(eager.train(), X))
    elif how == "meta+materialize":
        lazynn.build(model, X, device="meta")
        assert not handle.pending  # (run on meta: its steps are part of the init programs)
        lazynn.materialize(model, "cpu")
    else:
        model.load_state_dict(eager.state_dict())
        # As the eager program: construct, initialize (the queue), then load. The stream is
        # where the eager construction and init leave it; the values are the checkpoint's.
        assert torch.equal(torch.get_rng_state(), after_eager)
    assert not handle.pending
    same(model, eager)


def test_a_checkpoint_load_runs_the_queue_before_the_values_are_copied() -> None:
    """Loaded values win: the queue (an init, an EMA copy) meets the layers as constructed,
    then the checkpoint's values are copied in (construct, initialize, load)."""
    source = Net(lazy=False)
    with torch.no_grad():
        source.fc1.weight.fill_(7.0)
    model = Net(lazy=True)
    copies: list[nn.Module] = []
    lazynn.on_build(model, lambda m: copies.append(copy.deepcopy(m)))
    lazynn.on_build(model, lambda m: nn.init.zeros_(m.fc1.weight))
    model.load_state_dict(source.state_dict())
    assert torch.equal(model.fc1.weight, source.fc1.weight)  # the checkpoint's
    (ema,) = copies
    assert not lazynn.is_lazy(ema)
    assert ema.fc1.weight.abs().sum() > 0  # constructed values, never uninitialized memory
    assert not torch.equal(ema.fc1.weight, source.fc1.weight)


def test_per_layer_function_runs_before_the_layers_first_forward() -> None:
    fc = lazynn.LazyLinear(3)
    lazynn.on_build(fc, lambda m: nn.init.zeros_(m.weight))
    out = fc(X)
    assert torch.equal(out, fc.bias.expand(4, 3))
    assert type(fc) is nn.Linear


def test_queue_runs_in_order_once() -> None:
    model = Net(lazy=True)
    calls: list[str] = []
    lazynn.on_build(model.fc2, lambda m: calls.append("fc2"))
    lazynn.on_build(model, lambda m: calls.append("model"))
    lazynn.on_build(model.fc1, lambda m: calls.append("fc1"))
    model(X)
    model(X)
    lazynn.build(model, X)
    assert calls == ["fc2", "model", "fc1"]


def test_built_module_runs_at_once_and_removed_never_runs() -> None:
    built = lazynn.build(Net(lazy=True), X)
    calls: list[str] = []
    handle = lazynn.on_build(built, lambda m: calls.append("now"))
    assert calls == ["now"]
    assert not handle.pending
    model = Net(lazy=True)
    handle = lazynn.on_build(model, lambda m: calls.append("never"))
    handle.remove()
    model(X)
    assert calls == ["now"]
    assert not model._forward_pre_hooks  # its hooks went with it


def test_failing_function_leaves_the_model_as_it_was_and_stays_queued() -> None:
    model = nn.Sequential(nn.Linear(5, 5), Net(lazy=True))
    eager_before = model[0].weight.detach().clone()
    attempts: list[int] = []

    def flaky(m: nn.Module) -> None:
        nn.init.zeros_(m[0].weight)  # changes an eager layer, then fails
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("boom")

    before = list(model.named_parameters())
    handle = lazynn.on_build(model, flaky)
    with pytest.raises(RuntimeError, match="boom"):
        model(X)
    unchanged(model, before)
    assert torch.equal(model[0].weight, eager_before)
    assert handle.pending
    model(X)
    assert not handle.pending
    assert not model[0].weight.any()


def test_unreached_layers_wait_and_the_forward_still_runs() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head, self.aux = (
                lazynn.LazyLinear(4),
                lazynn.LazyLinear(2),
                lazynn.LazyLinear(1),
            )

        def forward(self, x: torch.Tensor, aux: bool = False) -> torch.Tensor:
            h = self.body(x)
            return self.aux(h) if aux else self.head(h)

    model = TwoHeads()
    handle = lazynn.on_build(model, lambda m: None)
    assert model(X).shape == (4, 2)
    assert handle.pending
    assert lazynn.is_lazy(model.aux)
    model(X, aux=True)
    assert not handle.pending


def test_not_callable_is_refused() -> None:
    with pytest.raises(lazynn.LazynnError, match="a function taking the module"):
        lazynn.on_build(Net(lazy=True), "init")  # type: ignore[arg-type]


# --- each transform: through on_build, and refused when applied to an unbuilt model -----


def _sym(x: torch.Tensor) -> torch.Tensor:
    return x.triu() + x.triu(1).transpose(-1, -2)


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _sym(x)


TRANSFORMS: dict[str, Callable[[nn.Module], Any]] = {
    "init": lambda m: m.apply(init),
    "weight_norm": lambda m: weight_norm(m.fc1),
    "spectral_norm": lambda m: spectral_norm(m.fc1),
    "orthogonal": lambda m: orthogonal(m.fc2),
    "register_parametrization": lambda m: parametrize.register_parametrization(
        m.fc2, "weight", nn.Identity()
    ),
    "prune": lambda m: prune.l1_unstructured(m.fc1, "weight", amount=0.5),
}
#: what the message names as the tool
TOOL = {"init": "torch.nn.init", "prune": "pruning"}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_through_on_build_equals_eager(name: str) -> None:
    transform = TRANSFORMS[name]
    torch.manual_seed(0)
    eager = Net(lazy=False)
    transform(eager)
    torch.manual_seed(0)
    model = Net(lazy=True)
    lazynn.on_build(model, transform)
    out = model(X)  # built whole, transformed, then run
    assert torch.equal(out, eager(X))
    # parametrizations make a class per instance: compare by name
    assert [type(m).__name__ for m in model.modules()] == [
        type(m).__name__ for m in eager.modules()
    ]
    same(model, eager)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_on_an_unbuilt_model_is_refused_with_the_fix(name: str) -> None:
    model = Net(lazy=True)
    before = list(model.named_parameters())
    classes = [type(m) for m in model.modules()]
    with pytest.raises(lazynn.UnbuiltError, match=r"lazynn\.on_build\(module, fn\)") as info:
        TRANSFORMS[name](model)
    assert TOOL.get(name, "parametrization") in str(info.value)
    unchanged(model, before)
    assert [type(m) for m in model.modules()] == classes
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    model(X)  # still builds
    assert not lazynn.is_lazy(model)


@pytest.mark.parametrize("old", [nn.utils.weight_norm, nn.utils.spectral_norm])
def test_torchs_deprecated_weight_and_spectral_norm_refuse_with_their_own_error(
    old: Callable[[nn.Module], nn.Module],
) -> None:
    model = Net(lazy=True)
    before = list(model.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="uninitialized parameters"):
            old(model.fc1)
    unchanged(model, before)


def test_freezing_an_unbuilt_model_holds_after_the_build() -> None:
    model = Net(lazy=True).requires_grad_(False)
    model.fc2.requires_grad_(True)
    early = list(model.parameters())
    model(X)
    assert [p.requires_grad for p in model.parameters()] == [False] * 4 + [True] * 2
    assert all(p is q for p, q in zip(model.parameters(), early, strict=True))


def test_convert_sync_batchnorm() -> None:
    model = Net(lazy=True)
    with pytest.raises(lazynn.UnbuiltError, match=r"LazySyncBatchNorm.*on_build"):
        nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert type(model.norm) is lazynn.LazyBatchNorm1d
    lazynn.on_build(model, nn.SyncBatchNorm.convert_sync_batchnorm)
    lazynn.build(model, X)
    assert type(model.norm) is nn.SyncBatchNorm
    assert model.norm.num_features == 6


def test_averaged_model() -> None:
    model = Net(lazy=True)
    early = AveragedModel(model)  # a copy of the unbuilt model: its update is refused
    model(X)
    with pytest.raises(lazynn.UnbuiltError, match=r"AveragedModel.*after the build"):
        early.update_parameters(model)
    fresh = Net(lazy=True)
    holder: list[AveragedModel] = []
    lazynn.on_build(fresh, lambda m: holder.append(AveragedModel(m)))
    fresh(X)
    (ema,) = holder
    ema.update_parameters(fresh)
    same(ema.module, fresh)


@pytest.mark.parametrize("inplace", [False, True])
def test_quantization_of_an_unbuilt_model_is_refused_not_skipped(inplace: bool) -> None:
    model = Net(lazy=True)
    before = list(model.named_parameters())
    with pytest.raises(lazynn.UnbuiltError, match=r"quantization.*lazynn\.build\(model"):
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, inplace=inplace)
    unchanged(model, before)
    lazynn.build(model, X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch deprecates quantized dtypes
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, inplace=inplace)
    assert type(quantized.fc1).__module__.startswith("torch.ao.nn.quantized.dynamic")


# --- on_build with the first calls users write ---------------------------------------------


class Up(nn.Module):
    """A forward with a tuple argument (not a shape to make a tensor of)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = lazynn.LazyConv2d(4, 3, padding=1)

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return nn.functional.interpolate(self.conv(x), size=size)


class Masked(nn.Module):
    """A forward that needs values (it cannot run on meta tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if mask.any():
            x = x * mask.unsqueeze(-1)
        return self.fc(x)


def test_a_first_call_with_a_tuple_argument_builds_and_runs_the_queue() -> None:
    model = Up()
    handle = lazynn.on_build(model, lambda m: nn.init.zeros_(m.conv.bias))
    assert model(torch.randn(1, 3, 8, 8), (16, 16)).shape == (1, 4, 16, 16)
    assert not handle.pending
    assert not model.conv.bias.any()


def test_a_forward_that_needs_values_builds_as_a_first_call_and_the_queue_runs_next() -> None:
    model = Masked()
    x, mask = torch.randn(2, 5, 3), torch.ones(2, 5, dtype=torch.bool)
    handle = lazynn.on_build(model, lambda m: nn.init.zeros_(m.fc.bias))
    out = model(x, mask)  # built layer by layer, as without a queue
    assert out.shape == (2, 5, 4)
    assert handle.pending  # (changing parameters now would break this forward's backward)
    out.sum().backward()
    model(x, mask)
    assert not handle.pending
    assert not model.fc.bias.any()


def test_a_queued_function_may_run_the_model() -> None:
    """Data-dependent init (LSUV, ActNorm): the queue is off while it runs."""
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(2))
    batch = torch.randn(16, 3)
    runs: list[int] = []

    def data_init(m: nn.Module) -> None:
        runs.append(1)
        with torch.no_grad():
            m[2].bias.sub_(m(batch).mean(0))

    lazynn.on_build(model, data_init)
    model(batch)
    assert runs == [1]
    with torch.no_grad():
        torch.testing.assert_close(model(batch).mean(0), torch.zeros(2), atol=1e-6, rtol=0)


def test_pre_hooks_see_the_call_once() -> None:
    model = nn.Sequential(lazynn.LazyLinear(2))
    model.register_forward_pre_hook(lambda m, args: (args[0].flatten(1),))
    lazynn.on_build(model, lambda m: None)
    assert model(torch.randn(4, 2, 5)).shape == (4, 2)
    assert model[0].in_features == 10


def test_a_copy_carries_its_queue_and_leaves_no_hooks_once_run() -> None:
    import copy

    model = Net(lazy=True)
    lazynn.on_build(model, lambda m: nn.init.zeros_(m.fc1.bias))
    twin = copy.deepcopy(model)
    model(X)
    twin(X)
    for m in (model, twin):
        assert not m.fc1.bias.any()
        assert not m._forward_pre_hooks
        assert not m._load_state_dict_post_hooks


def test_a_custom_layer_that_keeps_its_class_counts_as_built() -> None:
    class LazyScale(lazynn.LazyModuleMixin, nn.Module):
        cls_to_become = None

        def __init__(self) -> None:
            super().__init__()
            self.weight = lazynn.UninitializedParameter()

        def initialize_parameters(self, x: torch.Tensor) -> None:
            with torch.no_grad():
                self.weight.materialize((x.shape[-1],))
                self.weight.fill_(1.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    model = nn.Sequential(LazyScale(), lazynn.LazyLinear(2))
    ran: list[int] = []
    lazynn.on_build(model, lambda m: ran.append(1))
    model(X)
    assert ran == [1]


def test_a_due_layer_beside_an_unreached_one_runs() -> None:
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.aux = lazynn.LazyLinear(4), lazynn.LazyLinear(1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    model = Heads()
    inner = lazynn.on_build(model.body, lambda m: nn.init.zeros_(m.bias))
    outer = lazynn.on_build(model, lambda m: None)
    model(X)
    assert not inner.pending  # its layer is built (the placeholder beside it is not copied)
    assert outer.pending
    assert not model.body.bias.any()
