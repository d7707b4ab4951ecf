"""lazynn on torch.distributed: DDP and FSDP2 (``fully_shard``), 2 ranks, gloo, CPU.

Data parallel: a lazy model built under one seed on every rank equals its eager twin bit for
bit, wraps in ``DistributedDataParallel`` and trains as the eager twin does on the full batch.
Sharded: the recipe for models too big for one device (``build(..., device="meta")``,
``fully_shard`` per block and the root, ``materialize``) allocates only each rank's shards,
yet the gathered parameters equal the eager twin's and train as it does. Wrapping an unbuilt
model refuses with lazynn's error (the paths of the unbuilt parameters, and the fix) and
leaves the model as it was.

The DDP tests share one launch of 2 ranks, the FSDP2 tests another (spawning and torch's
first DDP construction cost seconds): ``distributed_util.run_sections`` runs each test's
worker in turn on every rank, which reports plain values (tensors as raw bytes); this
process asserts, against eager twins constructed here.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazynn
from allocations import CHUNK_BYTES, Allocations
from distributed_util import Report, pack, run_sections, section, unpack

pytestmark = pytest.mark.distributed

WORLD = 2
STEPS = 3
LR = 0.1
BATCH = 8  # global batch; each rank trains on BATCH // WORLD samples
CLASSES = 3
RTOL, ATOL = 1e-5, 1e-6  # all-reduce sums in another order than one process


# --- models: each lazy model has an eager twin with the sizes written out ---------------------


def conv_net(lazy: bool) -> nn.Sequential:
    """Lazy conv / norm / linear layers mixed with eager ones (some after the lazy ones).

    GroupNorm, not BatchNorm: DDP normalizes each rank's half batch with its own statistics,
    so a BatchNorm model under DDP does not compute the full-batch model's function.
    """
    return nn.Sequential(
        lazynn.LazyConv2d(4, 3, padding=1) if lazy else nn.Conv2d(3, 4, 3, padding=1),
        lazynn.LazyGroupNorm(2) if lazy else nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2),  # eager, after a lazy layer: replayed by build
        nn.Flatten(),
        lazynn.LazyLinear(16) if lazy else nn.Linear(6 * 3 * 3, 16),
        nn.Tanh(),
        nn.Linear(16, CLASSES),
    )


CONV_INPUT = (BATCH, 3, 8, 8)


def mlp(lazy: bool) -> nn.Sequential:
    return nn.Sequential(
        lazynn.LazyLinear(8) if lazy else nn.Linear(5, 8),
        nn.ReLU(),
        lazynn.LazyLinear(6) if lazy else nn.Linear(8, 6),
        nn.ReLU(),
        nn.Linear(6, CLASSES),
    )


MLP_INPUT = (BATCH, 5)
MLP_UNBUILT = ["0.weight", "0.bias", "2.weight", "2.bias"]

#: The sharded model's input is wide, so that its first layer (WIDTH x FEATURES, 2M numbers)
#: is bigger than anything the sharded initialization may allocate at once.
FEATURES, WIDTH, DEPTH = 16384, 128, 2
STACK_LR = 1e-3  # 8 samples of 16384 features: a larger step fits them in one step


class Block(nn.Module):
    """A pre-norm residual MLP block, as in a transformer."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.norm = lazynn.LazyLayerNorm() if lazy else nn.LayerNorm(WIDTH)
        self.up = lazynn.LazyLinear(2 * WIDTH) if lazy else nn.Linear(WIDTH, 2 * WIDTH)
        self.down = lazynn.LazyLinear(WIDTH) if lazy else nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    """Embedding, blocks, then eager final norm and head (eager layers after lazy ones)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.embed = lazynn.LazyLinear(WIDTH) if lazy else nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block(lazy) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


STACK_INPUT = (BATCH, FEATURES)
STACK_UNBUILT_FIRST = ["embed.weight", "embed.bias", "blocks.0.norm.weight"]


# --- shared by the ranks and this process -----------------------------------------------------


def global_batch(shape: tuple[int, ...], seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed global batch (its own generator: the global random state is left alone)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randint(0, CLASSES, (shape[0],), generator=gen)


def half(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t.chunk(WORLD)[rank]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = LR) -> list[float]:
    """STEPS of SGD on a mean loss (so DDP's / FSDP's gradient average is the full batch's)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def packed_params(model: nn.Module) -> dict[str, Any]:
    return {name: pack(p) for name, p in model.named_parameters()}


def eager_twin(factory: Any) -> nn.Module:
    """The eager model constructed under seed 0 (this process's random state is restored)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model: nn.Module = factory(lazy=False)
        model.__dict__["next_draw"] = torch.rand(4)  # where its construction left the stream
    return model


def assert_params_equal(reported: dict[str, Any], model: nn.Module, what: str) -> None:
    expected = dict(model.named_parameters())
    assert list(reported) == list(expected), f"{what}: parameter names differ"
    for name, packed in reported.items():
        got = unpack(packed)
        assert got.shape == expected[name].shape, f"{what}: '{name}' shape"
        assert torch.equal(got, expected[name].detach()), f"{what}: '{name}' differs"


def assert_params_close(reported: dict[str, Any], model: nn.Module, what: str) -> None:
    expected = dict(model.named_parameters())
    assert list(reported) == list(expected), f"{what}: parameter names differ"
    for name, packed in reported.items():
        torch.testing.assert_close(
            unpack(packed), expected[name].detach(), rtol=RTOL, atol=ATOL, msg=f"{what}: '{name}'"
        )


def assert_mean_losses(ranks: list[Report], losses: list[float]) -> None:
    """The ranks' losses on their halves average to the full batch's (a mean loss)."""
    mean = [sum(step) / len(step) for step in zip(*(r["losses"] for r in ranks), strict=True)]
    torch.testing.assert_close(mean, losses, rtol=RTOL, atol=ATOL)


def lazynn_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "lazynn" in str(w.message)]


def refusal(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """Call ``call``; describe the error it raises as plain values, or None."""
    try:
        call(*args, **kwargs)
    except Exception as error:
        return {
            "type": type(error).__name__,
            "unbuilt_error": isinstance(error, lazynn.UnbuiltError),
            "runtime_error": isinstance(error, RuntimeError),
            "message": str(error),
        }
    return None


def assert_refusal(report: dict[str, Any] | None, named: list[str], wrapper: str) -> None:
    """An UnbuiltError (a RuntimeError, as torch's refusals) naming ``named`` and the fix."""
    assert report is not None, f"{wrapper} accepted an unbuilt lazynn model"
    assert report["unbuilt_error"], f"{wrapper} raised {report['type']}: {report['message']}"
    assert report["runtime_error"]
    text = report["message"]
    for needle in named:
        assert needle in text, (needle, text)
    assert "lazynn.build" in text, text
    assert "load_state_dict" not in text, text  # torch's own wording would blame it


# --- DistributedDataParallel ------------------------------------------------------------------


def _ddp_worker(rank: int, world: int) -> Report:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = conv_net(lazy=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lazynn.build(model, CONV_INPUT)
    report: Report = {
        "warnings": lazynn_warnings(caught),
        "types": [type(m).__name__ for m in model],
        "built": packed_params(model),  # before DDP broadcasts rank 0's values
        "next_draw": pack(torch.rand(4)),
    }
    ddp = DDP(model)
    report["wrapped"] = packed_params(model)
    x, y = global_batch(CONV_INPUT)
    report["losses"] = train(ddp, half(x, rank), half(y, rank))
    report["trained"] = packed_params(model)
    return report


@pytest.fixture(scope="module")
def ddp_ranks() -> list[Report]:
    return run_sections(_ddp_worker, _ddp_unbuilt_worker)


def test_ddp_trains_a_built_lazy_model_as_its_eager_twin(ddp_ranks: list[Report]) -> None:
    ranks = section(ddp_ranks, _ddp_worker)
    eager = eager_twin(conv_net)
    for r in ranks:
        assert r["warnings"] == [], r["warnings"]
        assert r["types"] == [type(m).__name__ for m in eager]
        assert_params_equal(r["built"], eager, f"rank {r['rank']} built")
        assert torch.equal(unpack(r["next_draw"]), eager.__dict__["next_draw"])
        assert_params_equal(r["wrapped"], eager, f"rank {r['rank']} wrapped")
    x, y = global_batch(CONV_INPUT)
    losses = train(eager, x, y)
    assert losses[-1] < losses[0]  # it trains
    assert_mean_losses(ranks, losses)
    for r in ranks:
        assert_params_close(r["trained"], eager, f"rank {r['rank']} after {STEPS} steps")
    assert ranks[0]["trained"] == ranks[1]["trained"], "the ranks' parameters diverged"


def _ddp_unbuilt_worker(rank: int, world: int) -> Report:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = mlp(lazy=True)
    eager_before = pack(model[4].weight)
    report: Report = {"refusal": refusal(DDP, model)}
    report["types_after"] = [type(m).__name__ for m in model]
    report["lazy_after"] = [name for name, p in model.named_parameters() if lazynn.is_lazy(p)]
    report["eager_kept"] = pack(model[4].weight) == eager_before
    # still usable: build (under the same seed, nothing drawn since), wrap, train
    lazynn.build(model, MLP_INPUT)
    report["built"] = packed_params(model)
    ddp = DDP(model)
    x, y = global_batch(MLP_INPUT)
    train(ddp, half(x, rank), half(y, rank))
    report["trained"] = packed_params(model)
    return report


def test_ddp_refuses_an_unbuilt_model_and_leaves_it_usable(ddp_ranks: list[Report]) -> None:
    ranks = section(ddp_ranks, _ddp_unbuilt_worker)
    eager = eager_twin(mlp)
    for r in ranks:
        assert_refusal(r["refusal"], [f"'{p}'" for p in MLP_UNBUILT], "DistributedDataParallel")
        assert "'4.weight'" not in r["refusal"]["message"]  # built: not named as unbuilt
        assert r["types_after"] == ["LazyLinear", "ReLU", "LazyLinear", "ReLU", "Linear"]
        assert r["lazy_after"] == MLP_UNBUILT
        assert r["eager_kept"]
        assert_params_equal(r["built"], eager, f"rank {r['rank']} built after the refusal")
    x, y = global_batch(MLP_INPUT)
    train(eager, x, y)
    for r in ranks:
        assert_params_close(r["trained"], eager, f"rank {r['rank']} after {STEPS} steps")
    assert ranks[0]["trained"] == ranks[1]["trained"], "the ranks' parameters diverged"


# --- FSDP2 ------------------------------------------------------------------------------------


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


def _fsdp_worker(rank: int, world: int) -> Report:
    """The instance form: ``build(model, ..., device="meta")``."""
    return _fsdp_run(rank, factory=False)


def _fsdp_factory_worker(rank: int, world: int) -> Report:
    """The factory form: ``build(Stack, ..., device="meta")``, each tensor's init program."""
    return _fsdp_run(rank, factory=True)


def _fsdp_run(rank: int, factory: bool) -> Report:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = _mesh()
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if factory:
            model = lazynn.build(functools.partial(Stack, lazy=True), STACK_INPUT, device="meta")
        else:
            model = Stack(lazy=True)
            lazynn.build(model, STACK_INPUT, device="meta")
        report: Report = {"on_meta": all(p.is_meta for p in model.parameters())}
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with Allocations() as allocated:
            lazynn.materialize(model, device="cpu")
    report["warnings"] = lazynn_warnings(caught)
    report["largest_allocation"] = (allocated.largest, allocated.largest_op)
    report["peak"] = allocated.peak
    report["next_draw"] = pack(torch.rand(4))
    params = dict(model.named_parameters())
    report["dtensor"] = [n for n, p in params.items() if isinstance(p, DTensor)]
    report["local_devices"] = sorted(
        {str(p.to_local().device) for p in params.values() if isinstance(p, DTensor)}
    )
    report["local"] = {n: (p.to_local().numel(), p.element_size()) for n, p in params.items()}
    report["materialized"] = {n: pack(p.full_tensor()) for n, p in params.items()}
    x, y = global_batch(STACK_INPUT)
    report["losses"] = train(model, half(x, rank), half(y, rank), STACK_LR)
    report["trained"] = {n: pack(p.full_tensor()) for n, p in model.named_parameters()}
    return report


@pytest.fixture(scope="module")
def fsdp_ranks() -> list[Report]:
    return run_sections(_fsdp_unbuilt_worker, _fsdp_worker, _fsdp_factory_worker)


@pytest.mark.parametrize(
    "worker", [_fsdp_worker, _fsdp_factory_worker], ids=["instance", "factory"]
)
def test_fsdp2_meta_build_shard_materialize_equals_eager_twin(
    fsdp_ranks: list[Report], worker: Any
) -> None:
    ranks = section(fsdp_ranks, worker)
    eager = eager_twin(Stack)
    full = dict(eager.named_parameters())
    names = list(full)
    for r in ranks:
        who = f"rank {r['rank']}"
        assert r["on_meta"], f"{who}: build(device='meta') allocated parameters"
        assert r["warnings"] == [], r["warnings"]
        assert r["dtensor"] == names, f"{who}: parameters that are not DTensors"
        assert r["local_devices"] == ["cpu"], r["local_devices"]
        # each rank allocated only its shards: about half of every parameter
        local = sum(n * size for n, size in r["local"].values())
        bound = sum(
            (math.ceil(p.numel() / WORLD) + p.numel() // p.shape[0]) * p.element_size()
            for p in full.values()
        )
        total = sum(p.numel() * p.element_size() for p in full.values())
        assert 0 < local <= bound, (local, bound, total)
        assert local < total
        biggest = max(names, key=lambda n: full[n].numel())
        assert r["local"][biggest][0] <= math.ceil(full[biggest].shape[0] / WORLD) * (
            full[biggest].numel() // full[biggest].shape[0]
        ), f"{who}: '{biggest}' is not sharded"
        # nothing materialize allocated was as big as the biggest layer ('embed.weight', 2M
        # numbers; lazynn's sharded init draws the stream in chunks of 1M: CHUNK_BYTES)
        nbytes, op = r["largest_allocation"]
        assert nbytes < full[biggest].numel() * full[biggest].element_size(), (
            f"{who}: materialize allocated {nbytes} bytes at once ({op}), a whole '{biggest}'"
        )
        # and at no time more than its shards and one chunk of draws (the model is 8.5 MB)
        assert r["peak"] <= local + CHUNK_BYTES, (who, r["peak"], local, total)
        # the gathered parameters are the eager twin's, and the stream is where it left it
        assert_params_equal(r["materialized"], eager, f"{who} materialized")
        assert torch.equal(unpack(r["next_draw"]), eager.__dict__["next_draw"]), (
            f"{who}: the random stream after materialize is not where eager construction leaves it"
        )
    x, y = global_batch(STACK_INPUT)
    losses = train(eager, x, y, STACK_LR)
    assert losses[-1] < losses[0]  # it trains
    assert_mean_losses(ranks, losses)
    for r in ranks:
        assert_params_close(r["trained"], eager, f"rank {r['rank']} after {STEPS} steps")
    assert ranks[0]["trained"] == ranks[1]["trained"], "the ranks gathered different parameters"


def _fsdp_state(module: nn.Module) -> dict[str, Any]:
    from torch.distributed._composable.contract import _get_registry
    from torch.distributed.fsdp import FSDPModule

    return {
        "fsdp_module": isinstance(module, FSDPModule),
        "type": type(module).__name__,
        "registry": sorted(_get_registry(module) or {}),
        "hooks": len(module._forward_pre_hooks) + len(module._forward_hooks),
    }


def _fsdp_unbuilt_worker(rank: int, world: int) -> Report:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    mesh = _mesh()
    torch.manual_seed(0)
    model = Stack(lazy=True)
    block = model.blocks[0]
    report: Report = {
        "block_refusal": refusal(fully_shard, block, mesh=mesh),
        "block_state": _fsdp_state(block),
        "refusal": refusal(fully_shard, model, mesh=mesh),
        "state": _fsdp_state(model),
        "lazy_after": [n for n, p in model.named_parameters() if lazynn.is_lazy(p)],
    }
    # as it was: build (nothing was drawn since construction), then shard it and train
    try:
        lazynn.build(model, STACK_INPUT)
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    except Exception as error:
        report["reshard_error"] = f"{type(error).__name__}: {error}"
        return report
    report["dtensor"] = all(isinstance(p, DTensor) for p in model.parameters())
    report["sharded"] = {n: pack(p.full_tensor()) for n, p in model.named_parameters()}
    x, y = global_batch(STACK_INPUT)
    F.cross_entropy(model(half(x, rank)), half(y, rank)).backward()
    report["grads"] = all(p.grad is not None for p in model.parameters())
    return report


def test_fsdp2_refuses_an_unbuilt_model_and_leaves_it_as_it_was(
    fsdp_ranks: list[Report],
) -> None:
    ranks = section(fsdp_ranks, _fsdp_unbuilt_worker)
    eager = eager_twin(Stack)
    lazy_names = [n for n, _ in eager.named_parameters() if not n.startswith(("norm.", "head."))]
    for r in ranks:
        # paths from the block ('up.weight') or from the model ('blocks.0.up.weight')
        assert_refusal(r["block_refusal"], ["up.weight'"], "fully_shard(block)")
        assert_refusal(r["refusal"], [f"'{p}'" for p in STACK_UNBUILT_FIRST], "fully_shard(model)")
        assert r["block_state"] == {
            "fsdp_module": False,
            "type": "Block",
            "registry": [],
            "hooks": 0,
        }
        assert r["state"] == {"fsdp_module": False, "type": "Stack", "registry": [], "hooks": 0}
        assert r["lazy_after"] == lazy_names
        assert "reshard_error" not in r, f"after the refusal, built: {r['reshard_error']}"
        assert r["dtensor"]
        assert_params_equal(r["sharded"], eager, f"rank {r['rank']} built after the refusal")
        assert r["grads"]


# --- a tie of a sharded slot and a whole one; a failing later tape (found by review) ----------


class _TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.body = lazynn.LazyLinear(16)
        self.head = nn.Linear(16, 64, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


_G = torch.Generator()


class _DrawsFromG(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.empty(500).normal_(generator=_G))
        self.l = lazynn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = lazynn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


def _edges_worker(rank: int, world: int) -> Report:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial

    report: Report = {}
    for sharded in ("head", "emb"):  # (fully_shard on one of the two tied modules)
        torch.manual_seed(0)
        model = lazynn.build(_TiedHead, (2, 5), device="meta")
        fully_shard(getattr(model, sharded), mesh=_mesh())
        lazynn.materialize(model, "cpu")
        weight = getattr(model, sharded).weight
        report[sharded] = pack(weight.full_tensor().detach())
    _G.manual_seed(3)
    torch.manual_seed(0)
    model = nn.Sequential(
        lazynn.build(_DrawsFromG, (2, 3), device="meta"),
        lazynn.build(_Plain, (2, 3), device="meta"),
    )
    meta = torch.empty(model[1].l.weight.shape, device="meta")
    model[1].l.weight = nn.Parameter(DTensor.from_local(meta, _mesh(), [Partial()]))
    before = _G.get_state()
    report["refused"] = refusal(lazynn.materialize, model, "cpu") is not None
    report["generator kept"] = torch.equal(_G.get_state(), before)
    return report


@pytest.mark.distributed
def test_a_tie_of_a_sharded_and_a_whole_slot_and_a_failing_later_tape() -> None:
    """The sharded slot of a tie takes its block of the whole value (it held uninitialized
    memory); a refusal in a later tape leaves a generator an earlier tape drew from as it was."""
    torch.manual_seed(0)
    eager = lazynn.build(_TiedHead, (2, 5)).emb.weight.detach()
    for r in section(run_sections(_edges_worker), _edges_worker):
        assert torch.equal(unpack(r["head"]), eager), r["rank"]
        assert torch.equal(unpack(r["emb"]), eager), r["rank"]
        assert r["refused"]
        assert r["generator kept"]


# --- work queued with on_build, under FSDP2 (issue 36) ---------------------------------------


class _QueuesInit(nn.Module):
    """An init that needs the built weight (``orthogonal_``: a QR of the whole matrix), a draw
    and an in-place scale, queued on a lazy layer (eager code runs it in ``__init__``)."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(8) if lazy else nn.Linear(6, 8)
        self.b = nn.Linear(8, 4)
        if lazy:
            lazynn.on_build(self.a, _queued_init)
        else:
            _queued_init(self.a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


def _queued_init(layer: nn.Module) -> None:
    nn.init.orthogonal_(layer.weight)
    with torch.no_grad():
        layer.bias.normal_()
        layer.weight.mul_(2)


def _queued_worker(rank: int, world: int) -> Report:
    from torch.distributed.fsdp import fully_shard

    report: Report = {}
    for form in ("instance", "factory"):
        torch.manual_seed(0)
        if form == "factory":
            model = lazynn.build(functools.partial(_QueuesInit, True), (2, 6), device="meta")
        else:
            model = _QueuesInit(True)
            lazynn.build(model, (2, 6), device="meta")
        fully_shard(model.a, mesh=_mesh())
        fully_shard(model, mesh=_mesh())
        lazynn.materialize(model, "cpu")
        report[form] = {n: pack(p.full_tensor()) for n, p in model.named_parameters()}
        report[form + " next draw"] = pack(torch.rand(3))
    return report


def test_work_queued_with_on_build_is_exact_on_each_ranks_shards() -> None:
    """In both forms, the queued work runs in the build on meta, its steps part of the init
    programs: each rank's shards take the eager values (in the instance form it ran on the
    ranks' shards at materialize before, with other values and plain parameters)."""
    torch.manual_seed(0)
    eager = _QueuesInit(False)
    after = torch.rand(3)
    for r in section(run_sections(_queued_worker), _queued_worker):
        for form in ("instance", "factory"):
            for name, value in eager.named_parameters():
                assert torch.equal(unpack(r[form][name]), value.detach()), (form, name)
            assert torch.equal(unpack(r[form + " next draw"]), after), form
