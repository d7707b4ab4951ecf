"""lazynn's placeholders, registered with the torch registries that must know them.

* ``torch.serialization.add_safe_globals``: an unbuilt model's state_dict holds
  placeholders; ``torch.load``'s default ``weights_only=True`` mode must accept them.
* ``torch._dynamo.config.nontraceable_tensor_subclasses``: dynamo must treat them as it treats
  torch's own placeholders (which it exempts by exact type from being traced as tensors), so
  that a lazy layer made inside a compiled function, a lazy RNN nested in a compiled model, or
  a user's module holding placeholders compiles (with a graph break where torch's would
  break). It is the configuration dynamo documents for tensor subclasses it must not trace.
  Importing torch._dynamo costs about a second, so lazynn does not import it: the
  registration is made when torch._dynamo's configuration is first imported (by
  ``torch.compile``), or now if it already is. tests/ecosystem/test_torch_internals.py checks that
  the
  setting still exists.

>>> import torch, lazynn
>>> _ = torch.compile(lambda x: lazynn.LazyLinear(3)(x), backend="eager")(torch.ones(2, 4))
>>> import torch._dynamo
>>> lazynn.UninitializedParameter in torch._dynamo.config.nontraceable_tensor_subclasses
True
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from .placeholder import UninitializedBuffer, UninitializedParameter, rebuild_placeholder

__all__ = ["DYNAMO_CONFIG", "register_with_dynamo"]

#: the module whose import is awaited
DYNAMO_CONFIG = "torch._dynamo.config"
_PLACEHOLDERS = (UninitializedParameter, UninitializedBuffer)

torch.serialization.add_safe_globals([*_PLACEHOLDERS, rebuild_placeholder])


def register_with_dynamo(config: Any) -> None:
    """Tell dynamo's ``config`` not to trace lazynn's placeholders as tensors."""
    config.nontraceable_tensor_subclasses.update(_PLACEHOLDERS)


class _Loader(importlib.abc.Loader):
    """The real loader of DYNAMO_CONFIG, then the registration."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        register_with_dynamo(module)


class _AwaitDynamo(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when DYNAMO_CONFIG is imported, wraps the real loader so the
    registration runs right after, then leaves ``sys.meta_path``."""

    _lock = threading.Lock()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != DYNAMO_CONFIG:
            return None
        with self._lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if DYNAMO_CONFIG in sys.modules:
    register_with_dynamo(sys.modules[DYNAMO_CONFIG])
else:
    sys.meta_path.insert(0, _AwaitDynamo())
