"""A torchtitan-style trainer without a seed checkpoint: every rank gets one eager construction's
numbers.

    python examples/titan.py           # 2 processes on this machine (gloo, CPU)

The model is written the way torchtitan writes its llama3 (``torchtitan/models/llama3/model``):
plain ``torch.nn`` with every size given, ``nn.RMSNorm``, a ``freqs_cis`` RoPE buffer computed
in ``__init__`` and again in ``init_weights()``, and torchtitan's ``init_weights()``
(``normal_`` embedding, ``trunc_normal_`` linears with a depth-scaled std for each block's
output projections, the norms' ``reset_parameters()``, a cut-off ``trunc_normal_`` output
layer). Nothing in it is lazy, and nothing in it knows lazynn.

The reference is one eager construction in one process (the parent):
``torch.manual_seed(0); m = Transformer(args); m.init_weights()``. Each rank then runs:

1. lazynn: ``lazynn.build(lambda: make(args), device="meta")`` (``make`` constructs and calls
   ``init_weights()``), shards (FSDP2 as torchtitan's ``apply_fsdp`` does, or torchtitan's
   tensor-parallel plan), then ``lazynn.materialize(model, "cpu")``: every parameter and
   buffer equals the reference bit for bit, and each rank holds its own shards only. The
   FSDP2 model then trains 3 steps, against the reference trained in one process.
2. torchtitan's own flow: construct on meta, ``fully_shard``, ``to_empty(device="cpu")``,
   ``init_weights()`` under the same seed: the script counts the parameters that differ from
   the reference, and from torchtitan's own single-process initialization (the numbers its
   seed checkpoint holds), which is why torchtitan needs seed checkpoints.

docs/when-to-build.md ("Replacing seed checkpoints") explains each step. The script prints a
short report (one line per rank and flow) and exits with status 1 if a lazynn flow gives any
rank a number that differs from the reference.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from local_ranks import run_local_ranks
from torch import nn

import lazynn


@dataclass(frozen=True)
class ModelArgs:
    """A small llama3: torchtitan's ``TransformerModelArgs`` fields, at toy sizes."""

    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256
    multiple_of: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 16
    depth_init: bool = True


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    """The RoPE table, (end, dim // 2) complex64 (Llama 3's frequency scaling left out)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """xq (B, T, H, D) and xk (B, T, Hkv, D) rotated by the first T rows of freqs_cis."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, T, Hkv, D) -> (B, T, Hkv * n_rep, D), each key/value head repeated n_rep times."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    x = x.unsqueeze(3).expand(bs, slen, n_kv_heads, n_rep, head_dim)
    return x.reshape(bs, slen, n_kv_heads * n_rep, head_dim)


class Attention(nn.Module):
    """Grouped-query attention with RoPE, (B, T, dim) -> (B, T, dim). The heads are read from
    the local width (``view(..., -1, head_dim)``), so a tensor-parallel rank runs its own."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))  # type: ignore[no-any-return]


class FeedForward(nn.Module):
    """SwiGLU, (B, T, dim) -> (B, T, dim), its hidden size as torchtitan computes it."""

    def __init__(self, dim: int, hidden_dim: int, multiple_of: int) -> None:
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # type: ignore[no-any-return]


class TransformerBlock(nn.Module):
    """A pre-norm block; its output projections' std shrinks with depth (``depth_init``)."""

    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.weight_init_std = 0.02 / (2 * depth) ** 0.5

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))  # type: ignore[no-any-return]


class Transformer(nn.Module):
    """Token ids (B, T) int64 -> logits (B, T, vocab_size)."""

    freqs_cis: torch.Tensor

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def init_weights(self, buffer_device: torch.device | str | None = None) -> None:
        """torchtitan's init: the constructors' own draws are all overwritten here."""
        buffer_device = buffer_device or self.freqs_cis.device
        with torch.device(buffer_device):
            self.freqs_cis = self._precompute_freqs_cis()
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()  # type: ignore[operator]
        self.norm.reset_parameters()
        final_out_std = self.args.dim**-0.5
        cutoff_factor = 3
        nn.init.trunc_normal_(
            self.output.weight,
            mean=0.0,
            std=final_out_std,
            a=-cutoff_factor * final_out_std,
            b=cutoff_factor * final_out_std,
        )

    def _precompute_freqs_cis(self) -> torch.Tensor:
        a = self.args
        return precompute_freqs_cis(a.dim // a.n_heads, a.max_seq_len, a.rope_theta)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))  # type: ignore[no-any-return]


ARGS = ModelArgs()
SEED = 0


def make(args: ModelArgs) -> Transformer:
    """The whole initialization, as one process runs it: construct, then ``init_weights()``.

    The factory given to ``lazynn.build`` includes ``init_weights()`` so that its draws are
    recorded too, each at its place in the random stream (after the constructors' own:
    ``nn.Linear``'s ``kaiming_uniform_``, ``nn.Embedding``'s ``normal_``), and replayed by
    ``materialize`` on each rank's shards exactly. Called after sharding instead, as
    torchtitan does, ``init_weights()`` runs on DTensors, which draw per shard."""
    model = Transformer(args)
    model.init_weights()
    return model


def make_reseeded(args: ModelArgs) -> Transformer:
    """torchtitan's single-process numbers (what its seed checkpoint holds): there the model
    is constructed on meta, which draws nothing, and ``init_weights()`` draws from the seed."""
    model = Transformer(args)
    torch.manual_seed(SEED)
    model.init_weights()
    return model


def titan_single_process(args: ModelArgs) -> Transformer:
    """How torchtitan makes a seed checkpoint: one process, meta, ``to_empty``, init."""
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    torch.manual_seed(SEED)
    with torch.no_grad():
        model.init_weights(buffer_device="cpu")
    return model


def apply_fsdp(model: Transformer) -> None:
    """torchtitan's ``apply_fsdp``: the embedding, each block, norm and output together, root."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.tok_embeddings)
    for block in model.layers.values():
        fully_shard(block)
    fully_shard([model.norm, model.output])
    fully_shard(model)


def apply_tp(model: Transformer, mesh: Any) -> None:
    """torchtitan's ``apply_tp`` (without loss parallel): vocabulary-sharded embedding,
    sequence-parallel norms, column- then row-wise attention and feed-forward."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    root_plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    parallelize_module(model, mesh, root_plan)
    for block in model.layers.values():
        block_plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        parallelize_module(block, mesh, block_plan)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's block of a DTensor (a plain tensor is its own)."""
    return t.to_local() if hasattr(t, "to_local") else t


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from every rank (a plain tensor is whole)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (``freqs_cis`` too, which is not in the state dict), whole."""
    named = dict(model.named_parameters()) | dict(model.named_buffers())
    return {name: whole(t.detach()).clone() for name, t in named.items()}


def differing(model: nn.Module, reference: dict[str, torch.Tensor]) -> list[str]:
    """The names of the parameters and buffers whose whole tensor is not ``reference``'s."""
    mine = tensors(model)
    assert mine.keys() == reference.keys(), (mine.keys(), reference.keys())
    return [name for name, t in mine.items() if not torch.equal(t, reference[name])]


def held(model: nn.Module) -> int:
    """The bytes of parameters this rank holds."""
    return sum(local(p).numel() * p.element_size() for p in model.parameters())


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch of 4 sequences of token ids, and the next-token targets."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, ARGS.vocab_size, (4, ARGS.max_seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 3) -> list[float]:
    """AdamW steps on (x, y); the losses, averaged over the ranks in a distributed job."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
            mean /= dist.get_world_size()
        losses.append(mean.item())
    return losses


@dataclass(frozen=True)
class Reference:
    """What one process gives: every tensor, and its random generator's state after."""

    tensors: dict[str, torch.Tensor]
    rng: torch.Tensor


def reference(factory: Any) -> Reference:
    """Run ``factory`` in this process under the seed; its tensors and the generator's end."""
    torch.manual_seed(SEED)
    model = factory(ARGS)
    return Reference(tensors(model), torch.get_rng_state())


def lazynn_flow(factory: Any, shard: Any, want: Reference) -> tuple[nn.Module, dict[str, Any]]:
    """lazynn's recipe: record ``factory`` on meta, ``shard`` the model, materialize it; the
    model, and how it compares with ``want``."""
    torch.manual_seed(SEED)
    model = lazynn.build(lambda: factory(ARGS), device="meta")
    shard(model)
    lazynn.materialize(model, "cpu")
    return model, {
        "differ": differing(model, want.tensors),
        "held": held(model),
        "rng": torch.equal(torch.get_rng_state(), want.rng),
    }


def titan_flow(eager: Reference, titan: Reference, world: int) -> dict[str, Any]:
    """torchtitan's recipe on this rank: meta, FSDP2, ``to_empty``, ``init_weights()``."""
    with torch.device("meta"):
        model = Transformer(ARGS)
    apply_fsdp(model)
    model.to_empty(device="cpu")
    torch.manual_seed(SEED)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model.init_weights(buffer_device="cpu")
    # On a CPU mesh each rank draws its shard from the start of its own stream: count the
    # random parameters whose every rank's shard holds rank 0's numbers.
    shards = {name: whole(p.detach()).chunk(world) for name, p in model.named_parameters()}
    repeated = [
        name
        for name, (first, *others) in shards.items()
        if first.std() > 0 and all(torch.equal(first, other) for other in others)
    ]
    return {
        "differ": differing(model, eager.tensors),
        "differ_titan": differing(model, titan.tensors),
        "repeated": repeated,
        "warned": sorted({str(w.message) for w in caught}),
    }


def worker(
    rank: int, world: int, port: int, results: Any, eager: Reference, titan: Reference
) -> None:
    """One rank: each flow, against the parent's references (``eager``: one eager construction;
    ``titan``: torchtitan's single-process initialization, its seed checkpoint's numbers)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        report: dict[str, Any] = {"rank": rank}
        # 1. lazynn with FSDP2 as torchtitan applies it, then 3 training steps on this
        # rank's half of the batch.
        model, report["fsdp"] = lazynn_flow(make, apply_fsdp, eager)
        x, y = batch()
        rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        report["fsdp"]["losses"] = train(model, x[rows], y[rows])
        # 1. lazynn with torchtitan's tensor-parallel plan.
        _, report["tp"] = lazynn_flow(make, functools.partial(apply_tp, mesh=mesh), eager)
        # 1. lazynn, the factory reseeding before init_weights(): torchtitan's numbers.
        _, report["reseeded"] = lazynn_flow(make_reseeded, apply_fsdp, titan)
        # 2. torchtitan's own flow.
        report["titan"] = titan_flow(eager, titan, world)
        results.put(report)
    finally:
        dist.destroy_process_group()


def main(world: int = 2) -> bool:
    """Run every flow on ``world`` local processes and print the report; True if every lazynn
    flow gives every rank its reference's numbers."""
    eager = reference(make)  # one eager construction, in this one process
    titan = reference(titan_single_process)
    full = sum(t.numel() * t.element_size() for n, t in eager.tensors.items() if n != "freqs_cis")
    count = len(eager.tensors)
    x, y = batch()
    torch.manual_seed(SEED)
    single = train(make(ARGS), x, y)  # the one-process run the FSDP2 losses are compared with

    reports = run_local_ranks(functools.partial(worker, eager=eager, titan=titan), world)
    exact = True
    for r in reports:
        rank = r["rank"]
        for key, what, against in (
            ("fsdp", "lazynn + FSDP2", "eager"),
            ("tp", "lazynn + TP", "eager"),
            ("reseeded", "lazynn + FSDP2, reseeded factory", "torchtitan's one-process init"),
        ):
            f = r[key]
            exact &= not f["differ"] and f["rng"]
            line = (
                f"rank {rank}: {what}: {count - len(f['differ'])} of {count} tensors equal "
                f"{against}; same generator after: {f['rng']}; "
                f"holds {f['held'] / 2**10:.0f} KiB of {full / 2**10:.0f} KiB"
            )
            if "losses" in f:
                line += (
                    f"; losses {', '.join(f'{v:.4f}' for v in f['losses'])} "
                    f"(one process: {', '.join(f'{v:.4f}' for v in single)})"
                )
            if f["differ"]:
                line += f"; DIFFER: {', '.join(f['differ'])}"
            print(line)
        t = r["titan"]
        print(
            f"rank {rank}: torchtitan (meta, fully_shard, to_empty, init_weights): "
            f"{len(t['differ'])} of {count} tensors differ from eager, "
            f"{len(t['differ_titan'])} from torchtitan's one-process init; "
            f"{len(t['repeated'])} repeat rank 0's shard on every rank"
            + "".join(f"; torch warned: {w}" for w in t["warned"])
        )
    print(f"lazynn equals the reference on every rank: {exact}")
    return exact


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(0 if main() else 1)
