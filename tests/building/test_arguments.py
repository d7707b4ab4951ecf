"""Every public function of lazynn, given wrong-typed arguments: each either takes the value
(a forward that takes an int gets it) or refuses it with a LazynnError (an ArgumentError at
the door: also the TypeError or ValueError torch would raise), never another exception from
deep inside, and leaves every random generator where it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import lazynn

WRONG: list[Any] = [None, 3, -1, 2.5, "x", object(), [1], True, torch.zeros(1), nn.Linear(2, 2)]


def net() -> nn.Sequential:
    return nn.Sequential(lazynn.LazyLinear(3))


def meta() -> nn.Module:
    return lazynn.build(net, (2, 4), device="meta")


def render(**kwargs: Any) -> str:
    return lazynn.summary(net(), (2, 4)).render(**kwargs)


#: each public function's arguments, one at a time, the others right
CALLS: dict[str, Callable[[Any], object]] = {
    "build(model)": lambda v: lazynn.build(v, (2, 4)),
    "build(example)": lambda v: lazynn.build(net, v),
    "build(device)": lambda v: lazynn.build(net, (2, 4), device=v),
    "build(dtype)": lambda v: lazynn.build(net, (2, 4), dtype=v),
    "build(progress)": lambda v: lazynn.build(net, (2, 4), progress=v),
    "build(threads)": lambda v: lazynn.build(net, (2, 4), threads=v),
    "materialize(model)": lambda v: lazynn.materialize(v),
    "materialize(device)": lambda v: lazynn.materialize(meta(), v),
    "materialize(progress)": lambda v: lazynn.materialize(meta(), progress=v),
    "materialize(threads)": lambda v: lazynn.materialize(meta(), threads=v),
    "summary(model)": lambda v: lazynn.summary(v, (2, 4)),
    "summary(example)": lambda v: lazynn.summary(net(), v),
    "summary(mode)": lambda v: lazynn.summary(net(), (2, 4), mode=v),
    "summary(training)": lambda v: lazynn.summary(net(), (2, 4), training=v),
    "summary(optimizer)": lambda v: lazynn.summary(net(), (2, 4), training=True, optimizer=v),
    "on_build(module)": lambda v: lazynn.on_build(v, lambda m: None),
    "on_build(fn)": lambda v: lazynn.on_build(net(), v),
    "lazy(cls)": lambda v: lazynn.lazy(v, x=lazynn.Infer()),
    "lazy(inferred)": lambda v: lazynn.lazy(nn.Linear, in_features=v),
    "Infer(dim)": lambda v: lazynn.lazy(nn.Linear, in_features=lazynn.Infer(dim=v)),
    "Spec(shape)": lambda v: lazynn.Spec(v),
    "Spec(dtype)": lambda v: lazynn.Spec((2, 4), v),
    "render(format)": lambda v: render(format=v),
    "render(depth)": lambda v: render(depth=v),
    "render(width)": lambda v: render(width=v),
    "render(columns)": lambda v: render(columns=v),
    "render(expand)": lambda v: render(expand=v),
    "is_lazy(obj)": lambda v: lazynn.is_lazy(v),
}


@pytest.mark.parametrize("value", WRONG, ids=[type(v).__name__ + repr(v)[:8] for v in WRONG])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_wrong_argument_is_taken_or_refused_as_a_lazynn_error(call: str, value: Any) -> None:
    state = torch.get_rng_state()
    refused: lazynn.LazynnError | None = None
    try:
        CALLS[call](value)
    except lazynn.LazynnError as error:  # (anything else raised fails the test, naming the call)
        refused = error
    if refused is not None:
        assert "Fix: " in str(refused)
        assert torch.equal(torch.get_rng_state(), state)  # (refused before drawing)


@pytest.mark.parametrize(
    ("call", "value", "text"),
    [
        ("build(model)", 3, "lazynn.build: expected a model (an nn.Module) or its factory"),
        ("build(device)", "x", "lazynn.build: expected device: a torch.device or its name"),
        ("build(progress)", 3, "lazynn.build: expected progress: True (a bar)"),
        ("materialize(model)", None, "lazynn.materialize: expected an nn.Module, received"),
        ("materialize(device)", 2.5, "lazynn.materialize: expected device"),
        ("summary(model)", "x", "lazynn.summary: expected a model (an nn.Module)"),
        ("on_build(module)", 3, "lazynn.on_build: expected an nn.Module"),
        ("render(depth)", "x", "expected depth: an integer of 0 or more"),
        ("render(columns)", "params", "expected columns: a list or tuple of names"),
        ("Spec(shape)", 3, "lazynn.Spec: expected shape: a tuple of sizes"),
        ("Spec(dtype)", "lnog", "did you mean 'long'"),
    ],
)
def test_the_refusals_name_the_function_and_what_it_takes(call: str, value: Any, text: str) -> None:
    with pytest.raises(lazynn.ArgumentError, match=text.replace("(", r"\(").replace(")", r"\)")):
        CALLS[call](value)


def test_a_spec_takes_a_dtype_by_name_and_any_sequence_of_sizes() -> None:
    assert lazynn.Spec([2, 4], "long") == lazynn.Spec((2, 4), torch.long)
    assert lazynn.Spec((2, 4), "torch.long").dtype is torch.long  # (as build's dtype= takes)
    assert lazynn.Spec(torch.Size([2, 4])).shape == (2, 4)
    assert (
        lazynn.build(
            nn.Sequential(nn.Embedding(5, 3), lazynn.LazyLinear(2)), lazynn.Spec((2, 4), "long")
        )[1].in_features
        == 3
    )


@pytest.mark.parametrize("example", [(-1, 3), [2, -5], (0, -1)])
def test_a_negative_size_in_an_example_shape_is_refused_at_the_door(example: Any) -> None:
    model = nn.Sequential(lazynn.LazyLinear(2))
    with pytest.raises(lazynn.ArgumentError, match=r"an example shape: expected sizes of 0"):
        lazynn.build(model, example)
    assert lazynn.is_lazy(model)
