"""Every kind of value an aten op takes, as a recorded step keeps it, survives what a model
goes through: ``pickle``, ``copy.deepcopy`` and ``torch.save`` / ``torch.load`` (whose pickle
protocol 2 cannot keep a ``torch.memory_format`` object: the tape keeps its name).

The kinds are read from torch's own operator schemas, so that a kind a new torch adds fails
here until it is given a value (or a reason it never reaches a tape)."""

from __future__ import annotations

import copy
import io
import pickle
import re
from typing import Any

import pytest
import torch

from lazynn._program.tape import Const, GeneratorRef, Like, Step, Tape, View


def _schema_kinds() -> set[str]:
    """The argument types of every aten operator, by name (``ScalarType``, ``Layout``...),
    read off ``real_type`` (``type`` says ``int`` for a dtype). (torch._C: the schemas have no
    public listing; tests/ecosystem/test_torch_internals.py guards the private names lazynn
    itself uses, and this test fails loudly if these go.)"""
    kinds: set[str] = set()
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("aten::"):
            for argument in schema.arguments:
                kinds.update(p for p in re.split(r"[\[\]\(\), ?|]+", str(argument.real_type)) if p)
    return kinds


_VIEW = View(0, (2, 3), (3, 1), 0, torch.float32)

#: each kind an argument of a recorded step can be, and values of it (a tensor is a View,
#: a Like or a Const of the tape; a generator a GeneratorRef)
VALUES: dict[str, list[Any]] = {
    "Tensor": [_VIEW, Like((2, 3), (1, 2), torch.float16), Const(0), None],
    "int": [0, -3, 2**62],
    "float": [1.5, float("inf"), -0.0],
    "bool": [True, False],
    "complex": [1 + 2j],
    "number": [2, 0.5, 1j, True],  # (a Scalar)
    "str": ["mean", "reflect", ""],
    "ScalarType": [
        getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)
    ],
    "Layout": [torch.strided, torch.sparse_coo, torch.sparse_csr, torch._mkldnn],  # type: ignore[attr-defined]
    "MemoryFormat": [
        torch.contiguous_format,
        torch.channels_last,
        torch.channels_last_3d,
        torch.preserve_format,
    ],
    "Device": [torch.device("cpu"), torch.device("meta"), torch.device("cuda", 1)],
    "Generator": [GeneratorRef(0), None],
    # containers: their items are the kinds above
    "List": [[1, 2], [_VIEW, None]],
    "Tuple": [(1, 2.0)],
    "Optional": [None],
}

#: kinds no construction's step holds: TorchScript's (futures, remote references, streams,
#: dicts, enums, script classes, type variables, Any) and a Storage (``aten::set_`` from a
#: storage: a tensor is recorded by its View, and the recorder computes a real storage's
#: result for real)
NEVER = {
    "Any",
    "AnyEnumType",
    "Dict",
    "Future",
    "RRef",
    "Storage",
    "Stream",
    "t",
    "t1",
    "t2",
    "tVal",
    "__torch__.torch.classes.rnn.CellParamsBase",
}


def test_every_kind_of_argument_torch_has_is_covered() -> None:
    kinds = _schema_kinds()
    assert kinds - NEVER - set(VALUES) == set(), "a kind of argument with no value here"
    assert set(VALUES) <= kinds | {"Tensor"}  # (no stale entry)


def _through_torch_save(tape: Tape) -> Tape:
    buffer = io.BytesIO()
    torch.save(tape, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "door",
    [lambda t: pickle.loads(pickle.dumps(t)), copy.deepcopy, _through_torch_save],
    ids=["pickle", "deepcopy", "torch.save"],
)
@pytest.mark.parametrize("kind", sorted(VALUES))
def test_a_step_keeps_every_value_of_each_kind_through_each_door(kind: str, door: Any) -> None:
    tape = Tape(generators=[torch.get_rng_state()], consts=[torch.arange(3.0)])
    for value in VALUES[kind]:  # (as an argument, in a list and a tuple, and by keyword)
        tape.steps.append(Step("aten::x", (value, [value], (value, 1)), {"k": value}, (_VIEW,)))
    back = door(tape)
    assert back.steps == tape.steps
    for a, b in zip(back.steps, tape.steps, strict=True):
        for x, y in zip((*a.args, a.kwargs["k"]), (*b.args, b.kwargs["k"]), strict=True):
            assert type(x) is type(y)  # (a name put back as the object, not left a name)
    assert torch.equal(back.generators[0], tape.generators[0])
    assert torch.equal(back.consts[0], tape.consts[0])


def test_the_sweep_has_the_values_that_matter() -> None:
    assert torch.channels_last in VALUES["MemoryFormat"]  # (the one protocol 2 cannot keep)
    assert len(VALUES["MemoryFormat"]) == 4
    assert torch.bfloat16 in VALUES["ScalarType"]
    assert torch.sparse_coo in VALUES["Layout"]
