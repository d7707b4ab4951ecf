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
EfficientNet timm ``efficientnet.py``, ``_efficientnet_blocks.py``,   ``_init_weight_goog``,
             ``_efficientnet_builder.py``                            depthwise convs, squeeze-
                                                                     excite, drop path from
                                                                     ``linspace().item()``
Swin         microsoft ``swin_transformer.py``                       timm's own ``trunc_normal_``
                                                                     (``erfinv_``), relative-
                                                                     position index and shift
                                                                     mask buffers, ``dpr`` from
                                                                     ``linspace().item()``
Mamba        state-spaces ``mamba_simple.py``,                       ``dt_proj`` from ``rand``
             ``mixer_seq_simple.py``                                  (``copy_`` into the bias),
                                                                     ``A_log`` / ``D`` with
                                                                     ``_no_weight_decay``, tied
                                                                     head, prenorm rescaling
Diffusion    openai/improved-diffusion ``unet.py``, ``nn.py``        ``zero_module``
U-Net                                                                (``p.detach().zero_()``),
                                                                     skip concatenations,
                                                                     ``GroupNorm32`` made lazy
HiFi-GAN     jik876/hifi-gan ``models.py``                           ``weight_norm`` in
                                                                     ``__init__`` (factory
                                                                     form only),
                                                                     ``init_weights``
DETR         facebookresearch/detr ``detr.py``, ``backbone.py``,      a torchvision ResNet whose
             ``transformer.py``, ``position_encoding.py``            ``fc`` is constructed and
                                                                     dropped (its size written:
                                                                     lazynn refuses a dropped
                                                                     lazy layer), frozen BN,
                                                                     layers deep-copied,
                                                                     ``_reset_parameters``
                                                                     (``xavier_uniform_``)
T5           Hugging Face ``modeling_t5.py``                          one shared embedding in
                                                                     three places, head tied
                                                                     to it, ``post_init`` with
                                                                     factor-scaled ``normal_``;
                                                                     loaded from a checkpoint
                                                                     without the head's key
===========  =====================================================  =========================

One file a model, plus ``kit.py`` (the two kits) and ``table.py`` (``MODELS``). Each model's
file says what was reduced (sizes) or left out (checkpointing flags, fp16), and where its lazy
port is not its sized constructors alone: Mamba's ``in_proj`` / ``dt_proj``, whose weights
its forward reads without calling them (no input tells their sizes); HiFi-GAN runs in the
factory form only (torch's ``weight_norm`` refuses an unbuilt weight in the instance form).

``MODELS`` maps a name to a :class:`RealModel`: a factory of the model for a kit, and example
inputs (shapes and dtypes, for ``lazynn.build``; real tensors from a private generator).
"""

from .kit import EAGER, LAZY, Kit, LazyKit
from .table import MODELS, RealModel, every_tensor, lazy_model

__all__ = ["EAGER", "LAZY", "MODELS", "Kit", "LazyKit", "RealModel", "every_tensor", "lazy_model"]
