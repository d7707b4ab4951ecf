"""lazynn.build(Net, example): the model's own construction, run on meta to learn the sizes and
then for real, equals the eager program bit for bit; what it refuses, it names.

(Real-shaped models with their published init code: tests/building/test_real_models.py.)
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from torch import nn

import lazynn

X = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))


class Net(nn.Module):
    """Init code of every kind in __init__: shape-needing initializers, a size read off a lazy
    layer, a parameter made after the first lazy layer, a buffer computed from sizes."""

    def __init__(self, lazy: bool, width: int = 8) -> None:
        super().__init__()
        self.fc1 = lazynn.LazyLinear(width) if lazy else nn.Linear(5, width)
        self.scale = nn.Parameter(torch.randn(width))  # drawn after the first lazy layer
        self.fc2 = lazynn.LazyLinear(3) if lazy else nn.Linear(width, 3)
        nn.init.xavier_uniform_(self.fc1.weight)
        nn.init.orthogonal_(self.fc2.weight)
        fan_in = self.fc1.in_features  # a size the input decides
        nn.init.normal_(self.fc1.bias, std=1 / math.sqrt(fan_in))
        self.register_buffer("table", torch.arange(fan_in * 2).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)) * self.scale) + self.table.sum()


def eager_twin() -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    eager = Net(lazy=False)
    return eager, torch.get_rng_state()


def assert_equal_state(a: nn.Module, b: nn.Module) -> None:
    mine, theirs = a.state_dict(), b.state_dict()
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(mine[key], value), key


@pytest.mark.parametrize(
    "factory",
    [
        functools.partial(Net, True),
        lambda: Net(lazy=True),
        type("LazyNet", (Net,), {"__init__": lambda self: Net.__init__(self, True)}),
    ],
    ids=["partial", "lambda", "class"],
)
def test_any_factory_gives_the_eager_model_and_leaves_the_stream_where_eager_does(
    factory: object,
) -> None:
    eager, after = eager_twin()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = lazynn.build(factory, X)  # type: ignore[call-overload]
    assert torch.equal(torch.get_rng_state(), after)
    assert_equal_state(model, eager)
    assert type(model.fc1) is nn.Linear
    assert not lazynn.is_lazy(model)
    assert torch.equal(model(X), eager(X))


class _TiedLM(nn.Module):
    """An output layer tied to the embedding, as GPT-2's ``lm_head`` to ``wte``."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.wte = nn.Embedding(11, 6)
        self.body = lazynn.LazyLinear(6) if lazy else nn.Linear(6, 6)
        self.lm_head = nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(self.wte(tokens)))


def test_an_assign_load_unties_a_tied_weight_as_torchs_does_and_tying_again_holds() -> None:
    """docs/porting.md, Checkpoints: ``assign=True`` puts each key's tensor in its place, so
    two modules that shared one parameter hold two after it, in lazynn as in torch."""
    tokens = lazynn.Spec((2, 3), torch.long)
    checkpoint = lazynn.build(functools.partial(_TiedLM, lazy=True), tokens).state_dict()
    model = lazynn.build(functools.partial(_TiedLM, lazy=True), tokens, device="meta")
    assert model.lm_head.weight is model.wte.weight
    model.load_state_dict(checkpoint, assign=True)
    with torch.device("meta"):
        eager = _TiedLM(lazy=False)
    eager.load_state_dict(checkpoint, assign=True)
    for loaded in (model, eager):
        assert loaded.lm_head.weight is not loaded.wte.weight  # untied: 4 parameters, not 3
        assert len(list(loaded.parameters())) == 4
    model.lm_head.weight = model.wte.weight  # the line docs/porting.md shows
    lazynn.materialize(model, "cpu")
    assert model.lm_head.weight is model.wte.weight
    assert len(list(model.parameters())) == 3
    assert torch.equal(model.wte.weight, checkpoint["wte.weight"])


def test_the_first_run_draws_nothing_even_where_init_code_draws_on_the_cpu() -> None:
    drawn: list[torch.Tensor] = []

    class Drawing(Net):
        def __init__(self) -> None:
            super().__init__(lazy=True)
            drawn.append(torch.randn(2, device="cpu"))  # an explicit device: drawn in both runs

    torch.manual_seed(0)
    lazynn.build(Drawing, X)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    Net(lazy=False)
    expected = torch.randn(2)
    # (runs on meta, the first and a check of its table's shape, draw on a private generator:
    # the generator never moved; the real run, second, draws where eager construction does)
    assert len(drawn) == 3
    assert torch.equal(drawn[1], expected)
    assert torch.equal(after, torch.get_rng_state())


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_on_meta_then_materialize_is_the_eager_model(dtype: torch.dtype | None) -> None:
    eager, after = eager_twin()
    if dtype is not None:
        eager = eager.to(dtype)
    torch.manual_seed(0)
    model = lazynn.build(functools.partial(Net, True), X, device="meta", dtype=dtype)
    assert all(t.is_meta for t in (*model.parameters(), *model.buffers()))
    lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    assert_equal_state(model, eager)
    assert model.fc1.weight.dtype == (dtype or torch.float32)


def test_copies_of_a_lazy_layer_made_by_the_model_are_eager_copies() -> None:
    def make(lazy: bool) -> nn.Module:
        layer = (
            lazynn.LazyTransformerEncoderLayer(2, dim_feedforward=16, dropout=0.0)
            if lazy
            else nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
        )
        return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)

    torch.manual_seed(0)
    eager = make(False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = lazynn.build(lambda: make(True), (2, 4, 8))
    assert torch.equal(torch.get_rng_state(), after)
    assert_equal_state(model, eager)


def test_rank_agnostic_and_lazy_made_layers_become_their_eager_classes() -> None:
    class Scale(nn.Module):
        def __init__(self, features: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(features))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    lazy_scale = lazynn.lazy(Scale, features=lazynn.Infer(dim=-1))

    def make(lazy: bool) -> nn.Module:
        conv = lazynn.Conv(4, 3) if lazy else nn.Conv2d(3, 4, 3)
        scale = lazy_scale() if lazy else Scale(4 * 6 * 6)
        return nn.Sequential(conv, nn.Flatten(), scale)

    torch.manual_seed(0)
    eager = make(False)
    torch.manual_seed(0)
    model = lazynn.build(lambda: make(True), (2, 3, 8, 8))
    assert type(model[0]) is nn.Conv2d
    assert type(model[2]) is Scale
    assert_equal_state(model, eager)


# --- what it refuses -------------------------------------------------------------------------


def test_a_factory_that_constructs_other_layers_the_second_time_is_refused() -> None:
    runs: list[int] = []

    def fickle() -> nn.Module:
        runs.append(1)
        width = 4 if len(runs) == 1 else 6
        return nn.Sequential(lazynn.LazyLinear(width), nn.ReLU(), lazynn.LazyLinear(2))

    rng = torch.get_rng_state()
    with pytest.raises(lazynn.LazynnError, match="lazy layer number 1") as caught:
        lazynn.build(fickle, X)
    text = str(caught.value)
    assert "LazyLinear(out_features=4, bias=True) at '0'" in text  # the first run's
    assert "LazyLinear(out_features=6" in text  # the second's
    assert "make the factory construct the same model" in text
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn


def test_a_factory_that_returns_no_module_is_refused() -> None:
    with pytest.raises(lazynn.LazynnError, match=r"returns an nn\.Module.*returned int"):
        lazynn.build(lambda: 3, X)


def test_a_forward_that_fails_on_the_examples_names_the_layer_and_draws_nothing() -> None:
    rng = torch.get_rng_state()
    with pytest.raises(lazynn.InferenceError, match="Linear"):
        lazynn.build(lambda: nn.Sequential(lazynn.LazyLinear(4), nn.Linear(3, 2)), X)
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_lazy_layer_the_forward_never_calls_is_refused() -> None:
    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = lazynn.LazyLinear(2), lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)  # type: ignore[no-any-return]

    with pytest.raises(lazynn.InferenceError, match="never called 'unused'"):
        lazynn.build(Skips, X)


def test_an_error_in_the_second_run_leaves_every_generator_as_it_was() -> None:
    runs: list[int] = []

    def fails_second() -> nn.Module:
        runs.append(1)
        model = nn.Sequential(lazynn.LazyLinear(4))
        if len(runs) == 2:
            raise RuntimeError("config file moved")
        return model

    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="config file moved"):
        lazynn.build(fails_second, X)
    assert torch.equal(torch.get_rng_state(), rng)


def test_torchs_own_lazy_layers_in_a_factory_are_built_and_said_not_exact() -> None:
    with pytest.warns(UserWarning, match=r"'1' is torch's own lazy layer"):
        model = lazynn.build(lambda: nn.Sequential(lazynn.LazyLinear(4), nn.LazyLinear(2)), X)
    assert type(model[1]) is nn.Linear
    assert model(X).shape == (4, 2)


# --- summary and the instance form ------------------------------------------------------------


def test_summary_of_a_factory_constructs_on_meta_only() -> None:
    rng = torch.get_rng_state()
    report = lazynn.summary(functools.partial(Net, True), X)
    assert torch.equal(torch.get_rng_state(), rng)
    eager = Net(lazy=False)
    assert report.total_parameters == sum(p.numel() for p in eager.parameters())


def test_the_instance_form_refuses_shape_needing_init_and_names_the_factory_form() -> None:
    with pytest.raises(lazynn.UnbuiltError, match=r"lazynn\.build\(Net, example\)"):
        Net(lazy=True)


def test_init_code_reading_a_lazy_norms_counter_reads_eagers_value() -> None:
    """A known buffer (a lazy BatchNorm's ``num_batches_tracked``, a real zero before the
    build) read in ``__init__``: the factory's draft reads eager's value, as a plain
    construction does (it was an unrecorded tensor the draft could not evaluate)."""

    class Net(nn.Module):
        def __init__(self, lazy: bool = True) -> None:
            super().__init__()
            self.bn = lazynn.LazyBatchNorm2d() if lazy else nn.BatchNorm2d(3)
            self.start = int(self.bn.num_batches_tracked.item())
            self.conv = lazynn.LazyConv2d(4, 3) if lazy else nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(self.bn(x))

    torch.manual_seed(0)
    eager = Net(lazy=False)
    torch.manual_seed(0)
    built = lazynn.build(Net, (2, 3, 8, 8))
    assert built.start == eager.start == 0
    for mine, theirs in zip(built.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


# --- nothing lazy: no forward needed (issue 37) ----------------------------------------------


class _NoMetaForward(nn.Module):
    """A model with nothing lazy whose forward cannot run on meta (torchtitan's default
    FlexAttention, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)
        nn.init.trunc_normal_(self.head.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:
            raise NotImplementedError("this attention kernel has no meta implementation")
        return self.head(self.fc(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize", "build(threads=2)"])
def test_a_model_with_nothing_lazy_builds_without_an_example(door: str) -> None:
    """No example, no forward: the factory's construction recorded and replayed, with the
    eager numbers and the generator's end (torchdistx's deferred_init, exact, for any model)."""
    torch.manual_seed(0)
    eager = _NoMetaForward()
    after = torch.rand(3)
    torch.manual_seed(0)
    if door == "meta+materialize":
        model = lazynn.build(_NoMetaForward, device="meta")
        assert all(p.is_meta for p in model.parameters())
        lazynn.materialize(model)
    else:
        model = lazynn.build(_NoMetaForward, threads=2 if "threads" in door else 1)
    assert torch.equal(torch.rand(3), after)
    for mine, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_a_forward_nothing_needed_that_fails_on_meta_says_so() -> None:
    with pytest.raises(lazynn.InferenceError) as info:
        lazynn.build(_NoMetaForward, (2, 3))
    assert "nothing in this model is lazy, so no forward is needed: lazynn.build(factory)" in str(
        info.value
    )


def test_a_model_with_lazy_layers_and_no_example_is_refused_naming_them() -> None:
    with pytest.raises(lazynn.InferenceError) as info:
        lazynn.build(lambda: nn.Sequential(nn.Linear(3, 4), lazynn.LazyLinear(2)))
    text = str(info.value)
    assert "expected example inputs for a model with lazy layers" in text
    assert "received none, for lazy layers '1'" in text
