"""The models the job checks: each the zoo's own constructor, unmodified, as a factory.

A row names a model, the zoo call that constructs it (small configurations through the
constructor's own keyword arguments, no pretrained weights), the input it is built on and run
with, and what its ``__init__`` does to its tensors (README.md's table is made from these).
Nothing here is lazy: the rows are the promise that any torch model's own constructor, given
to ``lazynn.build``, gives the eager model bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torchvision_ops import prepare

prepare()  # before torchvision's first import (timm imports it): torchvision_ops.py

import timm  # noqa: E402
import torchvision  # noqa: E402

__all__ = ["ROWS", "Row", "example_input", "row"]


@dataclass(frozen=True)
class Row:
    """One model of a zoo.

    ``example`` is the input shape ``build(factory, example)`` runs the forward on (on meta)
    and the eager and built models are run on; None where the forward cannot run on meta or
    needs more than a tensor (``why_no_example`` says why): those rows skip the door that
    takes an example and the forward comparison, and keep the others, which need no forward.
    """

    id: str
    make: Callable[[], nn.Module]
    init: str
    example: tuple[int, ...] | None = (2, 3, 32, 32)
    why_no_example: str = ""
    #: a module the row needs beyond timm and torchvision (test_zoos.need: skipped without
    #: it, unless CI requires it)
    requires: str = ""


def _timm(name: str, **config: object) -> Callable[[], nn.Module]:
    return functools.partial(timm.create_model, name, pretrained=False, **config)


def _tv(builder: Callable[..., nn.Module], **config: object) -> Callable[[], nn.Module]:
    return functools.partial(builder, weights=None, **config)


def _llama3_debugmodel() -> nn.Module:
    """torchtitan's llama3 "debugmodel" (its own smallest configuration: 6 layers, dim 256,
    vocabulary 2048, FlexAttention) as its trainer makes it: ``build()`` then
    ``init_weights()``."""
    from torchtitan.models.llama3 import model_registry

    model: nn.Module = model_registry("debugmodel").model.build()
    model.init_weights()  # type: ignore[operator]
    return model


TIMM = [
    Row(
        "timm/resnet18",
        _timm("resnet18", num_classes=10),
        "kaiming_normal_(fan_out) loop, last BN of each block zero-init",
    ),
    Row(
        "timm/vit_tiny_patch16_224",
        _timm("vit_tiny_patch16_224", img_size=32, num_classes=10),
        "trunc_normal_ pos_embed, normal_(1e-6) cls_token, named_apply(init_weights_vit_timm)",
    ),
    Row(
        "timm/deit_tiny_distilled_patch16_224",
        _timm("deit_tiny_distilled_patch16_224", img_size=32, num_classes=10),
        "distillation token and second head, trunc_normal_ on both tokens",
    ),
    Row(
        "timm/swin_tiny_patch4_window7_224",
        _timm(
            "swin_tiny_patch4_window7_224",
            img_size=64,
            window_size=4,
            embed_dim=24,
            depths=(2, 2, 2, 2),
            num_heads=(1, 2, 2, 4),
            num_classes=10,
        ),
        "relative_position_index and shifted-window attn_mask buffers computed in __init__, "
        "drop-path rates from linspace",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/convnext_atto",
        _timm("convnext_atto", num_classes=10),
        "trunc_normal_ loop, layer-scale gamma, head weight .mul_(head_init_scale)",
    ),
    Row(
        "timm/efficientnet_b0",
        _timm("efficientnet_b0", num_classes=10),
        "_init_weight_goog: normal_(sqrt(2/fan_out)) convs, uniform_ classifier, squeeze-excite",
    ),
    Row(
        "timm/mobilenetv3_small_050",
        _timm("mobilenetv3_small_050", num_classes=10),
        "_init_weight_goog, hard-swish, squeeze-excite",
    ),
    Row(
        "timm/regnetx_002",
        _timm("regnetx_002", num_classes=10),
        "its own _init_weights: normal_(sqrt(2/fan_out)) per conv, normal_(0.01) head",
    ),
    Row(
        "timm/eva02_tiny_patch14_224",
        _timm("eva02_tiny_patch14_224", img_size=28, num_classes=10),
        "rotary-embedding buffers computed in __init__ (clone(memory_format=...)), "
        "trunc_normal_, rescale of attn/mlp projections by layer depth",
        example=(2, 3, 28, 28),
    ),
    Row(
        "timm/beit_base_patch16_224",
        _timm(
            "beit_base_patch16_224",
            img_size=32,
            embed_dim=64,
            depth=2,
            num_heads=2,
            num_classes=10,
        ),
        "relative-position-bias tables and index buffers, layer-scale gamma_1/gamma_2, "
        "fix_init_weight (div_ by sqrt(2 * layer))",
    ),
    Row(
        "timm/levit_128s",
        _timm("levit_128s", num_classes=10),
        "attention-bias index buffers made empty, then copy_ of indices computed in "
        "__init__; conv-BN and linear-BN blocks",
        example=(2, 3, 224, 224),
    ),
    Row(
        "timm/cait_xxs24_224",
        _timm("cait_xxs24_224", img_size=32, depth=2, num_classes=10),
        "class-attention blocks, talking heads, layer-scale init, trunc_normal_ apply",
    ),
    Row(
        "timm/convit_tiny",
        _timm("convit_tiny", img_size=32, depth=3, local_up_to_layer=2, num_classes=10),
        "GPSA local_init: positional projection set by loops, rel_indices computed in __init__",
    ),
    Row(
        "timm/densenet121",
        _timm("densenet121", num_classes=10),
        "kaiming_normal_ loop, constant_ norms and bias",
    ),
    Row(
        "timm/dla46x_c",
        _timm("dla46x_c", num_classes=10),
        "its own loop: normal_(0, sqrt(2/n)) per conv",
    ),
    Row(
        "timm/mobilevit_xxs",
        _timm("mobilevit_xxs", num_classes=10),
        "byobnet blocks with transformers, named_apply(_init_weights)",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/pvt_v2_b0",
        _timm("pvt_v2_b0", num_classes=10),
        "its own _init_weights: trunc_normal_ linears, normal_(sqrt(2/fan_out)) convs",
    ),
    Row(
        "timm/xcit_nano_12_p8_224",
        _timm("xcit_nano_12_p8_224", img_size=32, depth=2, num_classes=10),
        "Fourier positional encoding, local patch interaction, class attention, layer-scale eta",
    ),
    Row(
        "timm/gmlp_ti16_224",
        _timm("gmlp_ti16_224", img_size=32, num_classes=10),
        "spatial gating unit: normal_(1e-6) weight, ones_ bias; lecun_normal_ / xavier",
    ),
    Row(
        "timm/edgenext_xx_small",
        _timm("edgenext_xx_small", num_classes=10),
        "Fourier positional encoding, split depth-wise transposed attention, layer-scale "
        "gamma, trunc_normal_ loop",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/hrnet_w18_small",
        _timm("hrnet_w18_small", num_classes=10),
        "multi-resolution branches and fuse layers, kaiming_normal_ loop",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/fastvit_t8",
        _timm("fastvit_t8", num_classes=10),
        "re-parameterisable MobileOne branches, layer scale, apply(_init_weights) with "
        "trunc_normal_",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/mvitv2_tiny",
        _timm("mvitv2_tiny", img_size=64, num_classes=10),
        "decomposed relative positions, pooled attention, trunc_normal_tf_ rel_pos tables",
        example=(2, 3, 64, 64),
    ),
    Row(
        "timm/test_nfnet",
        _timm("test_nfnet", num_classes=10),
        "normalizer-free: ScaledStdConv2d gain parameters, kaiming_normal_(fan_in, "
        "linear) convs, normal_(0.01) head",
    ),
    Row(
        "timm/test_coatnet",
        _timm("test_coatnet", img_size=64, num_classes=10),
        "MaxViT/CoAtNet relative-position-bias tables and index buffers, "
        "normal_(sqrt(2/fan_out)) convs, trunc_normal_tf_ linears",
        example=(2, 3, 64, 64),
    ),
]

TORCHVISION = [
    Row(
        "torchvision/resnet18",
        _tv(torchvision.models.resnet18, num_classes=10),
        "kaiming_normal_(fan_out) loop, constant_ norms",
    ),
    Row(
        "torchvision/mobilenet_v3_small",
        _tv(torchvision.models.mobilenet_v3_small, num_classes=10),
        "kaiming_normal_ convs, normal_(0.01) linears",
    ),
    Row(
        "torchvision/efficientnet_b0",
        _tv(torchvision.models.efficientnet_b0, num_classes=10),
        "uniform_(-1/sqrt(out), 1/sqrt(out)) classifier, stochastic depth from block index",
    ),
    Row(
        "torchvision/regnet_x_400mf",
        _tv(torchvision.models.regnet_x_400mf, num_classes=10),
        "normal_(sqrt(2/fan_out)) convs, normal_(0.01) head; block widths computed with "
        "tensor ops and .tolist() in __init__",
    ),
    Row(
        "torchvision/shufflenet_v2_x0_5",
        _tv(torchvision.models.shufflenet_v2_x0_5, num_classes=10),
        "torch's default reset_parameters only",
    ),
    Row(
        "torchvision/squeezenet1_1",
        _tv(torchvision.models.squeezenet1_1, num_classes=10),
        "kaiming_uniform_ loop, final conv normal_(0.01)",
        example=(2, 3, 64, 64),
    ),
    Row(
        "torchvision/googlenet",
        _tv(torchvision.models.googlenet, num_classes=10, aux_logits=False, init_weights=True),
        "trunc_normal_(std=0.01, a=-2, b=2) loop",
        example=(2, 3, 64, 64),
    ),
    Row(
        "torchvision/inception_v3",
        _tv(
            torchvision.models.inception_v3,
            num_classes=10,
            aux_logits=False,
            init_weights=True,
        ),
        "trunc_normal_ with each module's own stddev attribute",
        example=(2, 3, 75, 75),
    ),
    Row(
        "torchvision/mnasnet0_5",
        _tv(torchvision.models.mnasnet0_5, num_classes=10),
        "kaiming_normal_ convs, kaiming_uniform_(sigmoid) linear",
    ),
    Row(
        "torchvision/convnext_tiny",
        _tv(torchvision.models.convnext_tiny, num_classes=10),
        "trunc_normal_(0.02) loop, layer scale from torch.ones * value",
    ),
    Row(
        "torchvision/swin_v2_t",
        _tv(torchvision.models.swin_v2_t, num_classes=10),
        "log-spaced relative_coords_table and relative_position_index buffers computed in "
        "__init__, continuous position-bias MLP, logit_scale from log(10 * ones)",
        example=(2, 3, 64, 64),
    ),
    Row(
        "torchvision/vit_small",
        functools.partial(
            torchvision.models.VisionTransformer,
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=2,
            hidden_dim=64,
            mlp_dim=128,
            num_classes=10,
        ),
        "trunc_normal_(sqrt(1/fan_in)) patch conv, normal_(0.02) pos_embedding, zeros_ "
        "class token and head (VisionTransformer's own constructor, small sizes)",
    ),
    Row(
        "torchvision/fasterrcnn_mobilenet_v3_large_320_fpn",
        _tv(
            torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn,
            weights_backbone=None,
            num_classes=3,
        ),
        "detection: FPN kaiming_uniform_(a=1), RPN head normal_(0.01), anchor generator, "
        "a MobileNetV3 backbone",
        example=None,
        why_no_example="its forward needs a list of images and calls torchvision::nms, "
        "whose kernel is in the extension that does not load here",
    ),
]

TORCHTITAN = [
    Row(
        "torchtitan/llama3_debugmodel",
        _llama3_debugmodel,
        "config-driven param_init: trunc_normal_ (depth-scaled std per layer), normal_ "
        "embedding, ones_ norms; RoPE cache buffer computed in __init__ (complex, "
        "torch.polar)",
        example=None,
        why_no_example="FlexAttention, its default attention, cannot run on meta; nothing is "
        "lazy, so no forward is needed",
        requires="torchtitan.models.llama3",
    ),
]

ROWS: list[Row] = TIMM + TORCHVISION + TORCHTITAN
_BY_ID = {r.id: r for r in ROWS}


def row(id: str) -> Row:
    """The row named ``id`` (a spawned rank finds its model by name)."""
    return _BY_ID[id]


def example_input(shape: tuple[int, ...]) -> torch.Tensor:
    """The fixed input a row's models run on (its own generator: the global one is left
    alone)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(1234))
