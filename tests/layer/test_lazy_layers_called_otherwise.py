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

The call forms are the ``calls`` of those layers' rows (tests/registry.py), each with its
bad inputs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module
from registry import ROWS, Bad, CallForm, Inputs, Row, known_tensors, lazy_tensors, same_value

#: (row, call form) for every row's call forms that call the layer unlike the row
FORMS = [(r, c) for r in ROWS for c in r.calls if c.beyond]
#: (row, call form, bad input) for every bad first input of a row's call forms
BAD = [(r, c, b) for r in ROWS for c in r.calls for b in c.bad]


@pytest.fixture(params=FORMS, ids=[c.id for _, c in FORMS])
def case(request: pytest.FixtureRequest) -> tuple[Row, CallForm]:
    return request.param  # type: ignore[no-any-return]


def call_form(lazy: type[nn.Module], name: str) -> CallForm:
    """The call form ``name`` of the row of ``lazy``."""
    return next(c for r in ROWS if r.lazy is lazy for c in r.calls if c.id == name)


# --- helpers ----------------------------------------------------------------------------------


def inputs_of(form: CallForm, seed: int = 100, other: bool = False) -> Inputs:
    torch.manual_seed(seed)
    return (form.other_inputs if other else form.inputs)()


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
        self.lazy = set(lazy_tensors(module))
        #: the real buffers (a norm's num_batches_tracked), by value
        self.known = {name: t.clone() for name, t in known_tensors(module).items()}
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
        assert set(lazy_tensors(module)) == self.lazy
        for name, tensor in now.items():
            assert tensor is self.tensors[name], name
            if name in self.lazy:
                assert lazynn.is_lazy(tensor), f"{name} was materialized"
            else:  # a real buffer before the build: the same tensor, the same value
                assert same_value(tensor, self.known[name]), f"{name} was changed"
        assert dict(module._forward_pre_hooks) == self.hooks
        assert self.hooks, "the build hook is still attached"
        assert repr(module) == self.repr
        assert torch.equal(torch.get_rng_state(), self.rng), "the failed call consumed RNG"


# --- same numbers as eager --------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("seed", [0, 12345])
def test_first_call_equals_eager(case: tuple[Row, CallForm], train: bool, seed: int) -> None:
    row, form = case
    a, k = inputs_of(form)
    torch.manual_seed(seed)
    lazy = form.lazy().train(train)
    assert type(lazy) is row.lazy
    assert type(lazy).__name__ == f"Lazy{row.eager.__name__}"
    assert lazynn.is_lazy(lazy)
    y_lazy = lazy(*a, **k)
    torch.manual_seed(seed)
    eager = form.eager().train(train)
    y_eager = eager(*a, **k)
    assert type(lazy) is row.eager
    assert form.sizes(lazy) == form.sizes(eager)
    assert_same_output(y_lazy, y_eager)
    assert_same_module(lazy, eager)
    sum(t.sum() for t in tensors(y_lazy) if t.is_floating_point()).backward()
    sum(t.sum() for t in tensors(y_eager) if t.is_floating_point()).backward()
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.equal(p.grad, q.grad), name


def test_other_sizes_build_their_own_twin(case: tuple[Row, CallForm]) -> None:
    """The sizes come from the inputs: other inputs, other sizes, still the eager numbers."""
    _, form = case
    a, k = inputs_of(form, other=True)
    torch.manual_seed(3)
    lazy = form.lazy()
    y_lazy = lazy(*a, **k)
    torch.manual_seed(3)
    eager = form.other()
    assert_same_output(y_lazy, eager(*a, **k))
    assert_same_module(lazy, eager)
    assert form.sizes(lazy) == form.sizes(eager)
    assert form.sizes(eager) != form.sizes(form.eager())


# --- a bad first input ------------------------------------------------------------------------


#: how these eager classes refuse a bad input (multi-head attention checks ranks with
#: `assert`; a missing or non-tensor argument is a TypeError)
EAGER_ERRORS = (RuntimeError, ValueError, TypeError, AssertionError)


def assert_retry_equals_eager(form: CallForm, lazy: nn.Module, seed: int, good: Inputs) -> None:
    """The layer, left unbuilt by the refusal, builds from ``good`` as the eager twin under
    ``seed`` (set before the layer was made and the bad call: the refusal drew no random
    numbers)."""
    a, k = good
    y = lazy(*a, **k)
    torch.manual_seed(seed)
    eager = form.eager()
    assert_same_output(y, eager(*a, **k))
    assert_same_module(lazy, eager)


@pytest.mark.parametrize(("row", "form", "bad"), BAD, ids=[b.id for _, _, b in BAD])
def test_bad_first_input_is_refused_and_changes_nothing(row: Row, form: CallForm, bad: Bad) -> None:
    good = inputs_of(form)  # drawn before the seed below
    torch.manual_seed(7)
    bad_args, bad_kwargs = bad.inputs()
    if bad.eager_refuses:  # bad for torch too, not just for lazynn
        with pytest.raises(EAGER_ERRORS):
            form.eager()(*bad_args, **bad_kwargs)
    seed = 1234
    torch.manual_seed(seed)
    lazy = form.lazy()
    state = State(lazy)
    name = f"Lazy{row.eager.__name__}"
    for _ in range(2):  # twice: a refusal leaves nothing behind that changes the next one
        with pytest.raises(lazynn.InferenceError, match=rf"^{name}\b.*{bad.pattern}") as info:
            lazy(*bad_args, **bad_kwargs)
        assert "Fix:" in str(info.value)
        state.assert_unchanged()
    assert_retry_equals_eager(form, lazy, seed, good)


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
    form = call_form(lazynn.LazyAdaptiveLogSoftmaxWithLoss, "adaptive")
    good = inputs_of(form)
    x, target = torch.randn(7, 8), torch.full((7,), 12)
    seed = 99
    torch.manual_seed(seed)
    lazy = form.lazy()
    state = State(lazy)
    with pytest.raises(RuntimeError, match=r"Target values should be in \[0, 9\]"):
        lazy(x, target)
    state.assert_unchanged()
    assert_retry_equals_eager(form, lazy, seed, good)
