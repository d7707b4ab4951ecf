"""What a placeholder answers without a shape: the tensor attributes, methods and conversions
its ``__torch_function__`` (``placeholder.py``) lets through, and the copies it answers as
torch does. Everything else that reaches it needs data or a shape, and is refused (or, written
on it, kept for the build: ``kept.py``).

>>> import torch
>>> torch.Tensor.to in CONVERSIONS, torch.Tensor.add in ALLOWED_METHODS
(True, False)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ALLOWED_ATTRIBUTES", "ALLOWED_METHODS", "CLONES", "CONVERSIONS", "NATIVE"]

# torch.Tensor attributes read through descriptors that do not depend on the shape.
ALLOWED_ATTRIBUTES = frozenset(
    {
        "dtype",
        "device",
        "requires_grad",
        "is_leaf",
        "grad",
        "grad_fn",
        "layout",
        "is_cuda",
        "is_cpu",
        "is_meta",
        "is_sparse",
        "is_quantized",
        "is_nested",
        "is_mkldnn",
        "is_xpu",
        "is_mps",
        "_is_param",
        "_is_buffer",
        "persistent",
    }
)

# Methods that answer from dtype and device alone.
ALLOWED_METHODS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.__hash__,
        torch.Tensor.is_floating_point,
        torch.Tensor.is_complex,
        torch.is_floating_point,
        torch.is_complex,
        torch.Tensor.is_signed,
        torch.Tensor.get_device,
        torch.Tensor.element_size,
        torch._has_compatible_shallow_copy_type,
        # The (empty) storage of the placeholder's data: pointer 0 and 0 bytes, as a meta
        # tensor's. safetensors' load_model and accelerate ask every tensor of a model for
        # its storage to find tied weights; torch's placeholders refuse (a listed difference).
        torch.Tensor.untyped_storage,
    }
)

# Conversions: applied to the (empty) data, they give a new placeholder with the new dtype,
# device or requires_grad. This is what keeps `module.to(...)` / `to_empty` lazy.
CONVERSIONS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.to,
        torch.Tensor.half,
        torch.Tensor.float,
        torch.Tensor.double,
        torch.Tensor.bfloat16,
        torch.Tensor.cpu,
        torch.Tensor.cuda,
        torch.Tensor.type,
        torch.Tensor.detach,
        torch.empty_like,
    }
)


#: copies: of a placeholder's ``.data``, torch's empty tensor (see ``__torch_function__``)
CLONES: frozenset[Callable[..., Any]] = frozenset({torch.Tensor.clone, torch.clone})

#: the ``requires_grad`` descriptor (torch's stub types the attribute as a bool)
_REQUIRES_GRAD: Any = inspect.getattr_static(torch.Tensor, "requires_grad")

#: what a placeholder answers itself even in a factory's first run: moves (a new placeholder),
#: ``requires_grad``
NATIVE = CONVERSIONS | {
    torch.Tensor.requires_grad_,
    _REQUIRES_GRAD.__get__,
    _REQUIRES_GRAD.__set__,
}
