"""Real-shaped models, init code as published (tests/real_models/): the lazy port equals the
eager model bit for bit, every tensor and the random generator, on every path to a built model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

import lazynn
from distributed_util import always_jump, pack, run_ranks, unpack
from lazynn._cli.main import main
from real_models import EAGER, LAZY, MODELS, RealModel, every_tensor
from real_models.t5 import T5ForConditionalGeneration

NAMES = sorted(MODELS)
INSTANCE = [n for n in NAMES if MODELS[n].instance]


def examples(model: RealModel) -> tuple[Any, ...]:
    """The example inputs as lazynn.build takes them: shapes and dtypes only."""

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return lazynn.Spec(tuple(value.shape), value.dtype)
        return type(value)(spec(v) for v in value)

    return tuple(spec(v) for v in model.inputs())


def eager_twin(model: RealModel) -> tuple[nn.Module, torch.Tensor]:
    """The eager model under seed 0, and the generator's state after its construction."""
    torch.manual_seed(0)
    eager = model.make(EAGER)
    return eager, torch.get_rng_state()


def tie_groups(model: nn.Module) -> list[list[str]]:
    """The names that share one tensor, for each shared tensor."""
    groups: dict[int, list[str]] = {}
    for name, tensor in every_tensor(model).items():
        groups.setdefault(id(tensor), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def assert_same_model(lazy: nn.Module, eager: nn.Module, ties: bool = True) -> None:
    """The same classes, every tensor bit for bit (by name), the same ties. (A tensor kept as
    a plain attribute, computed from parameters, as weight_norm's ``weight``, may come without
    its autograd history from materialize: the forward computes it again.)"""
    assert [type(m) for m in lazy.modules()] == [type(m) for m in eager.modules()]
    mine, theirs = every_tensor(lazy), every_tensor(eager)
    assert mine.keys() == theirs.keys()
    state = {**dict(eager.named_parameters()), **dict(eager.named_buffers())}
    for name, tensor in theirs.items():
        other = mine[name]
        assert type(other) is type(tensor), name
        assert other.dtype == tensor.dtype, name
        assert other.device == tensor.device, name
        if name in state:
            assert other.requires_grad == tensor.requires_grad, name
        assert torch.equal(other, tensor), name
    if ties:
        assert tie_groups(lazy) == tie_groups(eager)


@pytest.mark.parametrize("name", NAMES)
def test_the_factory_form_builds_the_eager_model(name: str) -> None:
    model = MODELS[name]
    eager, after_eager = eager_twin(model)
    torch.manual_seed(0)
    lazy = lazynn.build(model.factory(LAZY), *examples(model))
    assert torch.equal(torch.get_rng_state(), after_eager)
    assert_same_model(lazy, eager)
    assert not lazynn.is_lazy(lazy)


@pytest.mark.parametrize("name", NAMES)
def test_the_factory_form_on_meta_then_materialize_is_the_eager_model(name: str) -> None:
    model = MODELS[name]
    eager, after_eager = eager_twin(model)
    torch.manual_seed(0)
    lazy = lazynn.build(model.factory(LAZY), *examples(model), device="meta")
    assert all(t.is_meta for t in every_tensor(lazy).values() if t.is_floating_point())
    lazynn.materialize(lazy, "cpu")
    assert torch.equal(torch.get_rng_state(), after_eager)
    assert_same_model(lazy, eager)
    assert_same_outputs(lazy, eager, model)


def assert_same_outputs(lazy: nn.Module, eager: nn.Module, model: RealModel) -> None:
    """In eval mode, the same outputs on the model's inputs (a module that keeps its own view
    of its tensors, as nn.LSTM's flat weights, must see the new ones)."""
    eager.eval(), lazy.eval()
    inputs = model.inputs()
    mine, theirs = tree_leaves(lazy(*inputs)), tree_leaves(eager(*inputs))
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_the_built_model_computes_what_the_eager_one_does(name: str) -> None:
    model = MODELS[name]
    eager, _ = eager_twin(model)
    torch.manual_seed(0)
    assert_same_outputs(lazynn.build(model.factory(LAZY), *examples(model)), eager, model)


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's blocks: the members of its ``nn.Sequential`` and ``nn.ModuleList``
    containers that hold parameters and are not containers themselves."""
    return [
        block
        for parent in model.modules()
        if type(parent) in (nn.Sequential, nn.ModuleList)
        for block in parent
        if type(block) not in (nn.Sequential, nn.ModuleList)
        and any(True for _ in block.parameters())
    ]


def checkpointed(model: nn.Module) -> nn.Module:
    """``model`` whose every outermost block runs under activation checkpointing, as timm's
    ``checkpoint_seq`` or a ``for block in blocks: x = checkpoint(block, x)`` loop runs it."""
    inner = {id(b) for block in blocks_of(model) for b in block.modules() if b is not block}
    for block in blocks_of(model):
        if id(block) in inner:
            continue
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    return model


@pytest.mark.parametrize("name", INSTANCE)
def test_a_first_call_under_per_block_checkpoint_is_a_plain_first_call(name: str) -> None:
    """Builds inside checkpointed blocks draw what a first call without checkpointing draws
    (and the backward's recomputation builds nothing again)."""
    model = MODELS[name]
    torch.manual_seed(0)
    plain = model.make(LAZY).eval()
    plain(*model.inputs())
    after = torch.get_rng_state()
    torch.manual_seed(0)
    lazy = checkpointed(model.make(LAZY).eval())
    inputs = model.inputs()
    leaves = [t for t in tree_leaves(inputs) if t.is_floating_point()]
    for t in leaves:
        t.requires_grad_(True)
    out = [t for t in tree_leaves(lazy(*inputs)) if t.requires_grad]
    sum(t.sum() for t in out).backward()
    assert not lazynn.is_lazy(lazy)
    assert torch.equal(torch.get_rng_state(), after)
    assert_same_model(lazy, plain)


@pytest.mark.parametrize("name", NAMES)
def test_a_summary_counts_the_eager_models_parameters(name: str) -> None:
    model = MODELS[name]
    eager, _ = eager_twin(model)
    before = torch.get_rng_state()
    report = lazynn.summary(model.factory(LAZY), *examples(model))
    assert torch.equal(torch.get_rng_state(), before)
    assert report.total_parameters == sum(p.numel() for p in eager.parameters())


def _cli_input(value: Any) -> str:
    """An example input as the command line writes it: ``2x3x32x32``, ``2x16:long``, a
    group ``(2x3x16, 2x3x16)``."""
    if isinstance(value, torch.Tensor):
        dims = "x".join(str(d) for d in value.shape)
        return dims if value.dtype == torch.float32 else f"{dims}:{str(value.dtype)[6:]}"
    return "(" + ", ".join(_cli_input(v) for v in value) + ")"


@pytest.mark.parametrize("name", NAMES)
def test_the_command_line_summarizes_the_lazy_port(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = MODELS[name]
    eager, _ = eager_twin(model)
    inputs = [arg for v in model.inputs() for arg in ("--input", _cli_input(v))]
    target = f"real_models:lazy_model({name!r})"
    assert main(["summary", target, *inputs]) == 0
    out = capsys.readouterr().out
    total = sum(p.numel() for p in eager.parameters())
    assert f"Total params:         {total:,}" in out


@pytest.mark.parametrize("name", INSTANCE)
def test_an_eager_checkpoint_loads_into_the_unbuilt_instance(name: str) -> None:
    model = MODELS[name]
    eager, _ = eager_twin(model)
    with torch.no_grad():  # values of its own, unlike any initialization
        for tensor in eager.parameters():
            tensor.add_(1.0)
    lazy = model.make(LAZY)
    assert lazynn.is_lazy(lazy)
    rng = torch.get_rng_state()
    lazy.load_state_dict(eager.state_dict())
    assert torch.equal(torch.get_rng_state(), rng)  # every lazy tensor came from the checkpoint
    assert_same_model(lazy, eager)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", ["built", "meta and assign"])
def test_an_eager_checkpoint_loads_into_the_factory_form(name: str, form: str) -> None:
    model = MODELS[name]
    eager, _ = eager_twin(model)
    with torch.no_grad():
        for tensor in eager.parameters():
            tensor.add_(1.0)
    torch.manual_seed(0)  # (as the eager model: tensors a checkpoint does not hold)
    if form == "built":
        lazy = lazynn.build(model.factory(LAZY), *examples(model))
        lazy.load_state_dict(eager.state_dict())
    else:  # the large-model recipe: no memory for values the checkpoint replaces
        lazy = lazynn.build(model.factory(LAZY), *examples(model), device="meta")
        lazy.load_state_dict(eager.state_dict(), assign=True)
        lazynn.materialize(lazy, "cpu")  # what the checkpoint lacks (non-persistent buffers)
    # (assign=True gives each key its own parameter: ties are re-made by the model's code,
    # as for an eager model loaded so)
    assert_same_model(lazy, eager, ties=form == "built")


# --- a T5 checkpoint saved the Hugging Face way -----------------------------------------------

#: the names Hugging Face leaves out of a T5 checkpoint: aliases of ``shared.weight``
T5_TIED = set(T5ForConditionalGeneration._tied_weights_keys)


def _load_the_hf_way(model: nn.Module, eager: nn.Module, how: str, path: Path) -> None:
    """Load ``eager``'s weights into ``model`` from a checkpoint that holds a tied tensor under
    one name: without the head's key; as ``save_pretrained`` writes it (T5's
    ``_tied_weights_keys`` left out); or through safetensors' ``save_model`` / ``load_model``
    (which keep one name of each shared tensor, and check the others are its aliases)."""
    if how == "safetensors":
        st = pytest.importorskip("safetensors.torch")
        st.save_model(eager, str(path))
        assert "lm_head.weight" not in st.load_file(str(path))
        missing, unexpected = st.load_model(model, str(path))  # (strict)
        assert not missing
        assert not unexpected
        return
    left_out = {"lm_head.weight"} if how == "without the head's key" else T5_TIED
    checkpoint = {k: v for k, v in eager.state_dict().items() if k not in left_out}
    missing, unexpected = model.load_state_dict(checkpoint, strict=False)
    assert set(missing) == left_out
    assert not unexpected


@pytest.mark.parametrize("how", ["without the head's key", "save_pretrained", "safetensors"])
@pytest.mark.parametrize("form", ["unbuilt instance", "built"])
def test_a_t5_checkpoint_saved_the_hugging_face_way_loads_with_its_head_tied(
    form: str, how: str, tmp_path: Path
) -> None:
    """A checkpoint without the tied head's key loads into the lazy T5: every tensor is the
    eager model's, the head is the embedding's tensor, the first forward is eager's, and the
    generator is where the form promises (the unbuilt instance: the load and the forward draw
    nothing, its layers' numbers being the checkpoint's; the factory form: where eager
    construction then load leaves it)."""
    model = MODELS["t5"]
    eager, after_eager = eager_twin(model)  # (loading draws nothing)
    with torch.no_grad():  # values of its own, unlike any initialization
        for tensor in eager.parameters():
            tensor.add_(1.0)
    torch.manual_seed(0)
    if form == "unbuilt instance":
        lazy = model.make(LAZY)
        assert lazynn.is_lazy(lazy)
    else:
        lazy = lazynn.build(model.factory(LAZY), *examples(model))
    after_construction = torch.get_rng_state()
    _load_the_hf_way(lazy, eager, how, tmp_path / "model.safetensors")
    assert not lazynn.is_lazy(lazy)
    assert_same_model(lazy, eager)
    assert lazy.lm_head.weight is lazy.shared.weight
    assert_same_outputs(lazy, eager, model)  # (its first forward)
    after = after_construction if form == "unbuilt instance" else after_eager
    assert torch.equal(torch.get_rng_state(), after)


def test_a_t5_checkpoint_saved_the_hugging_face_way_loads_into_a_meta_build() -> None:
    """``from_pretrained``'s low-memory path: constructed on meta, the checkpoint's tensors
    assigned (the tied keys missing), ``tie_weights()`` (which ``from_pretrained`` calls after
    loading), then ``materialize``: the eager model, its head the embedding's tensor, and
    the generator where eager construction leaves it (though nothing was left to draw into)."""
    model = MODELS["t5"]
    eager, after = eager_twin(model)
    with torch.no_grad():
        for tensor in eager.parameters():
            tensor.add_(1.0)
    checkpoint = {k: v for k, v in eager.state_dict().items() if k not in T5_TIED}
    torch.manual_seed(0)
    lazy = lazynn.build(model.factory(LAZY), *examples(model), device="meta")
    missing, unexpected = lazy.load_state_dict(checkpoint, strict=False, assign=True)
    assert set(missing) == T5_TIED
    assert not unexpected
    lazy.tie_weights()
    lazynn.materialize(lazy, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    assert_same_model(lazy, eager)
    assert lazy.lm_head.weight is lazy.shared.weight
    assert_same_outputs(lazy, eager, model)


# --- FSDP2 on 2 ranks -------------------------------------------------------------------------


def _sharded_worker(rank: int, world: int) -> dict[str, Any]:
    """Each model: the factory form on meta, fully_shard (each block, then the root; a model
    with ties, the root only), materialize; every tensor gathered, and the next draw."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from lazynn._program.jump import counters

    mesh = init_device_mesh("cpu", (world,))
    report: dict[str, Any] = {"jumps_before": always_jump()}
    for name in NAMES:
        model = MODELS[name]
        torch.manual_seed(0)
        lazy = lazynn.build(model.factory(LAZY), *examples(model), device="meta")
        if not tie_groups(lazy):  # (tied parameters must be in one FSDP group)
            for block in blocks_of(lazy)[::-1]:  # (inner blocks first)
                fully_shard(block, mesh=mesh)
        fully_shard(lazy, mesh=mesh)
        lazynn.materialize(lazy, "cpu")
        tensors = every_tensor(lazy)
        report[name] = {
            "sharded": sorted(n for n, t in tensors.items() if isinstance(t, DTensor)),
            "tensors": {
                n: pack(t.full_tensor() if isinstance(t, DTensor) else t)
                for n, t in tensors.items()
            },
            "next_draw": pack(torch.rand(4)),
        }
    report["jumps"] = counters().jumps
    return report


@pytest.mark.distributed
@pytest.mark.slow
def test_the_factory_form_sharded_by_fsdp2_is_the_eager_model() -> None:
    ranks = run_ranks(_sharded_worker, world=2, timeout=240)
    for name in NAMES:
        eager, _ = eager_twin(MODELS[name])
        next_draw = torch.rand(4)
        theirs = every_tensor(eager)
        for r in ranks:
            got = r[name]
            assert got["sharded"], f"rank {r['rank']}: {name} has no sharded parameter"
            assert got["tensors"].keys() == theirs.keys()
            for key, tensor in theirs.items():
                assert torch.equal(unpack(got["tensors"][key]), tensor), (r["rank"], name, key)
            assert torch.equal(unpack(got["next_draw"]), next_draw), (r["rank"], name)
    for r in ranks:  # (each rank jumped over the other's words)
        assert r["jumps"] > r["jumps_before"], r["rank"]


# --- tensor parallel, and 2-D (FSDP2 across TP) ----------------------------------------------


def _llama_plan(model: nn.Module) -> dict[str, Any]:
    """torchtitan's plan for a LLaMA block: column-wise in, row-wise out."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i, _ in enumerate(model.layers):
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        plan[f"layers.{i}.feed_forward.w3"] = ColwiseParallel()
        for name in ("attention.wo", "feed_forward.w2"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    return plan


def _linear_plan(model: nn.Module, world: int) -> dict[str, Any]:
    """Every untied ``nn.Linear`` whose outputs split evenly, column-wise (``Shard(0)``): a
    model without a published plan (its materialized values are what is checked)."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    tied = {id(t) for group in tie_groups(model) for t in (model.get_parameter(group[0]),)}
    return {
        path: ColwiseParallel()
        for path, m in model.named_modules()
        if type(m) is nn.Linear and m.out_features % world == 0 and id(m.weight) not in tied
    }


#: the models tensor parallel shards (their linear layers), on 2 ranks
TENSOR_PARALLEL = ["llama", "mamba", "swin", "vit"]


def _parallel_worker(
    rank: int, world: int, dims: tuple[int, ...], name: str = "llama"
) -> dict[str, Any]:
    """A model in the factory form on meta, tensor parallel on the last mesh dimension (and
    FSDP2 across the first, 2-D), materialized; every tensor gathered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    always_jump()
    names = ("dp", "tp") if len(dims) == 2 else ("tp",)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
    model = MODELS[name]
    torch.manual_seed(0)
    lazy = lazynn.build(model.factory(LAZY), *examples(model), device="meta")
    plan = _llama_plan(lazy) if name == "llama" else _linear_plan(lazy, dims[-1])
    parallelize_module(lazy, mesh["tp"], plan)
    if len(dims) == 2:
        for layer in lazy.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(lazy, mesh=mesh["dp"])
    lazynn.materialize(lazy, "cpu")
    tensors = every_tensor(lazy)
    return {
        "placements": {
            n: [repr(p) for p in t.placements] for n, t in tensors.items() if isinstance(t, DTensor)
        },
        "tensors": {
            n: pack(t.full_tensor() if isinstance(t, DTensor) else t) for n, t in tensors.items()
        },
        "next_draw": pack(torch.rand(4)),
    }


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    ("dims", "name"),
    [((2,), name) for name in TENSOR_PARALLEL] + [((2, 2), "llama")],
    ids=[f"tp-{name}" for name in TENSOR_PARALLEL] + ["2-d-llama"],
)
def test_the_factory_form_in_tensor_parallel_and_2d_is_the_eager_model(
    dims: tuple[int, ...], name: str
) -> None:
    ranks = run_ranks(_parallel_worker, dims, name, world=math.prod(dims), timeout=240)
    eager, _ = eager_twin(MODELS[name])
    next_draw = torch.rand(4)
    theirs = every_tensor(eager)
    for r in ranks:
        assert any("Shard(dim=0)" in p for p in r["placements"].values()), r["placements"]
        if name == "llama":
            assert "Shard(dim=0)" in r["placements"]["layers.0.attention.wq.weight"]
            assert "Shard(dim=1)" in r["placements"]["layers.1.feed_forward.w2.weight"]
        assert r["tensors"].keys() == theirs.keys()
        for key, tensor in theirs.items():
            assert torch.equal(unpack(r["tensors"][key]), tensor), (r["rank"], key)
        assert torch.equal(unpack(r["next_draw"]), next_draw), r["rank"]
