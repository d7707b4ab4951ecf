"""Real zoos, unmodified: each model's own constructor, given to ``lazynn.build`` as a
factory, gives the eager model bit for bit through every door (README.md here).

One harness: a row of ``zoo.ROWS`` is a model; under one seed it is constructed eagerly (the
reference) and through each door (``build(factory)``, ``build(factory, example)``,
``build(factory, device="meta")`` then ``materialize``, the same with ``threads=2``, and with
a ``torch.save``/``torch.load`` of the meta model between), and the two are compared: module
tree, every parameter and buffer (names, order, types, dtypes, ``requires_grad``, ties, values
bit for bit) and where torch's, Python's and numpy's generators end. The built model's
forward, in eval and in train mode, gives the eager model's output. FSDP2 on 2 ranks: each
rank builds the model on meta, shards it with ``fully_shard`` and materializes it; every local
shard is the eager tensor's block, every buffer the eager buffer, and the rank's generator
ends where eager construction leaves it.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import io
import os
import random
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from zoo import ROWS, Row, example_input, row

import lazynn
from distributed_util import Report, run_ranks

DOORS = [
    "build",
    "build(example)",
    "meta+materialize",
    "meta+materialize(threads=2)",
    "meta+torch.save+materialize",
]
WORLD = 2
SEED = 0


def need(name: str) -> None:
    """Skip without the module ``name``, unless CI requires it (as
    tests/ecosystem/test_integrations.py does)."""
    if os.environ.get("LAZYNN_REQUIRE_INTEGRATIONS") == "1":
        importlib.import_module(name)
    else:
        pytest.importorskip(name)


# --- the reference and the doors ------------------------------------------------------------


def seed() -> None:
    """Every generator a model's construction could draw from, at one seed."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)


@dataclass(frozen=True)
class Generators:
    """Where torch's CPU generator, Python's and numpy's stand."""

    torch_rng: bytes
    python_rng: Any
    numpy_rng: bytes

    @classmethod
    def now(cls) -> Generators:
        kind, keys, pos, gauss, cached = np.random.get_state()
        state = (kind, keys.tobytes(), pos, gauss, cached)
        return cls(torch.get_rng_state().numpy().tobytes(), random.getstate(), repr(state).encode())

    def digest(self) -> str:
        return hashlib.sha256(self.torch_rng).hexdigest()


@dataclass(frozen=True)
class Eager:
    model: nn.Module
    after: Generators


def construct(r: Row) -> Eager:
    seed()
    model = r.make()
    return Eager(model, Generators.now())


def through(door: str, r: Row) -> nn.Module:
    """``r``'s model, built by lazynn through ``door`` under the seed."""
    seed()
    if door == "build":
        return lazynn.build(r.make)
    if door == "build(example)":
        assert r.example is not None
        return lazynn.build(r.make, r.example)  # the shape is enough
    model = lazynn.build(r.make, device="meta")
    if door == "meta+torch.save+materialize":  # the init programs travel with the model
        model = torch.load(saved(model), weights_only=False)
    threads = 2 if door.endswith("(threads=2)") else 1
    return lazynn.materialize(model, threads=threads)


def saved(model: nn.Module) -> io.BytesIO:
    """``model`` as ``torch.save`` writes it (pickled whole), ready to load."""
    file = io.BytesIO()
    torch.save(model, file)
    file.seek(0)
    return file


# --- comparison -------------------------------------------------------------------------------


def tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter then every buffer, persistent or not, each name of a shared one."""
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def ties(model: nn.Module) -> list[list[str]]:
    """The names that share one tensor, for each tensor with more than one."""
    names: dict[int, list[str]] = {}
    for name, t in tensors(model):
        names.setdefault(id(t), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """How two tensors of one shape differ, in numbers."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    a, b = got.detach().reshape(-1), want.detach().reshape(-1)
    unequal = (a != b) & ~(a.isnan() & b.isnan()) if a.is_floating_point() else a != b
    first = int(unequal.nonzero()[0])
    gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
    return (
        f"{int(unequal.sum())} of {a.numel()} elements differ (largest gap {gap}); "
        f"element {first} is {a[first].item()!r}, expected {b[first].item()!r}"
    )


def assert_same_model(built: nn.Module, eager: nn.Module) -> None:
    """``built`` is ``eager``: the same module tree (types, modes, repr), the same tensors
    (names in order, parameter or buffer, dtype, device, ``requires_grad``, ties) and the
    same values bit for bit."""
    kinds = [(name, type(m).__name__, m.training) for name, m in built.named_modules()]
    assert kinds == [(name, type(m).__name__, m.training) for name, m in eager.named_modules()]
    assert repr(built) == repr(eager)
    got, want = list(tensors(built)), list(tensors(eager))
    assert [name for name, _ in got] == [name for name, _ in want]
    assert ties(built) == ties(eager)
    for (name, g), (_, w) in zip(got, want, strict=True):
        assert type(g) is type(w), name
        assert (g.dtype, g.device, g.requires_grad) == (w.dtype, w.device, w.requires_grad), name
        assert g.shape == w.shape, f"'{name}': {difference(g, w)}"
        assert torch.equal(g, w), f"'{name}': {difference(g, w)}"


def assert_same_generators(got: Generators, want: Generators, what: str) -> None:
    assert got.torch_rng == want.torch_rng, f"{what}: torch's generator ends elsewhere than eager's"
    assert got.python_rng == want.python_rng, f"{what}: Python's generator moved"
    assert got.numpy_rng == want.numpy_rng, f"{what}: numpy's generator moved"


# --- the rows ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ROWS, ids=[r.id for r in ROWS])
def zoo_row(request: pytest.FixtureRequest) -> Row:
    """A row; module-scoped so that pytest runs each row's tests together, after one eager
    construction."""
    r: Row = request.param
    if r.requires:
        need(r.requires)
    return r


@pytest.fixture(scope="module")
def eager(zoo_row: Row) -> Eager:
    return construct(zoo_row)


@pytest.mark.parametrize("door", DOORS)
def test_the_zoo_constructor_as_a_factory_gives_the_eager_model(
    zoo_row: Row, eager: Eager, door: str
) -> None:
    if door == "build(example)" and zoo_row.example is None:
        pytest.skip(f"no forward on meta: {zoo_row.why_no_example}")
    if door == "meta+torch.save+materialize":
        try:
            saved(eager.model)
        except Exception as error:
            pytest.skip(f"the eager model cannot be pickled either ({error})")
    built = through(door, zoo_row)
    after = Generators.now()
    assert not lazynn.is_lazy(built)
    assert all(t.device.type == "cpu" for _, t in tensors(built))
    assert_same_model(built, eager.model)
    assert_same_generators(after, eager.after, door)


def test_the_built_model_computes_what_the_eager_model_computes(zoo_row: Row, eager: Eager) -> None:
    """Equal tensors are not the whole model: what ``__init__`` computed besides them (scales,
    drop rates, index lists) shows in the forward. Eval mode, then train mode from one seed
    (dropout, drop path, batch statistics)."""
    if zoo_row.example is None:
        pytest.skip(f"no forward here: {zoo_row.why_no_example}")
    built, reference = through("build", zoo_row), copy.deepcopy(eager.model)
    x = example_input(zoo_row.example)
    for mode in ("eval", "train"):
        outputs = []
        for model in (built, reference):
            getattr(model, mode)()
            torch.manual_seed(1)
            with torch.no_grad():
                outputs.append(tree_leaves(model(x)))
        got, want = outputs
        assert len(got) == len(want), mode
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), f"{mode} mode: {difference(g, w)}"
    assert_same_model(built, reference)  # batch statistics updated alike


# --- FSDP2 --------------------------------------------------------------------------------


def digest(t: torch.Tensor) -> str:
    """The bytes of ``t``'s values (any dtype), hashed."""
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules to ``fully_shard`` before the root, as a per-block recipe does: each
    element of a ``ModuleList``, ``ModuleDict`` or ``Sequential`` that holds parameters, the
    outermost such (a stage, not also its blocks), in the order found; in a model with none
    (its stages plain attributes), the root's children that hold parameters."""
    found: list[nn.Module] = []

    def visit(module: nn.Module, in_container: bool) -> None:
        for child in module.children():
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                visit(child, True)  # no forward of its own: fully_shard refuses it
            elif in_container and any(True for _ in child.parameters()):
                found.append(child)
            else:
                visit(child, isinstance(child, nn.Sequential))

    visit(model, isinstance(model, nn.Sequential))
    return found or [c for c in model.children() if any(True for _ in c.parameters())]


def _fsdp_row(r: Row, mesh: Any) -> Report:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    seed()
    model = lazynn.build(r.make, device="meta")
    units = shard_units(model)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    lazynn.materialize(model)
    after = Generators.now()
    params = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        params[name] = {
            "sharded": isinstance(p, DTensor),
            "shape": list(local.shape),
            "digest": digest(local),
            "sum": local.double().sum().item(),
        }
    buffers = {name: digest(b) for name, b in model.named_buffers()}
    return {
        "units": len(units),
        "params": params,
        "buffers": buffers,
        "torch_generator": after.digest(),
        "other_generators": (after.python_rng, after.numpy_rng),
    }


def _fsdp_worker(rank: int, world: int) -> Report:
    """On each rank, every row in turn; a row that fails reports its traceback only."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    report: Report = {}
    for r in ROWS:
        try:
            if r.requires:
                importlib.import_module(r.requires)
        except ImportError as error:
            report[r.id] = {"missing": str(error)}
            continue
        try:
            report[r.id] = _fsdp_row(r, mesh)
        except Exception as error:
            report[r.id] = {"crash": f"{type(error).__name__}: {error}\n{traceback.format_exc()}"}
    return report


@pytest.fixture(scope="module")
def fsdp_ranks() -> list[Report]:
    """One launch of 2 ranks (gloo, CPU, 127.0.0.1) for all rows: spawning and importing the
    zoos costs seconds."""
    return run_ranks(_fsdp_worker, world=WORLD, timeout=600.0)


def block(full: torch.Tensor, rank: int) -> torch.Tensor:
    """The rows of ``full`` FSDP2 gives ``rank`` (dim 0 cut as ``torch.chunk`` cuts it; a rank
    past the chunks holds none)."""
    chunks = full.chunk(WORLD, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


def test_fsdp2_every_rank_holds_the_eager_tensors_block(
    zoo_row: Row, eager: Eager, fsdp_ranks: list[Report]
) -> None:
    full_params = dict(eager.model.named_parameters())
    full_buffers = dict(eager.model.named_buffers())
    for ranked in fsdp_ranks:
        rank = ranked["rank"]
        got = ranked[zoo_row.id]
        if "missing" in got:
            need(zoo_row.requires)  # skips, or fails in CI
        assert "crash" not in got, f"rank {rank}: {got['crash']}"
        assert got["units"] > 0, f"rank {rank}: only the root was sharded"
        assert list(got["params"]) == list(full_params), f"rank {rank}: parameter names"
        for name, shard in got["params"].items():
            want = block(full_params[name].detach(), rank)
            assert shard["sharded"], f"rank {rank}: '{name}' is not a DTensor"
            assert shard["shape"] == list(want.shape), f"rank {rank}: '{name}' shard shape"
            assert shard["digest"] == digest(want), (
                f"rank {rank}: '{name}' is not the eager tensor's block (rows "
                f"{rank * full_params[name].chunk(WORLD)[0].shape[0]}...): its values sum to "
                f"{shard['sum']!r}, the block's to {want.double().sum().item()!r}"
            )
        assert list(got["buffers"]) == list(full_buffers), f"rank {rank}: buffer names"
        for name, value in got["buffers"].items():
            assert value == digest(full_buffers[name]), f"rank {rank}: buffer '{name}' differs"
        assert got["torch_generator"] == eager.after.digest(), (
            f"rank {rank}: torch's generator ends elsewhere than after eager construction"
        )
        assert got["other_generators"] == (eager.after.python_rng, eager.after.numpy_rng), rank


def test_the_job_checks_twenty_architectures_or_more_and_llama3() -> None:
    """The job's floor (issue 37): at least 20 architectures, and torchtitan's llama3."""
    assert len({r.id for r in ROWS}) == len(ROWS) >= 20
    assert row("torchtitan/llama3_debugmodel").requires


def test_the_readme_lists_every_row() -> None:
    text = (Path(__file__).parent / "README.md").read_text()
    assert [r.id for r in ROWS if f"`{r.id}`" not in text] == []
