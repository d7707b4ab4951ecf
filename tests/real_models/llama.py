"""LLaMA, written from Meta's ``llama/model.py`` and torchtitan's init: RMSNorm, ``freqs_cis`` (a
plain complex attribute), depth-scaled ``trunc_normal_``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kit import Kit


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class LlamaAttention(nn.Module):
    def __init__(self, kit: Kit, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = kit.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = kit.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wv = kit.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wo = kit.Linear(n_heads * self.head_dim, dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.n_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, t, -1))


class LlamaFeedForward(nn.Module):
    def __init__(self, kit: Kit, dim: int, hidden_dim: int, multiple_of: int = 16) -> None:
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = kit.Linear(dim, hidden_dim, bias=False)
        self.w2 = kit.Linear(hidden_dim, dim, bias=False)
        self.w3 = kit.Linear(dim, hidden_dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, kit: Kit, layer_id: int, dim: int, n_heads: int, n_layers: int) -> None:
        super().__init__()
        self.attention = LlamaAttention(kit, dim, n_heads)
        self.feed_forward = LlamaFeedForward(kit, dim, 4 * dim)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)
        init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5  # torchtitan's depth init
        self.attention.init_weights(init_std)
        self.feed_forward.init_weights(init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(
        self,
        kit: Kit,
        vocab_size: int = 64,
        dim: int = 32,
        n_layers: int = 2,
        n_heads: int = 4,
        max_seq_len: int = 16,
    ) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            LlamaBlock(kit, i, dim, n_heads, n_layers) for i in range(n_layers)
        )
        self.norm = RMSNorm(dim)
        self.output = kit.Linear(dim, vocab_size, bias=False)
        # Meta's code keeps it as a plain attribute, not a buffer
        self.freqs_cis = precompute_freqs_cis(dim // n_heads, max_seq_len * 2)
        nn.init.normal_(self.tok_embeddings.weight)
        final_std = dim**-0.5
        nn.init.trunc_normal_(
            self.output.weight, mean=0.0, std=final_std, a=-3 * final_std, b=3 * final_std
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[:t].to(h.device)
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h)).float()
