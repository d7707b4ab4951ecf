"""ViT, written from timm's ``vision_transformer.py``: ``cls_token`` and ``pos_embed`` made after
the patch embedding, ``trunc_normal_``, ``apply(_init_weights)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .kit import Kit


class PatchEmbed(nn.Module):
    def __init__(self, kit: Kit, img_size: int, patch: int, in_chans: int, dim: int) -> None:
        super().__init__()
        self.num_patches = (img_size // patch) ** 2
        self.proj = kit.Conv2d(in_chans, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, kit: Kit, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = kit.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = kit.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, kit: Kit, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = kit.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = kit.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, kit: Kit, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = kit.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(kit, dim, num_heads)
        self.norm2 = kit.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(kit, dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(
        self,
        kit: Kit,
        img_size: int = 32,
        patch: int = 8,
        in_chans: int = 3,
        num_classes: int = 10,
        dim: int = 32,
        depth: int = 2,
        heads: int = 4,
    ) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(kit, img_size, patch, in_chans, dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.pos_drop = nn.Dropout(p=0.0)
        self.blocks = nn.Sequential(*[ViTBlock(kit, dim, heads) for _ in range(depth)])
        self.norm = kit.LayerNorm(dim, eps=1e-6)
        self.head = kit.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.norm(self.blocks(self.pos_drop(x + self.pos_embed)))
        return self.head(x[:, 0])
