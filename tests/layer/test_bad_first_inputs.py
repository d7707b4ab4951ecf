"""A bad first input: a clear InferenceError, and a layer left exactly as it was.

Spec (item 6 of the issue): a first input of the wrong rank, with channels not divisible by
``groups``, smaller than the kernel, or of the wrong dtype raises ``lazynn.InferenceError``
naming the layer (and its path in a nested model), what it expected and what it received. The
module stays fully unbuilt: same placeholders, same class, pre-hook still attached, no
running statistic touched, RNG state untouched. A retry with a good input then builds a layer
equal to its eager twin under the same seed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from registry import ROWS, TENSOR_ROWS, Row, known_tensors, lazy_tensors, same_value

CONV_ROWS = [r for r in ROWS if "groups" in inspect.signature(r.lazy.__init__).parameters]
PLAIN_CONV_ROWS = [r for r in CONV_ROWS if "Transpose" not in r.lazy.__name__]


#: how torch.nn layers refuse a bad input
EAGER_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, NotImplementedError)
#: ...and the classes that refuse some inputs otherwise: multi_head_attention_forward checks
#: the query's rank with `assert`; an input of no dimension or too few is an IndexError for
#: some; nn.Dropout2d/3d warn that other ranks are deprecated and will be an error (the
#: project's -W error makes the warning one)
EAGER_ERRORS_EXTRA: dict[type[nn.Module], tuple[type[Exception], ...]] = {
    nn.TransformerEncoderLayer: (AssertionError,),
    nn.TransformerDecoderLayer: (AssertionError,),
    nn.MultiheadAttention: (AssertionError,),
    nn.Transformer: (AssertionError, IndexError),
    nn.Bilinear: (IndexError,),
    nn.AvgPool2d: (IndexError,),
    nn.Dropout2d: (UserWarning,),
    nn.Dropout3d: (UserWarning,),
}


def shape_text(x: torch.Tensor) -> str:
    """How a message writes a shape: ``(2, 3)``, ``(5,)``, ``()`` (as a Python tuple)."""
    return re.escape(str(tuple(x.shape)))


def wrong_rank_inputs(row: Row) -> list[torch.Tensor]:
    """Inputs of a rank the layer (and its eager class) refuses."""
    if row.lazy is lazynn.LazyLinear:
        return [torch.tensor(1.0)]  # nn.Linear takes any rank >= 1
    if row.wrong_ranks:
        return [torch.randn((4,) * rank) for rank in row.wrong_ranks]
    x = row.example()
    return [x.unsqueeze(0), x.flatten()]


class State:
    """Everything a failed first call must leave as it was."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.cls = type(module)
        self.vars = dict(vars(module))
        self.tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        self.lazy = set(lazy_tensors(module))
        #: the real buffers (num_batches_tracked), by value
        self.known = {name: t.clone() for name, t in known_tensors(module).items()}
        assert self.lazy | set(self.known) == set(self.tensors)
        self.hooks = dict(module._forward_pre_hooks)
        self.repr = repr(module)
        self.rng = torch.get_rng_state()

    def assert_unchanged(self, rng: bool = True) -> None:
        module = self.module
        assert type(module) is self.cls
        assert isinstance(module, lazynn.LazyModuleMixin)
        assert vars(module).keys() == self.vars.keys()
        for key, value in self.vars.items():
            assert vars(module)[key] is value, key
        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        assert tensors.keys() == self.tensors.keys()
        assert set(lazy_tensors(module)) == self.lazy
        for name, tensor in tensors.items():
            assert tensor is self.tensors[name], name
            if name in self.lazy:
                assert torch.nn.parameter.is_lazy(tensor), f"{name} was materialized"
            else:  # a real buffer before the build: the same tensor, the same value
                assert not torch.nn.parameter.is_lazy(tensor), name
                assert same_value(tensor, self.known[name]), f"{name} was changed"
        assert dict(module._forward_pre_hooks) == self.hooks
        assert self.hooks, "the build hook is still attached"
        assert repr(module) == self.repr
        if rng:
            assert torch.equal(torch.get_rng_state(), self.rng), "the failed call consumed RNG"


def assert_retry_equals_eager(
    row: Row, options: dict[str, Any], lazy: nn.Module, x: torch.Tensor, seed: int
) -> None:
    """The layer, unbuilt after the failure, builds from ``x`` as its eager twin under ``seed``.

    ``seed`` was set before ``lazy`` was constructed and the bad call made: the failure
    consumed no random numbers, so the build draws the same ones as the eager twin.
    """
    y = row.call(lazy, x)
    torch.manual_seed(seed)
    eager = row.new_eager(options, row.simple_size)
    assert type(lazy) is row.eager
    assert repr(lazy) == repr(eager)
    assert torch.equal(y, row.call(eager, x))
    for (name, a), (_, b) in zip(
        lazy.state_dict().items(), eager.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def check_bad_call(
    row: Row,
    options: dict[str, Any],
    bad: torch.Tensor,
    pattern: str,
    eager_refuses: bool = True,
) -> None:
    """``bad`` raises InferenceError matching ``pattern``, changes nothing; a retry works."""
    if eager_refuses:  # the input is bad for torch too, not just for lazynn
        eager = row.new_eager(options, row.simple_size)
        with pytest.raises(EAGER_ERRORS + EAGER_ERRORS_EXTRA.get(row.eager, ())):
            row.call(eager, bad)
    good = row.input(options, row.simple_size)
    seed = 1234
    torch.manual_seed(seed)
    lazy = row.lazy(**options)
    state = State(lazy)
    with pytest.raises(lazynn.InferenceError, match=pattern) as info:
        row.call(lazy, bad)
    assert "Fix:" in str(info.value)
    state.assert_unchanged()
    # twice: a failed call leaves nothing behind that changes the next failure
    with pytest.raises(lazynn.InferenceError, match=pattern):
        row.call(lazy, bad)
    state.assert_unchanged()
    assert_retry_equals_eager(row, options, lazy, good, seed)


# --- the four kinds of bad input --------------------------------------------------------------


def test_wrong_rank(row: Row) -> None:
    name = row.lazy.__name__
    for bad in wrong_rank_inputs(row):
        pattern = rf"^{name}\b.*expected .*\b{row.inferred}\b.*received shape {shape_text(bad)}"
        if row.wrong_ranks:  # refused by the eager forward on meta, or by the rank rule
            pattern = rf"^{name}\b.*expected .*received .*{shape_text(bad)}"
        check_bad_call(row, row.simple, bad, pattern)


@pytest.mark.parametrize("row", CONV_ROWS, ids=lambda r: r.id)
def test_channels_not_divisible_by_groups(row: Row) -> None:
    options = {**row.simple, "out_channels": 4, "groups": 2}
    bad = row.input(options, 3)
    pattern = (
        rf"^{row.lazy.__name__}\b.*expected .*received .*{shape_text(bad)}.*in_channels=3.*"
        r"divisible by groups"
    )
    check_bad_call(row, options, bad, pattern, eager_refuses=False)  # no eager twin exists
    with pytest.raises(ValueError, match="divisible by groups"):
        row.eager(in_channels=3, **options)


@pytest.mark.parametrize("row", PLAIN_CONV_ROWS, ids=lambda r: r.id)
def test_kernel_larger_than_input(row: Row) -> None:
    good = row.example()
    bad = good[(slice(None), slice(None), *[slice(0, 2)] * (good.dim() - 2))]
    assert row.simple["kernel_size"] == 3
    assert bad.shape[2:] == (2,) * (good.dim() - 2)
    pattern = rf"^{row.lazy.__name__}\b.*expected .*received .*{shape_text(bad)}.*[Kk]ernel size"
    check_bad_call(row, row.simple, bad, pattern)


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64], ids=str)
def test_wrong_dtype(row: Row, dtype: torch.dtype) -> None:
    """(A layer without tensors has no dtype of its own: the pools and ChannelDropout.)"""
    if getattr(row.lazy, "any_float_input", False) and dtype.is_floating_point:
        pytest.skip(f"{row.eager.__name__} computes any floating input (it warns), as lazynn does")
    bad = row.example().to(dtype)
    name = row.lazy.__name__
    pattern = rf"^{name}\b.*expected .*torch\.float32.*received .*{re.escape(str(dtype))}"
    check_bad_call(row, row.simple, bad, pattern)


def test_float64_layer_refuses_float32_input() -> None:
    torch.manual_seed(0)
    lazy = lazynn.LazyLinear(3, dtype=torch.float64)
    state = State(lazy)
    with pytest.raises(
        lazynn.InferenceError, match=r"^LazyLinear\b.*expected .*float64.*received .*float32"
    ):
        lazy(torch.ones(2, 4))
    state.assert_unchanged()
    assert lazy(torch.ones(2, 4, dtype=torch.float64)).dtype == torch.float64


def test_non_tensor_input() -> None:
    lazy = lazynn.LazyConv2d(4, 3)
    state = State(lazy)
    with pytest.raises(lazynn.InferenceError, match=r"^LazyConv2d\b.*expected .*received list"):
        lazy([1.0, 2.0])
    state.assert_unchanged()


def test_running_statistics_untouched_in_train_mode() -> None:
    """A norm layer in train mode whose bad input fails keeps every buffer as it was: the
    running statistics placeholders, the counter 0."""
    torch.manual_seed(7)
    bad, x = torch.randn(3, 4, 5), torch.randn(3, 4, 5, 5)
    norm = lazynn.LazyBatchNorm2d(momentum=0.5).train()
    state = State(norm)
    assert state.lazy == {"weight", "bias", "running_mean", "running_var"}
    assert set(state.known) == {"num_batches_tracked"}
    with pytest.raises(lazynn.InferenceError):
        norm(bad)  # 3-d: BatchNorm2d wants (N, C, H, W)
    state.assert_unchanged()
    assert int(norm.num_batches_tracked) == 0
    norm(x)
    eager = nn.BatchNorm2d(4, momentum=0.5).train()
    eager(x)
    assert int(norm.num_batches_tracked) == 1
    assert torch.equal(norm.running_mean, eager.running_mean)
    assert torch.equal(norm.running_var, eager.running_var)


# --- the module path in nested models ---------------------------------------------------------


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = lazynn.LazyConv2d(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = lazynn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).flatten(1))


def sequential_net() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(lazynn.LazyConv2d(8, 3)), nn.ReLU(), nn.Flatten(), lazynn.LazyLinear(2)
    )


NESTED: list[tuple[str, Callable[[], nn.Module], str, str]] = [
    ("sequential", sequential_net, "0.0", "3"),
    ("attributes", Net, "encoder.conv", "head"),
]


@pytest.mark.parametrize(
    ("make", "conv_path", "head_path"), [n[1:] for n in NESTED], ids=[n[0] for n in NESTED]
)
@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (torch.randn(2, 3), r"received shape \(2, 3\)"),
        (torch.randn(2, 3, 8, 8, dtype=torch.float64), r"received a torch\.float64"),
        (torch.randn(2, 3, 2, 2), r"[Kk]ernel size"),
    ],
    ids=["rank", "dtype", "kernel"],
)
def test_message_names_the_module_path(
    make: Callable[[], nn.Module], conv_path: str, head_path: str, bad: torch.Tensor, what: str
) -> None:
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(3)
    model = make()
    conv = model.get_submodule(conv_path)
    state = State(conv)
    with pytest.raises(
        lazynn.InferenceError, match=rf"^LazyConv2d at '{re.escape(conv_path)}'.*{what}"
    ):
        model(bad)
    state.assert_unchanged()
    assert lazynn.is_lazy(model.get_submodule(head_path))
    y = model(x)
    torch.manual_seed(3)
    conv_twin, head_twin = nn.Conv2d(3, 8, 3), nn.Linear(8 * 6 * 6, 2)
    assert type(conv) is nn.Conv2d
    assert type(model.get_submodule(head_path)) is nn.Linear
    assert torch.equal(y, head_twin(torch.relu(conv_twin(x)).flatten(1)))


def test_path_names_a_later_layer() -> None:
    """The layer that fails is named even when an earlier lazy layer built fine."""
    model = nn.Sequential(
        lazynn.LazyLinear(3), nn.Sequential(nn.Identity(), lazynn.LazyBatchNorm2d())
    )
    norm = model[1][1]
    state = State(norm)
    with pytest.raises(
        lazynn.InferenceError,
        match=r"^LazyBatchNorm2d at '1\.1'.*expected .*received shape \(2, 3\)",
    ):
        model(torch.ones(2, 5))
    state.assert_unchanged(rng=False)  # model[0] built, drawing its weights
    assert type(model[0]) is nn.Linear


def test_path_for_every_layer(row: Row) -> None:
    """Registry-driven: a wrong-rank input names the layer's attribute path."""

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.ModuleDict({"layer": row.lazy(**row.simple)})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return row.call(self.block["layer"], x)

    model = Holder()
    bad = wrong_rank_inputs(row)[0]
    name = row.lazy.__name__
    with pytest.raises(lazynn.InferenceError, match=rf"^{name} at 'block\.layer':"):
        model(bad)
    assert lazynn.is_lazy(model)
