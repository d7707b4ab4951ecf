"""lazynn.build / lazynn.materialize: whole-model inference on meta, then one allocation.

Reproducible (bit-for-bit equal to the eager twin under one seed, mixed models included),
free of side effects, and atomic (a failure leaves the model exactly as it was).
"""

from __future__ import annotations

import random
import sys
import warnings
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from torch import nn

import lazynn
from lazynn._build.progress import Progress
from paths import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import models


def same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key
    # Every torch.nn layer is exactly the eager twin's class (containers may differ by name).
    for (path, ma), (_, mb) in zip(a.named_modules(), b.named_modules(), strict=True):
        if type(mb).__module__.startswith("torch.nn"):
            assert type(ma) is type(mb), path


def fingerprint(model: nn.Module) -> list[Any]:
    """Everything a failed build must leave as it was: classes, attributes, tensors, hooks."""
    out: list[Any] = []
    for path, m in model.named_modules():
        out.append((path, type(m), sorted(vars(m)), m.training))
        out.append([(n, id(t), type(t)) for n, t in (*m._parameters.items(), *m._buffers.items())])
        out.append((list(m._forward_pre_hooks), list(m._forward_hooks)))
        out.append(repr(m) if not list(m.children()) else None)
    return out


# --- reproducibility ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(models.REFERENCE))
@pytest.mark.parametrize("as_spec", [False, True], ids=["tensor", "spec"])
def test_build_equals_eager_twin(name: str, as_spec: bool) -> None:
    ref = models.REFERENCE[name]
    x = ref.example("cpu")
    example = lazynn.Spec(tuple(x.shape), x.dtype) if as_spec else x
    torch.manual_seed(0)
    lazy = lazynn.build(ref.lazy(), example)
    after_lazy = torch.get_rng_state()
    torch.manual_seed(0)
    eager = ref.eager()
    assert torch.equal(after_lazy, torch.get_rng_state())  # the same numbers were drawn
    assert not lazynn.is_lazy(lazy)
    same_state(lazy, eager)
    lazy.eval()
    eager.eval()
    with torch.no_grad():
        assert torch.equal(lazy(x), eager(x))


@st.composite
def mixed_stacks(draw: st.DrawFn) -> list[tuple[str, int, bool]]:
    """Layers (kind, width, bias) where kind is lazy/eager Linear, LayerNorm or ReLU."""
    n = draw(st.integers(2, 6))
    kinds = st.sampled_from(["lazy", "eager", "eager", "norm", "relu"])
    return [(draw(kinds), draw(st.integers(1, 5)), draw(st.booleans())) for _ in range(n)]


def _stack(layers: list[tuple[str, int, bool]], in_width: int, lazy: bool) -> nn.Sequential:
    modules: list[nn.Module] = []
    width = in_width
    for kind, out, bias in layers:
        if kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "norm":
            modules.append(nn.LayerNorm(width))
        elif kind == "lazy" and lazy:
            modules.append(lazynn.LazyLinear(out, bias=bias))
            width = out
        else:
            modules.append(nn.Linear(width, out, bias=bias))
            width = out
    return nn.Sequential(*modules)


@settings(max_examples=40, deadline=None)
@given(layers=mixed_stacks(), in_width=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_mixed_models_initialize_in_construction_order(
    layers: list[tuple[str, int, bool]], in_width: int, seed: int
) -> None:
    """Eager layers after a lazy one are re-initialized where an eager model draws them."""
    x = torch.randn(2, in_width)
    torch.manual_seed(seed)
    mixed = lazynn.build(_stack(layers, in_width, lazy=True), x)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    eager = _stack(layers, in_width, lazy=False)
    same_state(mixed, eager)
    assert torch.equal(state, torch.get_rng_state())


def _constructed_in(
    layers: list[tuple[str, int, bool]], in_width: int, lazy: bool, order: list[int]
) -> nn.Sequential:
    """``_stack``'s model, its layers after the first constructed in ``order`` (a decoder
    that makes its layers last to first: Dreamer's, torchrl's ``ObsDecoder``), registered in
    stack order."""
    widths = [in_width]
    for kind, out, _ in layers:
        widths.append(out if kind in ("lazy", "eager") else widths[-1])
    made: dict[int, nn.Module] = {}
    for index in [0, *order]:
        kind, out, bias = layers[index]
        if kind == "relu":
            made[index] = nn.ReLU()
        elif kind == "norm":
            made[index] = nn.LayerNorm(widths[index])
        elif kind == "lazy" and lazy:
            made[index] = lazynn.LazyLinear(out, bias=bias)
        else:
            made[index] = nn.Linear(widths[index], out, bias=bias)
    return nn.Sequential(*(made[i] for i in range(len(layers))))


@settings(max_examples=40, deadline=None)
@given(
    layers=mixed_stacks(),
    in_width=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
    door=st.sampled_from(["build", "meta"]),
)
def test_layers_constructed_in_another_order_than_registered_build_as_eager(
    layers: list[tuple[str, int, bool]],
    in_width: int,
    seed: int,
    data: st.DataObject,
    door: str,
) -> None:
    """A model whose layers after the first (lazy) one are constructed in any order: build
    (and build on meta, then materialize) gives the eager model constructed in that order,
    with no warning, and leaves the generator where eager construction does."""
    layers = [("lazy", layers[0][1], layers[0][2]), *layers[1:]]
    order = data.draw(st.permutations(range(1, len(layers))))
    x = torch.randn(2, in_width)
    torch.manual_seed(seed)
    mixed = _constructed_in(layers, in_width, True, order)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if door == "build":
            mixed = lazynn.build(mixed, x)
        else:
            mixed = lazynn.materialize(lazynn.build(mixed, x, device="meta"))
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    eager = _constructed_in(layers, in_width, False, order)
    same_state(mixed, eager)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("door", ["build", "meta"])
def test_a_lazy_layer_registered_last_but_constructed_first_starts_the_stream(door: str) -> None:
    """Constructed c (lazy), b (eager), a (lazy), registered a, b, c: the replay starts where
    the first lazy layer constructed was, so the build is the eager model constructed in
    that order, with no warning."""
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))

    def model(lazy: bool) -> nn.Sequential:
        c = lazynn.LazyLinear(2) if lazy else nn.Linear(4, 2)
        b = nn.Linear(5, 4)
        a = lazynn.LazyLinear(5) if lazy else nn.Linear(3, 5)
        return nn.Sequential(a, b, c)

    torch.manual_seed(0)
    mixed = model(lazy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if door == "build":
            mixed = lazynn.build(mixed, x)
        else:
            mixed = lazynn.materialize(lazynn.build(mixed, x, device="meta"))
    after = torch.get_rng_state()
    torch.manual_seed(0)
    eager = model(lazy=False)
    same_state(mixed, eager)
    assert torch.equal(after, torch.get_rng_state())


def test_eager_layer_changed_after_construction_is_kept_with_a_warning() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), nn.Linear(4, 3), nn.Linear(3, 2))
    with torch.no_grad():
        model[1].weight.zero_()
    with pytest.warns(UserWarning, match=r"kept the values of '1'"):
        lazynn.build(model, (2, 5))
    assert torch.count_nonzero(model[1].weight) == 0
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3), nn.Linear(3, 2))
    assert torch.equal(model[0].weight, eager[0].weight)
    assert torch.equal(model[2].weight, eager[2].weight)  # the stream stayed aligned


def test_builds_torch_lazy_modules_too() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LazyConv2d(4, 3),
        lazynn.LazyBatchNorm2d(),
        nn.Flatten(),
        nn.LazyLinear(5),
        lazynn.LazyLinear(2),
    )
    lazynn.build(model, (2, 3, 8, 8))
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 5), nn.Linear(5, 2)
    )
    same_state(model, eager)


@pytest.mark.parametrize(
    "example",
    [(2, 3), torch.Size([2, 3]), lazynn.Spec((2, 3)), lazynn.Spec((2, 3), torch.float32)],
    ids=["tuple", "size", "spec", "spec-dtype"],
)
def test_shape_specs(example: Any) -> None:
    assert lazynn.build(lazynn.LazyLinear(4), example).in_features == 3


def test_keyword_and_nested_examples() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = lazynn.LazyLinear(2)
            self.b = lazynn.LazyLinear(2)

        def forward(
            self, pair: tuple[torch.Tensor, torch.Tensor], *, scale: torch.Tensor
        ) -> torch.Tensor:
            return self.a(pair[0]) + self.b(pair[1]) * scale

    model = lazynn.build(Two(), ((4, 3), (4, 5)), scale=(4, 1))
    assert (model.a.in_features, model.b.in_features) == (3, 5)


def test_token_ids_need_a_long_spec() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), lazynn.LazyLinear(3))
    lazynn.build(model, lazynn.Spec((2, 7), torch.long))
    assert model[1].in_features == 4


def test_dtype_argument_allocates_in_that_dtype() -> None:
    torch.manual_seed(0)
    model = lazynn.build(
        nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyBatchNorm1d()), (2, 3), dtype=torch.float64
    )
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Linear(3, 4, dtype=torch.float64), nn.BatchNorm1d(4, dtype=torch.float64)
    )
    same_state(model, eager)
    assert model[1].num_batches_tracked.dtype == torch.int64


@pytest.mark.parametrize("name", ["float64", "torch.float64", "double"])
def test_dtype_may_be_named(name: str) -> None:
    torch.manual_seed(0)
    model = lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (2, 3), dtype=name)
    torch.manual_seed(0)
    same_state(model, nn.Sequential(nn.Linear(3, 4, dtype=torch.float64)))


@pytest.mark.parametrize("dtype", [torch.int8, "int8", "float99", 3])
def test_a_dtype_that_is_not_a_floating_point_one_is_refused_before_anything(dtype: object) -> None:
    model = nn.Sequential(lazynn.LazyLinear(4))
    state = torch.get_rng_state()
    with pytest.raises(lazynn.ArgumentError, match=r"lazynn\.build: expected dtype: a floating"):
        lazynn.build(model, (2, 3), dtype=dtype)  # type: ignore[arg-type]
    assert isinstance(model[0], lazynn.LazyLinear)
    assert model[0].has_uninitialized_params()
    assert torch.equal(torch.get_rng_state(), state)


def test_a_misspelt_dtype_name_is_listed_with_a_near_miss() -> None:
    with pytest.raises(lazynn.ArgumentError, match="did you mean 'bfloat16'"):
        lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (2, 3), dtype="bfloat61")


def test_parameters_keep_their_identity() -> None:
    model = nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyLinear(2))
    before = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lazynn.build(model, (3, 5))
    assert all(a is b for a, b in zip(before, model.parameters(), strict=True))
    model(torch.randn(3, 5)).sum().backward()
    old = model[0].weight.detach().clone()
    optimizer.step()
    assert not torch.equal(old, model[0].weight)


# --- no side effects -------------------------------------------------------------------------


def test_no_side_effects() -> None:
    bn = nn.BatchNorm1d(3)
    with torch.no_grad():
        bn.running_mean.fill_(5.0)
    calls: list[str] = []
    model = nn.Sequential(bn, lazynn.LazyLinear(4), nn.Dropout(0.5), lazynn.LazyLinear(2)).eval()
    handle = model[1].register_forward_hook(lambda m, a, o: calls.append(type(m).__name__))
    py_state = random.getstate()
    torch.set_grad_enabled(True)
    lazynn.build(model, (6, 3))
    assert torch.is_grad_enabled()
    assert not model.training
    assert not any(m.training for m in model.modules())
    assert torch.all(bn.running_mean == 5.0)
    assert bn.num_batches_tracked == 0
    assert random.getstate() == py_state
    assert list(model[1]._forward_hooks) == [handle.id]
    calls.clear()
    model(torch.randn(6, 3))
    assert calls == ["Linear"]  # the user's hook survived the build and runs once


def test_build_of_a_built_model_changes_nothing() -> None:
    model = lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (2, 3))
    weight = model[0].weight.detach().clone()
    state = torch.get_rng_state()
    assert lazynn.build(model, (2, 3)) is model
    assert torch.equal(weight, model[0].weight)
    assert torch.equal(state, torch.get_rng_state())


# --- atomic -----------------------------------------------------------------------------------


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [lazynn.LazyLinear(8), nn.ReLU(), nn.Sequential(lazynn.LazyLinear(4), nn.Linear(5, 2))]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_failure_names_the_module_and_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential()
    model.add_module("encoder", Encoder())
    before = fingerprint(model)
    rng = torch.get_rng_state()
    with pytest.raises(lazynn.InferenceError) as info:
        lazynn.build(model, (3, 6))
    text = str(info.value)
    assert "Linear at 'encoder.layers.2.1'" in text
    assert "(3, 4)" in text  # the input shape it received
    assert "Fix:" in text
    assert fingerprint(model) == before
    assert lazynn.is_lazy(model.encoder.layers[0])
    assert torch.equal(rng, torch.get_rng_state())


def test_failure_during_allocation_rolls_back() -> None:
    class Exploding(nn.Linear):
        def reset_parameters(self) -> None:
            if not self.weight.is_meta and getattr(self, "armed", False):
                raise MemoryError("simulated out of memory")
            super().reset_parameters()

    model = nn.Sequential(lazynn.LazyLinear(4), Exploding(4, 2))
    model[1].armed = True
    before = fingerprint(model)
    placeholders = [model[0].weight, model[0].bias]
    rng = torch.get_rng_state()
    with pytest.raises(MemoryError):
        lazynn.build(model, (2, 3))
    assert fingerprint(model) == before
    assert all(lazynn.is_lazy(p) for p in placeholders)
    assert torch.equal(rng, torch.get_rng_state())


def test_unreached_lazy_layer_is_an_error() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = lazynn.LazyLinear(2)
            self.head = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = Branchy()
    with pytest.raises(lazynn.InferenceError, match=r"never called 'head'"):
        lazynn.build(model, (1, 3))
    assert lazynn.is_lazy(model.used)


# --- meta, then materialize ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(models.REFERENCE))
def test_meta_build_then_materialize_equals_eager(name: str) -> None:
    ref = models.REFERENCE[name]
    x = ref.example("cpu")
    torch.manual_seed(0)
    model = lazynn.build(ref.lazy(), x, device="meta")
    metas = [t.is_meta for t in (*model.parameters(), *model.buffers())]
    assert metas[-1]  # the lazy layers are on meta; eager ones before them keep their values
    assert metas == sorted(metas)
    assert not lazynn.is_lazy(model)
    lazynn.materialize(model, device="cpu")
    state = torch.get_rng_state()
    torch.manual_seed(0)
    eager = ref.eager()
    same_state(model, eager)
    assert torch.equal(state, torch.get_rng_state())


def test_materialize_refuses_unbuilt_and_uninitializable_models() -> None:
    with pytest.raises(lazynn.LazynnError, match="build it first"):
        lazynn.materialize(nn.Sequential(lazynn.LazyLinear(2)))

    class Raw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3, device="meta"))

    model = nn.Sequential(nn.Linear(2, 3, device="meta"), Raw())
    with pytest.raises(lazynn.LazynnError, match=r"'1' without one") as info:
        lazynn.materialize(model)
    assert "reset_parameters" in str(info.value)
    assert model[0].weight.is_meta  # nothing was allocated


# --- progress ----------------------------------------------------------------------------------


def test_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    lazynn.build(nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyLinear(2)), (1, 3), progress=True)
    err = capsys.readouterr().err
    assert "lazynn.build [" in err
    assert "100%" in err
    lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (1, 3))  # default: off (not a terminal)
    assert capsys.readouterr().err == ""


def test_progress_bar_says_new_parameters_and_the_model_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a GPT-like model: the embedding is eager (made at construction), the rest lazy. The
    # bar counts what the build makes, and says how large the model is (issue 20: a 406M
    # model read 354M/354M parameters)
    model = nn.Sequential(nn.Embedding(1000, 64), lazynn.LazyLinear(1000))
    lazynn.build(model, lazynn.Spec((1, 2), torch.long), progress=True)
    err = capsys.readouterr().err
    assert "65K/65K new parameters (129K in the model)" in err
    lazynn.build(nn.Sequential(lazynn.LazyLinear(4)), (1, 3), progress=True)
    assert capsys.readouterr().err.endswith("16/16 parameters\n")  # all of it is new


class BarNet(nn.Module):
    """Lazy layers and an eager embedding, made by the factory's own __init__."""

    def __init__(self) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(300)
        self.emb = nn.Embedding(100, 30)
        self.b = lazynn.LazyLinear(20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


#: BarNet's elements: a (30 -> 300), the embedding (100 x 30), b (300 -> 20)
BAR_TOTAL = 30 * 300 + 300 + 100 * 30 + 300 * 20 + 20


def _meta_then_materialize(model: Any, example: Any, **kw: Any) -> nn.Module:
    return lazynn.materialize(lazynn.build(model, example, device="meta"), **kw)


@pytest.mark.parametrize(
    ("door", "figures"),
    [
        (lambda progress: lazynn.build(BarNet, (2, 30), progress=progress), "18K/18K"),
        (lambda progress: lazynn.build(BarNet(), (2, 30), progress=progress), "15K/15K new"),
        (lambda p: lazynn.build(BarNet, (2, 30), progress=p, threads=2), "18K/18K"),
        (lambda p: lazynn.build(BarNet(), (2, 30), progress=p, threads=2), "18K/18K"),
        (lambda p: _meta_then_materialize(BarNet, (2, 30), progress=p), "18K/18K"),
    ],
    ids=["factory", "instance", "factory-threads", "instance-threads", "meta-materialize"],
)
def test_every_door_that_allocates_draws_the_bar_when_asked(
    door: Any, figures: str, capsys: pytest.CaptureFixture[str]
) -> None:
    door(True)
    err = capsys.readouterr().err
    assert err.endswith("\n")
    last = err.rstrip("\n").rsplit("\r", 1)[-1]  # (the bar's last drawing)
    assert last.startswith("lazynn.")
    assert f"[####################] 100% {figures}" in last
    door(False)
    assert capsys.readouterr().err == ""


def test_the_factory_bar_counts_the_model_its_init_allocates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lazynn.build(BarNet, (2, 30), progress=True)
    err = capsys.readouterr().err
    assert f"{BAR_TOTAL // 1000}K/{BAR_TOTAL // 1000}K parameters" in err  # (all of it made)
    lazynn.build(BarNet, (2, 30), device="meta", progress=True)
    assert capsys.readouterr().err == ""  # (on meta nothing is allocated: materialize's bar)


class TiedBar(nn.Module):
    """A GPT-style tie made in __init__: the head's own weight registered, then replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 30)
        self.head = nn.Linear(30, 100, bias=False)
        self.head.weight = self.emb.weight
        self.fc = lazynn.LazyLinear(30)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(x))  # type: ignore[no-any-return]


def test_the_bar_never_counts_past_its_total(capsys: pytest.CaptureFixture[str]) -> None:
    lazynn.build(TiedBar, (2, 30), progress=True)
    last = capsys.readouterr().err.rstrip("\n").rsplit("\r", 1)[-1]
    assert last.endswith("100% 4K/4K parameters")  # (not the replaced head's 7K/4K)


def test_allocation_failure_names_the_bytes_and_the_sizes() -> None:
    # an example with one size far larger than meant: 10**6 features, a 3.6 TiB layer
    model = nn.Sequential(nn.Embedding(100, 4), lazynn.LazyLinear(10**6), lazynn.LazyLinear(10**6))
    before = fingerprint(model)
    with pytest.raises(lazynn.InferenceError) as info:
        lazynn.build(model, lazynn.Spec((1, 2), torch.long))
    text = str(info.value)
    assert "LazyLinear at '2': expected to allocate 3.64 TiB" in text
    assert "1,000,001,000,000 parameters and buffers (its inputs gave in_features=1000000)" in text
    assert "can't allocate memory" in text  # torch's words
    assert "check the example inputs' sizes" in text
    assert fingerprint(model) == before


def test_progress_defaults_to_off_for_small_or_piped() -> None:
    assert not Progress(10, "x").enabled
    assert not Progress(10**9, "x").enabled  # stderr is not a terminal under pytest
    assert Progress(10, "x", enabled=True).enabled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Progress(0, "x", enabled=True).close()


# --- review findings ----------------------------------------------------------------------------


class TiedLM(nn.Module):
    """ids (N, T) -> logits (N, T, 10), with the head tied to the embedding."""

    def __init__(self, lazy_first: bool) -> None:
        super().__init__()
        if lazy_first:
            self.body = lazynn.LazyLinear(6)
            self.emb = nn.Embedding(10, 6)
        else:
            self.emb = nn.Embedding(10, 6)
            self.body = lazynn.LazyLinear(6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight
        self.lazy_first = lazy_first

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.lazy_first:
            return self.head(self.body(self.emb.weight[:1]).expand(ids.shape[1], 6))
        return self.head(self.body(self.emb(ids)))


@pytest.mark.parametrize("lazy_first", [False, True])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_tied_weights_stay_tied(lazy_first: bool, device: str) -> None:
    ids = lazynn.Spec((2, 3), torch.long)
    torch.manual_seed(0)
    model = lazynn.build(TiedLM(lazy_first), ids, device=device)
    if device == "meta":
        lazynn.materialize(model)
    assert model.head.weight is model.emb.weight
    torch.manual_seed(0)
    eager = TiedLM(lazy_first)
    eager.body = nn.Linear(6, 6)  # what the lazy layer becomes, constructed in place
    torch.manual_seed(0)
    # construct the eager twin in the same order as the lazy one
    emb_first = not lazy_first
    first = nn.Embedding(10, 6) if emb_first else nn.Linear(6, 6)
    second = nn.Linear(6, 6) if emb_first else nn.Embedding(10, 6)
    head = nn.Linear(6, 10, bias=False)
    emb, body = (first, second) if emb_first else (second, first)
    assert torch.equal(model.emb.weight, emb.weight)
    assert torch.equal(model.body.weight, body.weight)
    del head


def test_draws_between_construction_and_build_are_not_repeated() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), nn.Linear(4, 2))
    a = torch.rand(1000)
    with pytest.warns(UserWarning, match="or between constructing the model and build"):
        lazynn.build(model, (8, 3))
    b = torch.rand(1000)
    for offset in range(0, 64):
        assert not torch.equal(a[offset : offset + 100], b[:100])


class _ViT(nn.Module):
    """A ViT's shape: the parent creates ``cls_token`` and ``pos`` in its own ``__init__``."""

    def __init__(self, lazy: bool, tokens_first: bool) -> None:
        super().__init__()

        def patch() -> nn.Module:
            return lazynn.LazyConv2d(6, 4, stride=4) if lazy else nn.Conv2d(3, 6, 4, stride=4)

        if not tokens_first:
            self.patch = patch()
        self.cls_token = nn.Parameter(torch.randn(1, 1, 6))
        self.pos = nn.Parameter(torch.empty(1, 5, 6).normal_(std=0.02))
        if tokens_first:
            self.patch = patch()
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(x[:, 0])  # type: ignore[no-any-return]


def test_tensors_a_parent_draws_after_a_lazy_layer_are_named_as_the_cause() -> None:
    example = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    model = _ViT(lazy=True, tokens_first=False)
    with pytest.warns(UserWarning, match=r"'cls_token', 'pos' \(tensors a module creates") as got:
        lazynn.build(model, example)
    assert "before the first lazy layer in __init__" in str(got[0].message)
    assert "lazynn.build(Net, example) (the factory form" in str(got[0].message)
    # the factory form: the same code, exact, with no warning
    torch.manual_seed(0)
    eager = _ViT(lazy=False, tokens_first=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = lazynn.build(lambda: _ViT(lazy=True, tokens_first=False), example)
    assert torch.equal(torch.get_rng_state(), after)
    for a, b in zip(made.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_tensors_a_parent_draws_before_its_lazy_layers_give_the_eager_twin() -> None:
    example = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    model = _ViT(lazy=True, tokens_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazynn.build(model, example)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    eager = _ViT(lazy=False, tokens_first=True)
    assert torch.equal(torch.get_rng_state(), after)
    expected = eager.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_layers_initialized_outside_reset_parameters_are_reported() -> None:
    model = nn.Sequential(lazynn.LazyLinear(8), nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.warns(UserWarning, match=r"'1.self_attn' initializes outside reset_parameters"):
        lazynn.build(model, (3, 2, 5))


def test_torch_lazy_first_is_reported_when_eager_layers_follow() -> None:
    model = nn.Sequential(nn.LazyLinear(5), nn.Linear(5, 6))
    with pytest.warns(UserWarning, match="is torch's own"):
        lazynn.build(model, (2, 3))


def test_failure_while_planning_changes_no_values() -> None:
    class Exploding(nn.Linear):
        def reset_parameters(self) -> None:
            if not self.weight.is_meta and getattr(self, "armed", False):
                raise MemoryError("simulated")
            super().reset_parameters()

    model = nn.Sequential(lazynn.LazyLinear(4), nn.Linear(4, 4), Exploding(4, 2))
    model[2].armed = True
    before = [t.detach().clone() for t in model[1].parameters()]
    with pytest.raises(MemoryError):
        lazynn.build(model, (2, 3))
    assert all(torch.equal(a, b) for a, b in zip(before, model[1].parameters(), strict=True))
    assert lazynn.is_lazy(model[0])


class _TiedToEager(nn.Module):
    """A lazy head whose weight is an eager embedding's (the placeholder replaced by a tie)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = lazynn.LazyLinear(10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("device", [None, "meta"])
def test_a_lazy_layer_tied_to_an_eager_tensor_builds_and_summarizes(device: str | None) -> None:
    """The tied tensor tells the layer's device: a meta rehearsal (build, summary) does not
    compare the input with the replaced placeholder's."""
    tokens = lazynn.Spec((2, 3), torch.long)
    assert lazynn.summary(_TiedToEager(), tokens).total_parameters == 80
    model = lazynn.build(_TiedToEager(), tokens, device=device)
    assert type(model.head) is nn.Linear
    assert model.head.weight is model.emb.weight
    assert model.head.in_features == 8


def test_an_example_drawn_after_the_construction_is_named_at_the_users_line() -> None:
    """The usual script (seed, construct, ``x = torch.randn(...)``, build): the warning names
    the example as what was drawn, how to draw it apart, and points at the user's line, not
    lazynn's (issue 36, issue 38)."""
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), nn.Linear(4, 2))
    x = torch.randn(8, 3)
    with pytest.warns(UserWarning, match="lazynn.build") as caught:
        lazynn.build(model, x)
    (warning,) = [w for w in caught if "lazynn.build" in str(w.message)]
    assert "the example inputs were drawn from torch's generator after the model" in str(
        warning.message
    )
    assert "generator=torch.Generator().manual_seed(0)" in str(warning.message)
    assert warning.filename == __file__


def test_init_code_drawing_on_eager_layers_is_named_as_a_cause() -> None:
    """An init pass over the eager layers after a lazy one was constructed (T5's post_init):
    the warning names it, and the factory form, not only a draw before build()."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = lazynn.LazyLinear(4)
            self.head = nn.Linear(4, 2)
            nn.init.normal_(self.head.weight, std=0.02)  # (the eager layer drawn again)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))  # type: ignore[no-any-return]

    torch.manual_seed(0)
    model = Net()
    with pytest.warns(UserWarning, match="lazynn.build") as caught:
        lazynn.build(model, (8, 3))
    text = " ".join(str(w.message) for w in caught)
    assert "an init pass over eager layers, such as self.apply(init_fn) or a post_init" in text
    assert "lazynn.build(Net, example) (the factory form" in text
    assert all(w.filename == __file__ for w in caught)
