"""Models shaped like the ones people use, each written once from its published code, init
code included, and constructed two ways: eager (``torch.nn``) or lazy (the same code with its
sized constructors swapped for lazynn's).

Each model takes a layer kit, :data:`EAGER` or :data:`LAZY`. The kit's constructors take the
eager arguments; the lazy kit drops the size the input tells (``Linear(i, o)`` becomes
``lazynn.LazyLinear(o)``). Everything else (init loops, tensors a parent creates, buffers
computed in ``__init__``, ties) is the model's own code, run unchanged in both:

===========  =====================================================  =========================
model        written from                                           what its init code does
===========  =====================================================  =========================
ResNet       torchvision ``resnet.py`` (Bottleneck)                  ``kaiming_normal_(fan_out)``
                                                                     loop, zero-init residual BN
ViT          timm / Google ViT (``vision_transformer.py``)           ``cls_token`` and
                                                                     ``pos_embed`` made after the
                                                                     patch embedding,
                                                                     ``trunc_normal_``,
                                                                     ``apply(_init_weights)``
ConvNeXt     facebookresearch ``convnext.py``                         layer scale ``gamma``,
                                                                     channels-first LayerNorm,
                                                                     ``trunc_normal_``, head
                                                                     ``.data.mul_``
GPT          nanoGPT ``model.py``                                    head tied into the
                                                                     embedding
                                                                     (``wte.weight =
                                                                     lm_head.weight``), causal
                                                                     mask buffer, ``normal_``,
                                                                     depth-scaled ``c_proj``
GPT (HF)     the same, tied the other way (``lm_head.weight =        as GPT
             wte.weight``), as Hugging Face GPT-2
LLaMA        Meta ``llama/model.py`` + torchtitan's init              RMSNorm, ``freqs_cis`` (a
                                                                     plain complex attribute),
                                                                     depth-scaled
                                                                     ``trunc_normal_``
U-Net        milesial ``unet_parts.py``, the paper's init             ``normal_(0, sqrt(2 / (k *
                                                                     k * in_channels)))``: reads
                                                                     an inferred size
LSTM LM      pytorch/examples ``word_language_model``                decoder tied to the encoder,
                                                                     ``uniform_``, ``zeros_``
===========  =====================================================  =========================

``MODELS`` maps a name to a :class:`RealModel`: a factory of the model for a kit, and example
inputs (shapes and dtypes, for ``lazynn.build``; real tensors from a private generator).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import lazynn


# --- the two kits -----------------------------------------------------------------------------
class Kit:
    """The sized constructors a model uses, eager."""

    lazy = False

    def Linear(self, i: int, o: int, **kw: Any) -> nn.Module:
        return nn.Linear(i, o, **kw)

    def Conv2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.Conv2d(i, o, k, **kw)

    def ConvTranspose2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return nn.ConvTranspose2d(i, o, k, **kw)

    def BatchNorm2d(self, c: int, **kw: Any) -> nn.Module:
        return nn.BatchNorm2d(c, **kw)

    def LayerNorm(self, d: int, **kw: Any) -> nn.Module:
        return nn.LayerNorm(d, **kw)

    def LSTM(self, i: int, h: int, n: int, **kw: Any) -> nn.Module:
        return nn.LSTM(i, h, n, **kw)


class LazyKit(Kit):
    """The same constructors, lazy: the size the input tells is dropped."""

    lazy = True

    def Linear(self, i: int, o: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLinear(o, **kw)

    def Conv2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConv2d(o, k, **kw)

    def ConvTranspose2d(self, i: int, o: int, k: Any, **kw: Any) -> nn.Module:
        return lazynn.LazyConvTranspose2d(o, k, **kw)

    def BatchNorm2d(self, c: int, **kw: Any) -> nn.Module:
        return lazynn.LazyBatchNorm2d(**kw)

    def LayerNorm(self, d: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLayerNorm(**kw)

    def LSTM(self, i: int, h: int, n: int, **kw: Any) -> nn.Module:
        return lazynn.LazyLSTM(h, n, **kw)


EAGER, LAZY = Kit(), LazyKit()


# --- ResNet (torchvision) -----------------------------------------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self,
        kit: Kit,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        width = planes
        self.conv1 = kit.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = kit.BatchNorm2d(width)
        self.conv2 = kit.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = kit.BatchNorm2d(width)
        self.conv3 = kit.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = kit.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(
        self,
        kit: Kit,
        layers: tuple[int, ...] = (1, 1, 1, 1),
        width: int = 8,
        num_classes: int = 10,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        self.kit = kit
        self.inplanes = width
        self.conv1 = kit.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = kit.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = kit.Linear(width * 8 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck) and m.bn3.weight is not None:
                    nn.init.constant_(m.bn3.weight, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        kit, downsample = self.kit, None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                kit.Conv2d(
                    self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False
                ),
                kit.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(kit, self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(kit, self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- ViT (timm) -----------------------------------------------------------------------------------
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


# --- ConvNeXt (facebookresearch) ------------------------------------------------------------------
class ChannelsFirstLayerNorm(nn.Module):
    """ConvNeXt's LayerNorm for (N, C, H, W): its own class, sized by the config."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, kit: Kit, dim: int, layer_scale_init_value: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = kit.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = kit.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = kit.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = kit.Linear(4 * dim, dim)
        self.gamma = (
            nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True)
            if layer_scale_init_value > 0
            else None
        )
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x
        x = self.dwconv(x).permute(0, 2, 3, 1)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        return inp + self.drop_path(x.permute(0, 3, 1, 2))


class ConvNeXt(nn.Module):
    def __init__(
        self,
        kit: Kit,
        in_chans: int = 3,
        num_classes: int = 10,
        depths: tuple[int, ...] = (1, 1),
        dims: tuple[int, ...] = (16, 32),
        head_init_scale: float = 0.5,
    ) -> None:
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        stem = nn.Sequential(
            kit.Conv2d(in_chans, dims[0], 4, stride=4), ChannelsFirstLayerNorm(dims[0])
        )
        self.downsample_layers.append(stem)
        for i in range(len(dims) - 1):
            self.downsample_layers.append(
                nn.Sequential(
                    ChannelsFirstLayerNorm(dims[i]), kit.Conv2d(dims[i], dims[i + 1], 2, stride=2)
                )
            )
        self.stages = nn.ModuleList(
            nn.Sequential(*[ConvNeXtBlock(kit, dims[i]) for _ in range(depths[i])])
            for i in range(len(dims))
        )
        self.norm = kit.LayerNorm(dims[-1], eps=1e-6)
        self.head = kit.Linear(dims[-1], num_classes)
        self.apply(self._init_weights)
        self.head.weight.data.mul_(head_init_scale)
        self.head.bias.data.mul_(head_init_scale)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for down, stage in zip(self.downsample_layers, self.stages, strict=True):
            x = stage(down(x))
        return self.head(self.norm(x.mean([-2, -1])))


# --- GPT (nanoGPT) --------------------------------------------------------------------------------
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


# --- LLaMA (Meta's model.py, torchtitan's init) ---------------------------------------------------
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


# --- U-Net (milesial, the paper's init) -----------------------------------------------------------
class DoubleConv(nn.Sequential):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__(
            kit.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            kit.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            kit.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            kit.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__(nn.MaxPool2d(2), DoubleConv(kit, in_channels, out_channels))


class Up(nn.Module):
    def __init__(self, kit: Kit, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = kit.ConvTranspose2d(in_channels, in_channels // 2, 2, stride=2)
        self.conv = DoubleConv(kit, in_channels, out_channels)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        x1 = self.up(x1)
        dy, dx = x2.size(2) - x1.size(2), x2.size(3) - x1.size(3)
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, kit: Kit, n_channels: int = 1, n_classes: int = 2, base: int = 8) -> None:
        super().__init__()
        self.inc = DoubleConv(kit, n_channels, base)
        self.down1 = Down(kit, base, base * 2)
        self.down2 = Down(kit, base * 2, base * 4)
        self.up1 = Up(kit, base * 4, base * 2)
        self.up2 = Up(kit, base * 2, base)
        self.outc = kit.Conv2d(base, n_classes, 1)
        # the paper: "a Gaussian distribution with a standard deviation of sqrt(2/N), where N
        # denotes the number of incoming nodes of one neuron"
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.in_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


# --- LSTM language model (pytorch/examples) -------------------------------------------------------
class RNNModel(nn.Module):
    def __init__(
        self,
        kit: Kit,
        ntoken: int = 50,
        ninp: int = 16,
        nhid: int = 16,
        nlayers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = kit.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = kit.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid, self.nlayers = nhid, nlayers

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(
        self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden


# --- the table ---------------------------------------------------------------------------------
def _images(*shape: int) -> Callable[[], tuple[Any, ...]]:
    return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(1)),)


def _tokens(vocab: int, *shape: int) -> Callable[[], tuple[Any, ...]]:
    return lambda: (torch.randint(vocab, shape, generator=torch.Generator().manual_seed(1)),)


def _lstm_inputs() -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    hidden = (torch.zeros(2, 3, 16), torch.zeros(2, 3, 16))
    return (torch.randint(50, (5, 3), generator=g), hidden)


@dataclass(frozen=True)
class RealModel:
    """A model: ``make(kit)`` constructs it; ``inputs()`` real example inputs."""

    make: Callable[[Kit], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    #: whether the instance form (``make(LAZY)``, no factory) can construct it: its init code
    #: uses only initializers that wait for the build
    instance: bool = True

    def factory(self, kit: Kit) -> Callable[[], nn.Module]:
        return lambda: self.make(kit)


MODELS: dict[str, RealModel] = {
    "resnet": RealModel(lambda kit: ResNet(kit), _images(2, 3, 32, 32), instance=False),
    "vit": RealModel(lambda kit: ViT(kit), _images(2, 3, 32, 32)),
    "convnext": RealModel(lambda kit: ConvNeXt(kit), _images(2, 3, 32, 32), instance=False),
    # (its head is tied into an eager embedding, which meets the unbuilt placeholder first)
    "gpt": RealModel(lambda kit: GPT(kit), _tokens(64, 2, 16), instance=False),
    "gpt_hf_tie": RealModel(lambda kit: GPT(kit, hf_tie=True), _tokens(64, 2, 16)),
    "llama": RealModel(lambda kit: Llama(kit), _tokens(64, 2, 16)),
    "unet": RealModel(lambda kit: UNet(kit), _images(2, 1, 32, 32), instance=False),
    "lstm_lm": RealModel(lambda kit: RNNModel(kit), _lstm_inputs),
}


def every_tensor(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a model holds, by name: parameters, buffers (non-persistent too) and
    tensors kept as plain attributes (``freqs_cis``); a tied tensor under each name."""
    found: dict[str, torch.Tensor] = {}
    for path, module in model.named_modules():
        prefix = f"{path}." if path else ""
        for name, tensor in (*module._parameters.items(), *module._buffers.items()):
            if tensor is not None:
                found[prefix + name] = tensor
        for name, value in module.__dict__.items():
            if isinstance(value, torch.Tensor):
                found[prefix + name] = value
    return found
