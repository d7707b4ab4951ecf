"""Reference models, each written twice: eager (explicit sizes) and lazy (sizes inferred).

Every pair has the same structure: the same attribute names, registered in the same order, and
one shared ``forward``. The eager class constructs its layers in registration order, so under one
seed ``lazynn.build(LazyX(...), example)`` must give parameters bit-for-bit equal to ``X(...)``.
Only torch's default layer initialization is used (no custom init loops in ``__init__``: they
would touch the lazy twin's placeholders before the build).

================  =======================  ===============================  =====================
model             input                    output                           lazy twin
================  =======================  ===============================  =====================
``MLP``           ``(N, *)`` float         ``(N, num_classes)`` logits      fully lazy
``CNN``           ``(N, 3, 32, 32)``       ``(N, num_classes)`` logits      fully lazy
``ResNet50``      ``(N, 3, 224, 224)``     ``(N, num_classes)`` logits      fully lazy
``GPT``           ``(N, T)`` token ids     ``(N, T, vocab_size)`` logits    mixed lazy/eager
``LSTMTagger``    ``(N, T)`` token ids     ``(N, T, num_tags)`` logits      mixed lazy/eager
``UNet``          ``(N, 1, 64, 64)``       ``(N, out_channels, 64, 64)``    fully lazy
``LazyLlama``     ``(N, T)`` token ids     ``(N, T, vocab_size)`` logits    lazy only, mixed
================  =======================  ===============================  =====================

``GPT``, ``LSTMTagger`` and ``LazyLlama`` mix lazy and eager layers on purpose, as ported code
often does: their ``Embedding`` (which has no lazy version: its sizes are not the input's), and
their ``LayerNorm``, ``RMSNorm`` and ``LSTM`` (which lazynn has lazy versions of,
``LazyLayerNorm``, ``LazyRMSNorm``, ``LazyLSTM``), stay eager; their eager layers draw random
numbers at construction, their lazy ones at the build. Two models call layers in an order other
than their construction order, also on purpose: ``UNet`` (its ``upconvs`` and ``decoder`` lists
are called interleaved) and ``LazyLlama`` (its SwiGLU registers ``w1, w2, w3`` and calls ``w1,
w3, w2``): a plain first call builds them with other weights than construction order gives;
``lazynn.build`` replays construction order.

What a plain first call ``LazyX()(x)`` gives under the seed of ``X()``, for reference: ``UNet``
differs; ``MLP`` and ``CNN`` differ in training mode (their dropout draws random numbers between
two builds) and equal in eval mode; ``ResNet50`` equals. ``GPT`` and ``LSTMTagger``, though mixed,
equal too (with the default ``dropout=0.0``): each eager layer that draws random numbers
(``Embedding``, ``LSTM``) comes before every lazy one, and ``LayerNorm`` draws none.

``REFERENCE`` maps a name to ``(eager_factory, lazy_factory, example_input_factory)`` with small
configurations (construction and one forward well under a second on a 2-core CPU); ``FULL`` has
the real sizes, for benchmarks; ``LAZY_ONLY`` has the LLaMA configurations. An example input
factory takes an optional ``device`` (default: the current default device, so it gives a meta
tensor under ``with torch.device("meta"):``) and draws from its own generator, never from the
global RNG.

>>> import torch
>>> eager, lazy, example = REFERENCE["cnn"]
>>> model = lazy()
>>> model(example()).shape == eager()(example()).shape
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from lazynn import LazyBatchNorm2d, LazyConv2d, LazyConvTranspose2d, LazyLinear

__all__ = [
    "CNN",
    "FULL",
    "GPT",
    "LAZY_ONLY",
    "MLP",
    "REFERENCE",
    "ExampleInput",
    "LSTMTagger",
    "LazyCNN",
    "LazyGPT",
    "LazyLSTMTagger",
    "LazyLlama",
    "LazyMLP",
    "LazyResNet50",
    "LazyUNet",
    "Reference",
    "ResNet50",
    "UNet",
    "lazy_llama",
    "llama_7b",
    "llama_70b",
]


# ==============================================================================================
# 1. MLP
# ==============================================================================================
class _MLPForward(nn.Module):
    flatten: nn.Module
    fc1: nn.Module
    fc2: nn.Module
    fc3: nn.Module
    act: nn.Module
    drop: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)
        x = self.drop(self.act(self.fc1(x)))
        x = self.drop(self.act(self.fc2(x)))
        return self.fc3(x)  # type: ignore[no-any-return]


class MLP(_MLPForward):
    """Flatten, then three ``Linear`` layers with ReLU and Dropout between them.

    Input: ``(N, *)`` with ``in_features`` elements per sample (MNIST: ``(N, 1, 28, 28)``).
    Output: ``(N, num_classes)`` logits.
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden: tuple[int, int] = (512, 256),
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(in_features, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], num_classes)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)


class LazyMLP(_MLPForward):
    """:class:`MLP` with every input size inferred (no ``in_features``). Fully lazy."""

    def __init__(
        self, hidden: tuple[int, int] = (512, 256), num_classes: int = 10, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = LazyLinear(hidden[0])
        self.fc2 = LazyLinear(hidden[1])
        self.fc3 = LazyLinear(num_classes)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)


# ==============================================================================================
# 2. CNN
# ==============================================================================================
class _CNNForward(nn.Module):
    features: nn.Module
    flatten: nn.Module
    fc1: nn.Module
    act: nn.Module
    drop: nn.Module
    fc2: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(self.features(x))
        return self.fc2(self.drop(self.act(self.fc1(x))))  # type: ignore[no-any-return]


class CNN(_CNNForward):
    """Conv-BatchNorm-ReLU-MaxPool blocks, then a two-layer linear head.

    Input: ``(N, in_channels, image_size, image_size)``, default ``(N, 3, 32, 32)``; each block
    halves the image, so ``image_size`` must be divisible by ``2 ** len(channels)``.
    Output: ``(N, num_classes)`` logits. The eager head needs ``image_size`` to size ``fc1``:
    the lazy twin does not.
    """

    def __init__(
        self,
        in_channels: int = 3,
        image_size: int = 32,
        channels: Sequence[int] = (64, 128, 256),
        hidden: int = 512,
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        previous = in_channels
        for width in channels:
            blocks += [
                nn.Conv2d(previous, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            previous = width
        self.features = nn.Sequential(*blocks)
        self.flatten = nn.Flatten()
        side = image_size // 2 ** len(channels)
        self.fc1 = nn.Linear(previous * side * side, hidden)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, num_classes)


class LazyCNN(_CNNForward):
    """:class:`CNN` with every input size inferred (any image size). Fully lazy."""

    def __init__(
        self,
        channels: Sequence[int] = (64, 128, 256),
        hidden: int = 512,
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for width in channels:
            blocks += [
                LazyConv2d(width, 3, padding=1, bias=False),
                LazyBatchNorm2d(),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
        self.features = nn.Sequential(*blocks)
        self.flatten = nn.Flatten()
        self.fc1 = LazyLinear(hidden)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = LazyLinear(num_classes)


# ==============================================================================================
# 3. ResNet-50
# ==============================================================================================
_EXPANSION = 4  # a bottleneck block's output has 4x its inner width


class _BottleneckForward(nn.Module):
    conv1: nn.Module
    bn1: nn.Module
    conv2: nn.Module
    bn2: nn.Module
    conv3: nn.Module
    bn3: nn.Module
    relu: nn.Module
    downsample: nn.Module | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)  # type: ignore[no-any-return]


class Bottleneck(_BottleneckForward):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv), as torchvision's, same names.

    Input ``(N, in_channels, H, W)``, output ``(N, 4 * planes, H / stride, W / stride)``.
    The ``downsample`` branch (1x1 conv + BatchNorm) is constructed here, after ``bn3``, so
    construction order is registration order (torchvision constructs it before the block).
    """

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * _EXPANSION
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )


class LazyBottleneck(_BottleneckForward):
    """:class:`Bottleneck` with ``in_channels`` inferred; ``downsample`` says if it has the
    projection branch (the first block of each stage does)."""

    def __init__(self, planes: int, stride: int = 1, downsample: bool = False) -> None:
        super().__init__()
        out_channels = planes * _EXPANSION
        self.conv1 = LazyConv2d(planes, 1, bias=False)
        self.bn1 = LazyBatchNorm2d()
        self.conv2 = LazyConv2d(planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = LazyBatchNorm2d()
        self.conv3 = LazyConv2d(out_channels, 1, bias=False)
        self.bn3 = LazyBatchNorm2d()
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if downsample:
            self.downsample = nn.Sequential(
                LazyConv2d(out_channels, 1, stride=stride, bias=False), LazyBatchNorm2d()
            )


class _ResNetForward(nn.Module):
    conv1: nn.Module
    bn1: nn.Module
    relu: nn.Module
    maxpool: nn.Module
    avgpool: nn.Module
    fc: nn.Module
    stage_names: tuple[str, ...]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]


class ResNet50(_ResNetForward):
    """ResNet-50 (v1.5) with torch's default init; torchvision's state_dict keys.

    Input: ``(N, in_channels, H, W)``, default ``(N, 3, 224, 224)`` (any ``H, W >= 32``).
    Output: ``(N, num_classes)`` logits.

    Args:
        layers: bottleneck blocks per stage. Default: ``(3, 4, 6, 3)`` (ResNet-50).
        width: inner width of the first stage (doubles per stage; outputs are 4x, so
            ``256 .. 2048`` by default). Default: ``64``.
        num_classes: Default: ``1000``.
        in_channels: Default: ``3``.
    """

    def __init__(
        self,
        layers: Sequence[int] = (3, 4, 6, 3),
        width: int = 64,
        num_classes: int = 1000,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = width
        names = []
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stage = [Bottleneck(channels, planes, stride=1 if i == 0 else 2)]
            for _ in range(1, blocks):
                stage.append(Bottleneck(planes * _EXPANSION, planes))
            names.append(f"layer{i + 1}")
            setattr(self, names[-1], nn.Sequential(*stage))
            channels = planes * _EXPANSION
        self.stage_names = tuple(names)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)


class LazyResNet50(_ResNetForward):
    """:class:`ResNet50` with every input size inferred (``in_channels`` too). Fully lazy."""

    def __init__(
        self, layers: Sequence[int] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000
    ) -> None:
        super().__init__()
        self.conv1 = LazyConv2d(width, 7, stride=2, padding=3, bias=False)
        self.bn1 = LazyBatchNorm2d()
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        names = []
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stage = [LazyBottleneck(planes, stride=1 if i == 0 else 2, downsample=True)]
            for _ in range(1, blocks):
                stage.append(LazyBottleneck(planes))
            names.append(f"layer{i + 1}")
            setattr(self, names[-1], nn.Sequential(*stage))
        self.stage_names = tuple(names)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = LazyLinear(num_classes)


# ==============================================================================================
# 4. GPT
# ==============================================================================================
class _GPTAttentionForward(nn.Module):
    c_attn: nn.Module
    c_proj: nn.Module
    resid_drop: nn.Module
    n_heads: int
    dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = (
            part.view(n, t, self.n_heads, c // self.n_heads).transpose(1, 2)
            for part in self.c_attn(x).split(c, dim=2)
        )
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(n, t, c)
        return self.resid_drop(self.c_proj(y))  # type: ignore[no-any-return]


class GPTAttention(_GPTAttentionForward):
    """Causal self-attention: ``(N, T, d_model) -> (N, T, d_model)``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)
        self.n_heads = n_heads
        self.dropout = dropout


class LazyGPTAttention(_GPTAttentionForward):
    """:class:`GPTAttention` with lazy projections."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.c_attn = LazyLinear(3 * d_model)
        self.c_proj = LazyLinear(d_model)
        self.resid_drop = nn.Dropout(dropout)
        self.n_heads = n_heads
        self.dropout = dropout


class _GPTFeedForward(nn.Module):
    c_fc: nn.Module
    gelu: nn.Module
    c_proj: nn.Module
    drop: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))  # type: ignore[no-any-return]


class GPTFeedForward(_GPTFeedForward):
    """Linear-GELU-Linear, ``4 * d_model`` wide: ``(N, T, d_model) -> (N, T, d_model)``."""

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)


class LazyGPTFeedForward(_GPTFeedForward):
    """:class:`GPTFeedForward` with lazy linears."""

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_fc = LazyLinear(4 * d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = LazyLinear(d_model)
        self.drop = nn.Dropout(dropout)


class _GPTBlockForward(nn.Module):
    ln_1: nn.Module
    attn: nn.Module
    ln_2: nn.Module
    mlp: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))  # type: ignore[no-any-return]


class GPTBlock(_GPTBlockForward):
    """Pre-norm transformer block: ``(N, T, d_model) -> (N, T, d_model)``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = GPTAttention(d_model, n_heads, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = GPTFeedForward(d_model, dropout)


class LazyGPTBlock(_GPTBlockForward):
    """:class:`GPTBlock` with lazy linears; the LayerNorms stay eager."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = LazyGPTAttention(d_model, n_heads, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = LazyGPTFeedForward(d_model, dropout)


class _GPTForward(nn.Module):
    wte: nn.Module
    wpe: nn.Module
    drop: nn.Module
    blocks: nn.ModuleList
    ln_f: nn.Module
    lm_head: nn.Module
    context: int

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[-1]
        if t > self.context:
            raise ValueError(f"expected at most {self.context} tokens, received {t}")
        positions = torch.arange(t, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]


class GPT(_GPTForward):
    """GPT-2-style decoder (pre-norm, trainable positions, untied bias-free LM head).

    Input: ``(N, T)`` token ids (long), ``T <= context``. Output: ``(N, T, vocab_size)``
    logits. Defaults are GPT-2 medium's; unlike GPT-2 the head is not tied to ``wte``, and the
    init is torch's default (no GPT-2 ``0.02`` normal init).

    Args:
        vocab_size: Default: ``50257``.
        context: maximum sequence length (positions). Default: ``1024``.
        d_model: Default: ``1024``.
        n_layers: Default: ``24``.
        n_heads: Default: ``16``.
        dropout: embedding, attention and residual dropout. Default: ``0.0``.
    """

    def __init__(
        self,
        vocab_size: int = 50257,
        context: int = 1024,
        d_model: int = 1024,
        n_layers: int = 24,
        n_heads: int = 16,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.context = context


class LazyGPT(_GPTForward):
    """:class:`GPT` with every ``Linear`` lazy. Mixed: the embeddings and LayerNorms stay
    eager (lazynn has no lazy version of them; the config gives their sizes anyway)."""

    def __init__(
        self,
        vocab_size: int = 50257,
        context: int = 1024,
        d_model: int = 1024,
        n_layers: int = 24,
        n_heads: int = 16,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            LazyGPTBlock(d_model, n_heads, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = LazyLinear(vocab_size, bias=False)
        self.context = context


# ==============================================================================================
# 5. LSTM tagger
# ==============================================================================================
class _TaggerForward(nn.Module):
    embedding: nn.Module
    lstm: nn.Module
    head: nn.Module

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embedding(tokens))
        return self.head(states)  # type: ignore[no-any-return]


class LSTMTagger(_TaggerForward):
    """Sequence tagger: Embedding, (bi)LSTM (``batch_first``), Linear tag head.

    Input: ``(N, T)`` token ids (long). Output: ``(N, T, num_tags)`` logits. Defaults: a
    2-layer bidirectional LSTM and the 17 Universal-Dependencies POS tags.
    """

    def __init__(
        self,
        vocab_size: int = 20000,
        embed_dim: int = 128,
        hidden: int = 256,
        num_layers: int = 2,
        num_tags: int = 17,
        bidirectional: bool = True,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(
            embed_dim, hidden, num_layers, batch_first=True, bidirectional=bidirectional
        )
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_tags)


class LazyLSTMTagger(_TaggerForward):
    """:class:`LSTMTagger` with a lazy head (its input is ``hidden`` or ``2 * hidden`` wide).
    Mixed: the Embedding and the LSTM stay eager."""

    def __init__(
        self,
        vocab_size: int = 20000,
        embed_dim: int = 128,
        hidden: int = 256,
        num_layers: int = 2,
        num_tags: int = 17,
        bidirectional: bool = True,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(
            embed_dim, hidden, num_layers, batch_first=True, bidirectional=bidirectional
        )
        self.head = LazyLinear(num_tags)


# ==============================================================================================
# 6. U-Net
# ==============================================================================================
def _double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _lazy_double_conv(out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        LazyConv2d(out_channels, 3, padding=1, bias=False),
        LazyBatchNorm2d(),
        nn.ReLU(inplace=True),
        LazyConv2d(out_channels, 3, padding=1, bias=False),
        LazyBatchNorm2d(),
        nn.ReLU(inplace=True),
    )


class _UNetForward(nn.Module):
    encoder: nn.ModuleList
    pool: nn.Module
    bottleneck: nn.Module
    upconvs: nn.ModuleList
    decoder: nn.ModuleList
    head: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factor = 2 ** len(self.encoder)
        if x.shape[-1] % factor or x.shape[-2] % factor:
            raise ValueError(
                f"expected an image whose height and width are divisible by {factor} "
                f"(2 ** depth), received shape {tuple(x.shape)}"
            )
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        # Called interleaved (upconvs[0], decoder[0], upconvs[1], ...), constructed list by
        # list: the forward order differs from the construction order, on purpose.
        for up, block, skip in zip(self.upconvs, self.decoder, reversed(skips), strict=True):
            x = block(torch.cat([skip, up(x)], dim=1))
        return self.head(x)  # type: ignore[no-any-return]


class UNet(_UNetForward):
    """U-Net: double-conv encoder with MaxPool, ConvTranspose2d upsampling, skip concatenation
    on channels, final 1x1 conv.

    Input: ``(N, in_channels, H, W)`` with ``H`` and ``W`` divisible by ``2 ** depth``, e.g.
    ``(N, 1, 64, 64)``. Output: ``(N, out_channels, H, W)`` per-pixel logits.

    Args:
        in_channels: Default: ``1``.
        out_channels: Default: ``2``.
        base: width of the first level, doubled per level. Default: ``64`` (the original
            U-Net: ``64 .. 1024``).
        depth: number of downsamplings. Default: ``4``.
    """

    def __init__(
        self, in_channels: int = 1, out_channels: int = 2, base: int = 64, depth: int = 4
    ) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth)]
        self.encoder = nn.ModuleList()
        previous = in_channels
        for width in widths:
            self.encoder.append(_double_conv(previous, width))
            previous = width
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = _double_conv(previous, 2 * previous)
        self.upconvs = nn.ModuleList(
            nn.ConvTranspose2d(2 * width, width, 2, stride=2) for width in reversed(widths)
        )
        self.decoder = nn.ModuleList(_double_conv(2 * width, width) for width in reversed(widths))
        self.head = nn.Conv2d(base, out_channels, 1)


class LazyUNet(_UNetForward):
    """:class:`UNet` with every input size inferred (``in_channels`` too). Fully lazy."""

    def __init__(self, out_channels: int = 2, base: int = 64, depth: int = 4) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth)]
        self.encoder = nn.ModuleList(_lazy_double_conv(width) for width in widths)
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = _lazy_double_conv(2 * widths[-1])
        self.upconvs = nn.ModuleList(
            LazyConvTranspose2d(width, 2, stride=2) for width in reversed(widths)
        )
        self.decoder = nn.ModuleList(_lazy_double_conv(width) for width in reversed(widths))
        self.head = LazyConv2d(out_channels, 1)


# ==============================================================================================
# LLaMA (lazy only)
# ==============================================================================================
def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``(N, H, T, head_dim)`` (rotate-half convention)."""
    t, dim = x.shape[-2], x.shape[-1]
    freqs = theta ** -(torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), freqs)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class LlamaAttention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads, bias-free lazy
    projections: ``(N, T, d_model) -> (N, T, d_model)``."""

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, rope_theta: float = 10000.0
    ) -> None:
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(
                f"expected d_model divisible by n_heads and n_heads by n_kv_heads, received "
                f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        head_dim = d_model // n_heads
        self.wq = LazyLinear(n_heads * head_dim, bias=False)
        self.wk = LazyLinear(n_kv_heads * head_dim, bias=False)
        self.wv = LazyLinear(n_kv_heads * head_dim, bias=False)
        self.wo = LazyLinear(d_model, bias=False)
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.rope_theta = rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        q = self.wq(x).view(n, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(n, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(n, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, self.rope_theta), _rotate(k, self.rope_theta)
        groups = self.n_heads // self.n_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(n, t, -1))  # type: ignore[no-any-return]


class LlamaFeedForward(nn.Module):
    """SwiGLU MLP ``w2(silu(w1(x)) * w3(x))``: ``(N, T, d_model) -> (N, T, d_model)``.

    Registered ``w1, w2, w3`` (as Meta's reference code), called ``w1, w3, w2``.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = LazyLinear(d_ff, bias=False)
        self.w2 = LazyLinear(d_model, bias=False)
        self.w3 = LazyLinear(d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # type: ignore[no-any-return]


class LlamaBlock(nn.Module):
    """Pre-norm LLaMA block, registered as Meta's (``attention, feed_forward,
    attention_norm, ffn_norm``) but called norm first: ``(N, T, d) -> (N, T, d)``."""

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.attention = LlamaAttention(d_model, n_heads, n_kv_heads)
        self.feed_forward = LlamaFeedForward(d_model, d_ff)
        self.attention_norm = nn.RMSNorm(d_model, eps=eps)
        self.ffn_norm = nn.RMSNorm(d_model, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))  # type: ignore[no-any-return]


class LazyLlama(nn.Module):
    """LLaMA-shaped decoder: token Embedding, blocks, RMSNorm, bias-free LM head, nothing tied.

    Input: ``(N, T)`` token ids (long). Output: ``(N, T, vocab_size)`` logits. Every Linear is
    lazy; the Embedding and the RMSNorms are eager (mixed). State-dict keys follow Meta's
    reference code (``tok_embeddings``, ``layers.i.attention.wq``, ``norm``, ``output``).
    """

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        vocab_size: int,
        n_kv_heads: int | None = None,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.tok_embeddings = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            LlamaBlock(d_model, n_heads, kv_heads, d_ff, eps) for _ in range(n_layers)
        )
        self.norm = nn.RMSNorm(d_model, eps=eps)
        self.output = LazyLinear(vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))  # type: ignore[no-any-return]


def lazy_llama(
    n_layers: int,
    d_model: int,
    n_heads: int,
    d_ff: int,
    vocab: int,
    n_kv_heads: int | None = None,
) -> LazyLlama:
    """A :class:`LazyLlama`; ``n_kv_heads`` (grouped-query attention) defaults to ``n_heads``.

    >>> import torch
    >>> model = lazy_llama(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab=100, n_kv_heads=2)
    >>> model(torch.zeros(1, 5, dtype=torch.long)).shape
    torch.Size([1, 5, 100])
    >>> model.layers[0].attention.wk
    Linear(in_features=32, out_features=16, bias=False)
    """
    return LazyLlama(n_layers, d_model, n_heads, d_ff, vocab, n_kv_heads=n_kv_heads)


def llama_7b() -> LazyLlama:
    """LLaMA-7B shapes: 32 layers, d_model 4096, 32 heads, d_ff 11008, vocab 32000."""
    return lazy_llama(32, 4096, 32, 11008, 32000)


def llama_70b() -> LazyLlama:
    """LLaMA-2-70B shapes: 80 layers, d_model 8192, 64 heads (8 key/value heads), d_ff 28672,
    vocab 32000."""
    return lazy_llama(80, 8192, 64, 28672, 32000, n_kv_heads=8)


# ==============================================================================================
# Registries
# ==============================================================================================
class ExampleInput(Protocol):
    """Makes an example input on ``device`` (default: the current default device)."""

    def __call__(self, device: torch.device | str | None = None) -> torch.Tensor: ...


def _target(device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else torch.get_default_device()


def _images(*shape: int) -> ExampleInput:
    """Standard-normal float32 images of ``shape`` (own generator, seed 0)."""

    def make(device: torch.device | str | None = None) -> torch.Tensor:
        target = _target(device)
        if target.type == "meta":
            return torch.empty(shape, device=target)
        generator = torch.Generator().manual_seed(0)
        return torch.randn(shape, generator=generator, device="cpu").to(target)

    return make


def _tokens(vocab: int, *shape: int) -> ExampleInput:
    """Uniform token ids in ``[0, vocab)`` of ``shape``, long (own generator, seed 0)."""

    def make(device: torch.device | str | None = None) -> torch.Tensor:
        target = _target(device)
        if target.type == "meta":
            return torch.empty(shape, dtype=torch.long, device=target)
        generator = torch.Generator().manual_seed(0)
        return torch.randint(vocab, shape, generator=generator, device="cpu").to(target)

    return make


class Reference(NamedTuple):
    """One reference pair: ``(eager_factory, lazy_factory, example_input_factory)``."""

    eager: Callable[[], nn.Module]
    lazy: Callable[[], nn.Module]
    example: ExampleInput


def _small_gpt(lazy: bool) -> nn.Module:
    return (LazyGPT if lazy else GPT)(vocab_size=97, context=32, d_model=32, n_layers=2, n_heads=4)


#: Small configurations for tests (each: construction + one forward well under 1 s on 2 cores).
REFERENCE: dict[str, Reference] = {
    "mlp": Reference(
        lambda: MLP(in_features=64, hidden=(32, 16), num_classes=10),
        lambda: LazyMLP(hidden=(32, 16), num_classes=10),
        _images(4, 1, 8, 8),
    ),
    "cnn": Reference(
        lambda: CNN(channels=(8, 16, 32), hidden=32, num_classes=10),
        lambda: LazyCNN(channels=(8, 16, 32), hidden=32, num_classes=10),
        _images(4, 3, 32, 32),
    ),
    "resnet50": Reference(
        lambda: ResNet50(layers=(1, 2, 1, 1), width=4, num_classes=10),
        lambda: LazyResNet50(layers=(1, 2, 1, 1), width=4, num_classes=10),
        _images(2, 3, 64, 64),
    ),
    "gpt": Reference(lambda: _small_gpt(False), lambda: _small_gpt(True), _tokens(97, 2, 16)),
    "lstm_tagger": Reference(
        lambda: LSTMTagger(vocab_size=100, embed_dim=16, hidden=24, num_layers=2, num_tags=5),
        lambda: LazyLSTMTagger(vocab_size=100, embed_dim=16, hidden=24, num_layers=2, num_tags=5),
        _tokens(100, 2, 12),
    ),
    "unet": Reference(
        lambda: UNet(in_channels=1, out_channels=2, base=4, depth=3),
        lambda: LazyUNet(out_channels=2, base=4, depth=3),
        _images(2, 1, 64, 64),
    ),
}

#: The real sizes, for benchmarks (construct under ``with torch.device("meta"):`` to skip
#: allocation; ResNet-50 25.6M parameters, GPT-2 medium with an untied head 406M).
FULL: dict[str, Reference] = {
    "mlp": Reference(MLP, LazyMLP, _images(1, 1, 28, 28)),
    "cnn": Reference(CNN, LazyCNN, _images(1, 3, 32, 32)),
    "resnet50": Reference(ResNet50, LazyResNet50, _images(1, 3, 224, 224)),
    "gpt": Reference(GPT, LazyGPT, _tokens(50257, 1, 1024)),
    "lstm_tagger": Reference(LSTMTagger, LazyLSTMTagger, _tokens(20000, 1, 64)),
    "unet": Reference(UNet, LazyUNet, _images(1, 1, 64, 64)),
}

#: Lazy-only models: name -> (lazy factory, example input factory).
LAZY_ONLY: dict[str, tuple[Callable[[], nn.Module], ExampleInput]] = {
    "llama_tiny": (lambda: lazy_llama(2, 64, 4, 172, 100, n_kv_heads=2), _tokens(100, 2, 16)),
    "llama_7b": (llama_7b, _tokens(32000, 1, 2048)),
    "llama_70b": (llama_70b, _tokens(32000, 1, 4096)),
}


def resnet50() -> LazyResNet50:
    """The full-size lazy ResNet-50 (for ``python -m lazynn summary``): input (N, 3, 224, 224)."""
    return LazyResNet50()


def gpt2_medium() -> LazyGPT:
    """The full-size lazy GPT-2-medium-shaped decoder: input (N, T) token ids, T <= 1024."""
    return LazyGPT()
