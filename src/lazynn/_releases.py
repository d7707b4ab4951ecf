"""What differs between the torch releases lazynn supports (pyproject.toml: torch 2.11 and
newer; .ci/run tests the oldest, the pinned one and the newest on disk).

A layer whose torch class a release lacks is a stand-in there that ``import lazynn`` can
define and that, constructed, names the release it needs; an argument a release's class
lacks is dropped at its default and refused otherwise, naming the release that added it.

>>> import lazynn
>>> from lazynn._releases import lazy_of_torch
>>> Later = lazy_of_torch("NoSuchLayer", "9.0", in_features=lazynn.Infer(dim=-1))
>>> try:
...     Later(3)
... except lazynn.LazynnError as error:
...     print(str(error).split(", received")[0])
LazyNoSuchLayer: expected torch 9.0 or newer (torch.nn.NoSuchLayer is new in torch 9.0)
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn

from ._errors import LazynnError, message
from ._infer import Infer
from ._layer import LazyLayer
from ._lazy import lazy

__all__ = ["NORM_BIAS", "lazy_of_torch", "norm_bias"]

#: whether torch's batch, instance and group norms take ``bias`` (torch 2.12 and newer)
NORM_BIAS = "bias" in inspect.signature(nn.BatchNorm1d).parameters


def lazy_of_torch(name: str, release: str, /, **inferred: Infer) -> type[LazyLayer]:
    """``lazy(torch.nn.<name>, **inferred)``; where this torch has no ``torch.nn.<name>`` (new
    in torch ``release``), a stand-in of the same name whose construction says which torch it
    needs."""
    cls = getattr(nn, name, None)
    if cls is not None:
        return lazy(cls, **inferred)
    lazy_name = f"Lazy{name}"

    def __init__(self: LazyLayer, *args: Any, **kwargs: Any) -> None:
        raise LazynnError(
            message(
                lazy_name,
                f"torch {release} or newer (torch.nn.{name} is new in torch {release})",
                f"torch {torch.__version__}",
                f"upgrade torch to {release} or newer",
            )
        )

    namespace = {
        "__init__": __init__,
        "__doc__": f"``torch.nn.{name}`` made lazy; needs torch {release} or newer.",
        "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
        "__qualname__": lazy_name,
    }
    return type(lazy_name, (LazyLayer, nn.Module), namespace)


def norm_bias(layer: str, bias: bool) -> dict[str, Any]:
    """The ``bias`` argument for torch's batch and instance norms: ``{"bias": bias}`` from
    torch 2.12; before, ``{}`` (an affine norm always has its bias), and ``bias=False`` is
    refused, naming the release."""
    if NORM_BIAS:
        return {"bias": bias}
    if not bias:
        raise LazynnError(
            message(
                layer,
                "torch 2.12 or newer for bias=False (torch's norms take bias from 2.12)",
                f"torch {torch.__version__}",
                "upgrade torch to 2.12 or newer, or leave bias at its default (True)",
            )
        )
    return {}
