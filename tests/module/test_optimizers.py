"""An optimizer built before the first call trains the lazy model as it trains the eager one.

Spec (item 1 of the issue): the first call fills the placeholders in place, so the objects an
optimizer took at construction are the model's parameters after the build. For every
``torch.optim`` optimizer (enumerated at runtime), built on a lazy model *before* its first
call, a few training steps give exactly the parameters (and optimizer state) that the same
optimizer gives on the eager twin under the same seed. An optimizer that needs shapes at
construction (Adagrad allocates its state there; Muon checks ``ndim``) must instead raise
``lazynn.UnbuiltError`` saying to build first, leave the model unbuilt, and work once the
model is built.

Every comparison is ``torch.equal``: on CPU each optimizer's update is deterministic (no
atomics, no random numbers), so lazy and eager runs must agree bit for bit.
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
from registry import PARAMETER_ROWS, Row

OPTIMIZERS: list[type[torch.optim.Optimizer]] = sorted(
    (
        obj
        for obj in vars(torch.optim).values()
        if inspect.isclass(obj)
        and issubclass(obj, torch.optim.Optimizer)
        and obj is not torch.optim.Optimizer
    ),
    key=lambda c: c.__name__,
)

#: Optimizers that read shapes in __init__ and so refuse placeholders (UnbuiltError).
NEEDS_SHAPES = {"Adagrad", "Muon"}
#: Only 2-D parameters (Muon, torch >= 2.9): its model is LazyLinear(bias=False) layers.
MATRIX_ONLY = {"Muon"}
#: Sparse gradients only: no lazynn layer makes them; see test_sparse_adam_refuses_dense_grads.
SPARSE_ONLY = {"SparseAdam"}


def configurations() -> list[Any]:
    """(optimizer, keyword arguments): defaults for each, plus foreach/fused and common flags."""
    extra: dict[str, list[dict[str, Any]]] = {
        "SGD": [{"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}],
        "Adam": [{"amsgrad": True, "weight_decay": 0.01}],
        "RMSprop": [{"momentum": 0.5, "centered": True}],
        "LBFGS": [{"line_search_fn": "strong_wolfe", "history_size": 3}],
    }
    params = []
    for cls in OPTIMIZERS:
        if cls.__name__ in SPARSE_ONLY:
            continue
        signature = inspect.signature(cls.__init__).parameters
        variants: list[dict[str, Any]] = [{}]
        variants += [{"foreach": True}] if "foreach" in signature else []
        variants += [{"fused": True}] if "fused" in signature else []
        variants += extra.get(cls.__name__, [])
        for kwargs in variants:
            label = cls.__name__ + "".join(f"-{k}={v}" for k, v in kwargs.items())
            params.append(pytest.param(cls, kwargs, id=label))
    return params


def lazy_model(bias: bool = True) -> nn.Module:
    return nn.Sequential(
        lazynn.LazyLinear(5, bias=bias), nn.Tanh(), lazynn.LazyLinear(2, bias=bias)
    )


def eager_model(bias: bool = True) -> nn.Module:
    """The eager twin of ``lazy_model`` on a (batch, 3) input."""
    return nn.Sequential(nn.Linear(3, 5, bias=bias), nn.Tanh(), nn.Linear(5, 2, bias=bias))


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    target: torch.Tensor,
    steps: int = 3,
) -> None:
    """A few steps of regression; the first forward is the lazy model's first call."""
    for _ in range(steps):
        if isinstance(optimizer, torch.optim.LBFGS):

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = (model(x) - target).square().mean()
                loss.backward()
                return loss

            optimizer.step(closure)
        else:
            optimizer.zero_grad()
            (model(x) - target).square().mean().backward()
            optimizer.step()


def assert_same_parameters(lazy: nn.Module, eager: nn.Module) -> None:
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert type(p) is nn.Parameter, name
        assert p.shape == q.shape, name
        assert torch.equal(p, q), name


def same(a: Any, b: Any) -> bool:
    """Equal values: tensors bit for bit, containers (LBFGS history lists) element-wise."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def assert_same_state(lazy: torch.optim.Optimizer, eager: torch.optim.Optimizer) -> None:
    """Optimizer state (moments, step counts, histories...) agrees entry by entry."""
    ls, es = lazy.state_dict()["state"], eager.state_dict()["state"]
    assert ls.keys() == es.keys()
    for index, entries in es.items():
        assert ls[index].keys() == entries.keys(), index
        for key, value in entries.items():
            assert same(ls[index][key], value), (index, key)


def assert_build_first(error: BaseException) -> None:
    text = str(error)
    assert isinstance(error, lazynn.UnbuiltError), f"{type(error).__name__}: {text}"
    assert re.search(r"the '(weight|bias)' of LazyLinear", text), text
    assert re.search(r"Fix: build the module first", text), text
    assert re.search(r"\bcall\b.*\binput\b", text.split("Fix:", 1)[1]), text


def test_enumeration_finds_the_optimizers() -> None:
    names = {c.__name__ for c in OPTIMIZERS}
    assert {"SGD", "Adam", "AdamW", "Adagrad", "LBFGS", "RMSprop", "SparseAdam"} <= names


@pytest.mark.parametrize(("cls", "kwargs"), configurations())
def test_optimizer_built_before_first_call(
    cls: type[torch.optim.Optimizer], kwargs: dict[str, Any]
) -> None:
    bias = cls.__name__ not in MATRIX_ONLY
    x, target = torch.randn(8, 3), torch.randn(8, 2)
    torch.manual_seed(0)
    lazy = lazy_model(bias)
    placeholders = list(lazy.parameters())
    try:
        optimizer = cls(lazy.parameters(), **kwargs)
    except Exception as error:
        # Allowed only as a clear error naming the fix, leaving the model as it was.
        assert_build_first(error)
        assert cls.__name__ in NEEDS_SHAPES, f"{cls.__name__} newly refuses placeholders"
        assert all(torch.nn.parameter.is_lazy(p) for p in placeholders)
        assert all(a is b for a, b in zip(lazy.parameters(), placeholders, strict=True))
        lazy(x)  # the fix: build first, then create the optimizer
        optimizer = cls(lazy.parameters(), **kwargs)
    train(lazy, optimizer, x, target)

    torch.manual_seed(0)
    untrained = eager_model(bias)
    torch.manual_seed(0)
    eager = eager_model(bias)
    eager_optimizer = cls(eager.parameters(), **kwargs)
    train(eager, eager_optimizer, x, target)

    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(a is b for a, b in zip(held, lazy.parameters(), strict=True))
    assert all(a is b for a, b in zip(placeholders, lazy.parameters(), strict=True))
    assert_same_parameters(lazy, eager)
    assert not all(
        torch.equal(p, q) for p, q in zip(lazy.parameters(), untrained.parameters(), strict=True)
    ), "the optimizer did not move the parameters"
    assert_same_state(optimizer, eager_optimizer)
    assert all(type(m) is type(e) for m, e in zip(lazy, eager, strict=True))


def test_adagrad_asks_to_build_first() -> None:
    """Adagrad allocates its state in __init__: a clear error, the model left unbuilt."""
    model = lazy_model()
    with pytest.raises(lazynn.UnbuiltError, match=r"Fix: build the module first") as info:
        torch.optim.Adagrad(model.parameters())
    assert_build_first(info.value)
    assert lazynn.is_lazy(model)
    model(torch.randn(2, 3))
    torch.optim.Adagrad(model.parameters())  # after the build, fine


def test_sparse_adam_refuses_dense_grads() -> None:
    """SparseAdam takes placeholders, then refuses the dense gradients of Linear, as for eager.

    No lazynn layer makes sparse gradients (there is no lazy nn.Embedding), so SparseAdam
    cannot train one: the check is that the lazy model fails exactly as the eager one does.
    """
    x, target = torch.randn(8, 3), torch.randn(8, 2)
    errors = []
    for model in (lazy_model(), eager_model()):
        optimizer = torch.optim.SparseAdam(model.parameters())
        with pytest.raises(RuntimeError, match="dense gradients") as info:
            train(model, optimizer, x, target, steps=1)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("row", PARAMETER_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize(
    "make",
    [
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
    ],
    ids=["SGD", "Adam"],
)
def test_every_layer_trains(row: Row, make: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
    """Registry-driven: each lazy layer (norm affine parameters too) under an early optimizer."""
    x = row.example()
    target = torch.randn(1)
    results = []
    for build_lazy in (True, False):
        torch.manual_seed(0)
        model = row.lazy(**row.simple) if build_lazy else row.new_eager(row.simple, row.simple_size)
        optimizer = make(model)
        for _ in range(3):
            optimizer.zero_grad()
            (row.call(model, x).tanh().mean() - target).square().backward()
            optimizer.step()
        results.append((model, optimizer))
    (lazy, lazy_opt), (eager, eager_opt) = results
    assert type(lazy) is row.eager
    assert_same_parameters(lazy, eager)
    for key, value in eager.state_dict().items():  # running statistics too
        assert torch.equal(lazy.state_dict()[key], value), key
    assert_same_state(lazy_opt, eager_opt)


def test_mixed_model_with_param_groups() -> None:
    """Eager and lazy parameters in one optimizer, in groups with their own hyperparameters."""
    x, target = torch.randn(8, 3), torch.randn(8, 2)
    runs = []
    for lazy in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(3, 4), nn.Tanh(), lazynn.LazyLinear(2) if lazy else nn.Linear(4, 2)
        )
        optimizer = torch.optim.AdamW(
            [
                {"params": model[0].parameters(), "lr": 0.1},
                {"params": model[2].parameters(), "lr": 0.01, "weight_decay": 0.5},
            ]
        )
        train(model, optimizer, x, target)
        runs.append((model, optimizer))
    assert_same_parameters(runs[0][0], runs[1][0])
    assert_same_state(runs[0][1], runs[1][1])


def test_named_parameters_and_optimizer_checkpoint() -> None:
    """An optimizer made from named_parameters() before the build saves and reloads as eager."""
    x, target = torch.randn(8, 3), torch.randn(8, 2)
    torch.manual_seed(0)
    lazy = lazy_model()
    optimizer = torch.optim.Adam(lazy.named_parameters(), lr=0.01)
    train(lazy, optimizer, x, target, steps=2)
    torch.manual_seed(0)
    eager = eager_model()
    eager_optimizer = torch.optim.Adam(eager.named_parameters(), lr=0.01)
    train(eager, eager_optimizer, x, target, steps=2)
    saved = optimizer.state_dict()
    assert saved["param_groups"] == eager_optimizer.state_dict()["param_groups"]
    fresh = torch.optim.Adam(lazy.named_parameters(), lr=0.01)
    fresh.load_state_dict(saved)
    train(lazy, fresh, x, target, steps=1)
    train(eager, eager_optimizer, x, target, steps=1)
    assert_same_parameters(lazy, eager)


def test_model_moved_after_optimizer_before_first_call() -> None:
    """``model.double()`` between optimizer construction and the first call: same objects."""
    x, target = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    torch.manual_seed(0)
    lazy = lazy_model()
    optimizer = torch.optim.SGD(lazy.parameters(), lr=0.1, momentum=0.9)
    lazy.double()
    train(lazy, optimizer, x, target)
    torch.manual_seed(0)
    eager = eager_model().double()
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    train(eager, eager_optimizer, x, target)
    held = optimizer.param_groups[0]["params"]
    assert all(a is b for a, b in zip(held, lazy.parameters(), strict=True))
    assert all(p.dtype == torch.float64 for p in lazy.parameters())
    assert_same_parameters(lazy, eager)
