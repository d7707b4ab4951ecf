"""Lazy layers made with ``lazynn.lazy()``, called in ways the registry's rows do not.

tests/registry.py runs every registry-driven guarantee (equivalence, moves, copies,
checkpoints, threads, bad ranks and dtypes...) over ``LazyLSTMCell``, ``LazyBilinear``,
``LazyTransformerDecoderLayer`` and ``LazyAdaptiveLogSoftmaxWithLoss``, each called with
positional inputs derived from one tensor. Here, the other call forms:

* ``LazyLSTMCell(hidden_size)`` with an explicit ``(h, c)`` state;
* ``LazyBilinear(out_features)`` with its inputs by keyword;
* ``LazyTransformerDecoderLayer(nhead)`` with its inputs by keyword, masks and
  ``tgt_is_causal``;

each against its eager twin (outputs, gradients, state_dict, attributes; other sizes too);
and the bad inputs of their other arguments (a second input or a state of another size,
missing or not a tensor, batches that differ, a target out of range): a
``lazynn.InferenceError`` naming the layer, what it expected and received, with a fix, and
the layer left exactly as it was (class, placeholders, build hook, RNG), after which a good
input builds it as the eager twin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    id: str
    lazy: Callable[[], nn.Module]
    #: the eager twin of ``lazy`` built on ``inputs``
    eager: Callable[[], nn.Module]
    inputs: Callable[[], Inputs]
    #: the inferred sizes, read from a built module
    sizes: Callable[[nn.Module], tuple[int, ...]]
    #: an eager twin with other inferred sizes, and inputs for it
    other: Callable[[], nn.Module]
    other_inputs: Callable[[], Inputs]
    #: the eager class
    cls: type[nn.Module] = field(default=nn.Module)
    #: how the case calls the layer unlike the registry's row; empty: as the row does (the
    #: case only gives the good inputs and eager twin of the bad inputs below)
    beyond: str = ""


def args(*a: Any, **k: Any) -> Callable[[], Inputs]:
    """Inputs made from factories, each called when the inputs are needed."""

    def make() -> Inputs:
        return tuple(f() for f in a), {key: f() for key, f in k.items()}

    return make


def randn(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(shape)


def targets(n_classes: int, *shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, n_classes, shape)


def causal(n: int) -> Callable[[], torch.Tensor]:
    return lambda: nn.Transformer.generate_square_subsequent_mask(n)


def padding(batch: int, length: int) -> Callable[[], torch.Tensor]:
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return lambda: mask.clone()


def _lstm_sizes(m: nn.Module) -> tuple[int, ...]:
    return (m.input_size,)


def _bilinear_sizes(m: nn.Module) -> tuple[int, ...]:
    return (m.in1_features, m.in2_features)


def _decoder_sizes(m: nn.Module) -> tuple[int, ...]:
    # nn.TransformerDecoderLayer keeps no d_model attribute: read it where it lands
    return (m.linear1.in_features, m.self_attn.embed_dim, m.multihead_attn.embed_dim)


def _adaptive_sizes(m: nn.Module) -> tuple[int, ...]:
    return (m.in_features,)


LSTM, BIL = nn.LSTMCell, nn.Bilinear
DEC, ASM = nn.TransformerDecoderLayer, nn.AdaptiveLogSoftmaxWithLoss
CASES = [
    Case("lstm-cell-state-no-bias", lambda: lazynn.LazyLSTMCell(3, bias=False),
         lambda: LSTM(5, 3, bias=False),
         lambda: ((torch.randn(4, 5), (torch.randn(4, 3), torch.randn(4, 3))), {}),
         _lstm_sizes, lambda: LSTM(2, 3, bias=False), args(randn(4, 2)), LSTM,
         beyond="an explicit (h, c) state"),
    Case("bilinear", lambda: lazynn.LazyBilinear(3), lambda: BIL(5, 4, 3),
         args(randn(6, 5), randn(6, 4)), _bilinear_sizes,
         lambda: BIL(2, 7, 3), args(randn(6, 2), randn(6, 7)), BIL),
    Case("bilinear-keywords", lambda: lazynn.LazyBilinear(3), lambda: BIL(5, 4, 3),
         args(input1=randn(6, 5), input2=randn(6, 4)), _bilinear_sizes,
         lambda: BIL(4, 5, 3), args(input1=randn(6, 4), input2=randn(6, 5)), BIL,
         beyond="inputs by keyword"),
    Case("decoder",
         lambda: lazynn.LazyTransformerDecoderLayer(2, 8, 0.0, batch_first=True),
         lambda: DEC(4, 2, 8, 0.0, batch_first=True),
         args(randn(3, 5, 4), randn(3, 6, 4)), _decoder_sizes,
         lambda: DEC(6, 2, 8, 0.0, batch_first=True), args(randn(3, 5, 6), randn(3, 6, 6)),
         DEC),
    Case("decoder-keywords-masks",
         lambda: lazynn.LazyTransformerDecoderLayer(2, 8, 0.0, batch_first=True),
         lambda: DEC(4, 2, 8, 0.0, batch_first=True),
         args(tgt=randn(3, 5, 4), memory=randn(3, 6, 4), tgt_mask=causal(5),
              memory_key_padding_mask=padding(3, 6), tgt_is_causal=lambda: True),
         _decoder_sizes,
         lambda: DEC(8, 2, 8, 0.0, batch_first=True),
         args(tgt=randn(3, 5, 8), memory=randn(3, 6, 8)), DEC,
         beyond="inputs by keyword, masks and tgt_is_causal"),
    Case("adaptive",
         lambda: lazynn.LazyAdaptiveLogSoftmaxWithLoss(10, [3, 6], div_value=2.0),
         lambda: ASM(8, 10, [3, 6], div_value=2.0),
         args(randn(7, 8), targets(10, 7)), _adaptive_sizes,
         lambda: ASM(12, 10, [3, 6], div_value=2.0), args(randn(7, 12), targets(10, 7)), ASM),
]  # fmt: skip
BY_ID = {c.id: c for c in CASES}


@pytest.fixture(params=[c for c in CASES if c.beyond], ids=lambda c: c.id)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


# --- helpers ----------------------------------------------------------------------------------


def inputs_of(case: Case, seed: int = 100, other: bool = False) -> Inputs:
    torch.manual_seed(seed)
    return (case.other_inputs if other else case.inputs)()


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of an output, in order (tuples, named tuples, nested)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in tensors(v)]


def assert_same_output(ours: Any, theirs: Any) -> None:
    """Same structure (tuple, named tuple type), tensors equal bit for bit."""
    assert type(ours) is type(theirs)
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype
        assert ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
        return
    if hasattr(theirs, "_fields"):
        assert ours._fields == theirs._fields
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same_output(a, b)


def placeholders(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


class State:
    """Everything a refused first call must leave as it was."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.cls = type(module)
        self.vars = dict(vars(module))
        self.tensors = placeholders(module)
        self.hooks = dict(module._forward_pre_hooks)
        self.repr = repr(module)
        self.rng = torch.get_rng_state()

    def assert_unchanged(self) -> None:
        module = self.module
        assert type(module) is self.cls
        assert lazynn.is_lazy(module)
        assert vars(module).keys() == self.vars.keys()
        for key, value in self.vars.items():
            assert vars(module)[key] is value, key
        now = placeholders(module)
        assert now.keys() == self.tensors.keys()
        for name, tensor in now.items():
            assert tensor is self.tensors[name], name
            assert lazynn.is_lazy(tensor), f"{name} was materialized"
        assert dict(module._forward_pre_hooks) == self.hooks
        assert self.hooks, "the build hook is still attached"
        assert repr(module) == self.repr
        assert torch.equal(torch.get_rng_state(), self.rng), "the failed call consumed RNG"


# --- same numbers as eager --------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("seed", [0, 12345])
def test_first_call_equals_eager(case: Case, train: bool, seed: int) -> None:
    a, k = inputs_of(case)
    torch.manual_seed(seed)
    lazy = case.lazy().train(train)
    assert type(lazy).__name__ == f"Lazy{case.cls.__name__}"
    assert lazynn.is_lazy(lazy)
    y_lazy = lazy(*a, **k)
    torch.manual_seed(seed)
    eager = case.eager().train(train)
    y_eager = eager(*a, **k)
    assert type(lazy) is case.cls
    assert case.sizes(lazy) == case.sizes(eager)
    assert_same_output(y_lazy, y_eager)
    assert_same_module(lazy, eager)
    sum(t.sum() for t in tensors(y_lazy) if t.is_floating_point()).backward()
    sum(t.sum() for t in tensors(y_eager) if t.is_floating_point()).backward()
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad), name


def test_other_sizes_build_their_own_twin(case: Case) -> None:
    """The sizes come from the inputs: other inputs, other sizes, still the eager numbers."""
    a, k = inputs_of(case, other=True)
    torch.manual_seed(3)
    lazy = case.lazy()
    y_lazy = lazy(*a, **k)
    torch.manual_seed(3)
    eager = case.other()
    assert_same_output(y_lazy, eager(*a, **k))
    assert_same_module(lazy, eager)
    assert case.sizes(lazy) == case.sizes(eager)
    assert case.sizes(eager) != case.sizes(case.eager())


# --- a bad first input ------------------------------------------------------------------------


def shape_text(*shape: int) -> str:
    return re.escape(str(tuple(shape)))


@dataclass(frozen=True)
class Bad:
    id: str
    case: str
    inputs: Callable[[], Inputs]
    #: what the message says after the layer's name
    pattern: str
    #: the eager twin refuses the input too (False: no eager twin can be made from it)
    eager_refuses: bool = True


BAD = [
    Bad("lstm-cell-state-of-another-size", "lstm-cell-state-no-bias",
        lambda: ((torch.randn(4, 5), (torch.randn(4, 2), torch.randn(4, 2))), {}),
        rf"expected .*received .*{shape_text(4, 2)}.*hidden_size"),
    Bad("bilinear-second-not-a-tensor", "bilinear", args(randn(6, 5), lambda: [1.0, 2.0]),
        r"expected .*\bin2_features\b.*received list"),
    Bad("bilinear-second-missing", "bilinear", args(randn(6, 5)),
        r"expected .*\bin2_features\b.*received None"),
    Bad("bilinear-batches-differ", "bilinear", args(randn(6, 5), randn(7, 4)),
        rf"expected .*received .*{shape_text(6, 5)}.*{shape_text(7, 4)}"),
    Bad("decoder-memory-of-another-size", "decoder", args(randn(3, 5, 4), randn(3, 6, 6)),
        rf"expected .*received .*{shape_text(3, 6, 6)}"),
    Bad("decoder-memory-missing", "decoder", args(randn(3, 5, 4)),
        rf"expected .*received .*{shape_text(3, 5, 4)}.*memory"),
    Bad("decoder-d_model-not-divisible", "decoder", args(randn(3, 5, 5), randn(3, 6, 5)),
        rf"expected .*received .*{shape_text(3, 5, 5)}.*d_model=5.*divisible by num_heads",
        eager_refuses=False),
    Bad("adaptive-batches-differ", "adaptive", args(randn(7, 8), targets(10, 6)),
        rf"expected .*received .*{shape_text(7, 8)}.*{shape_text(6)}.*batch dimension"),
]  # fmt: skip

#: how these eager classes refuse a bad input (multi-head attention checks ranks with
#: `assert`; a missing or non-tensor argument is a TypeError)
EAGER_ERRORS = (RuntimeError, ValueError, TypeError, AssertionError)


def assert_retry_equals_eager(case: Case, lazy: nn.Module, seed: int, good: Inputs) -> None:
    """The layer, left unbuilt by the refusal, builds from ``good`` as the eager twin under
    ``seed`` (set before the layer was made and the bad call: the refusal drew no random
    numbers)."""
    a, k = good
    y = lazy(*a, **k)
    torch.manual_seed(seed)
    eager = case.eager()
    assert_same_output(y, eager(*a, **k))
    assert_same_module(lazy, eager)


@pytest.mark.parametrize("bad", BAD, ids=lambda b: b.id)
def test_bad_first_input_is_refused_and_changes_nothing(bad: Bad) -> None:
    case = BY_ID[bad.case]
    good = inputs_of(case)  # drawn before the seed below
    torch.manual_seed(7)
    bad_args, bad_kwargs = bad.inputs()
    if bad.eager_refuses:  # bad for torch too, not just for lazynn
        with pytest.raises(EAGER_ERRORS):
            case.eager()(*bad_args, **bad_kwargs)
    seed = 1234
    torch.manual_seed(seed)
    lazy = case.lazy()
    state = State(lazy)
    name = f"Lazy{case.cls.__name__}"
    for _ in range(2):  # twice: a refusal leaves nothing behind that changes the next one
        with pytest.raises(lazynn.InferenceError, match=rf"^{name}\b.*{bad.pattern}") as info:
            lazy(*bad_args, **bad_kwargs)
        assert "Fix:" in str(info.value)
        state.assert_unchanged()
    assert_retry_equals_eager(case, lazy, seed, good)


def test_d_model_not_divisible_has_no_eager_twin_either() -> None:
    with pytest.raises(AssertionError, match="divisible by num_heads"):
        nn.TransformerDecoderLayer(5, 2, 8, 0.0, batch_first=True)


def test_refusal_names_the_path_in_a_model() -> None:
    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                [lazynn.LazyTransformerDecoderLayer(2, 8, 0.0, batch_first=True)]
            )

        def forward(self, tgt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
            return self.blocks[0](tgt, memory)  # type: ignore[no-any-return]

    model = Seq2Seq()
    with pytest.raises(
        lazynn.InferenceError, match=r"^LazyTransformerDecoderLayer at 'blocks\.0': expected"
    ):
        model(torch.randn(3, 5, 4), torch.randn(3, 6, 6))
    assert lazynn.is_lazy(model)


def test_failure_only_the_real_forward_sees_is_rolled_back() -> None:
    """A target out of range is data: the check on meta cannot see it, the real forward
    does. The build is undone, RNG included, and a good call then builds as eager."""
    case = BY_ID["adaptive"]
    good = inputs_of(case)
    x, target = torch.randn(7, 8), torch.full((7,), 12)
    seed = 99
    torch.manual_seed(seed)
    lazy = case.lazy()
    state = State(lazy)
    with pytest.raises(RuntimeError, match=r"Target values should be in \[0, 9\]"):
        lazy(x, target)
    state.assert_unchanged()
    assert_retry_equals_eager(case, lazy, seed, good)
