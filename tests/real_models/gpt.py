"""GPT, written from nanoGPT's ``model.py``: the head tied into the embedding (or the other way,
as Hugging Face GPT-2), a causal mask buffer, ``normal_``, depth-scaled ``c_proj``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .kit import Kit


class CausalSelfAttention(nn.Module):
    def __init__(self, kit: Kit, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.c_attn = kit.Linear(n_embd, 3 * n_embd)
        self.c_proj = kit.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("bias", mask.view(1, 1, block_size, block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class GPTMLP(nn.Module):
    def __init__(self, kit: Kit, n_embd: int) -> None:
        super().__init__()
        self.c_fc = kit.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = kit.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, kit: Kit, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln_1 = kit.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(kit, n_embd, n_head, block_size)
        self.ln_2 = kit.LayerNorm(n_embd)
        self.mlp = GPTMLP(kit, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self,
        kit: Kit,
        vocab_size: int = 64,
        block_size: int = 16,
        n_layer: int = 2,
        n_head: int = 4,
        n_embd: int = 32,
        hf_tie: bool = False,
    ) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(block_size, n_embd),
                "drop": nn.Dropout(0.0),
                "h": nn.ModuleList(
                    GPTBlock(kit, n_embd, n_head, block_size) for _ in range(n_layer)
                ),
                "ln_f": kit.LayerNorm(n_embd),
            }
        )
        self.lm_head = kit.Linear(n_embd, vocab_size, bias=False)
        if hf_tie:
            self.lm_head.weight = self.transformer.wte.weight
        else:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
