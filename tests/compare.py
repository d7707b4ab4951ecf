"""The comparison every "lazy after its build is exactly the eager layer" test makes."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

import lazynn

#: what every nn.Module's __dict__ holds (parameters, hooks...): compared elsewhere
MODULE_KEYS = frozenset(nn.Module().__dict__)


def same(a: Any, b: Any) -> bool:
    """Equal attribute values: tensors bit for bit, containers element-wise (an RNN's
    ``_flat_weights``), weak references by what they refer to."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, weakref.ref):
        return isinstance(b, weakref.ref) and same(a(), b())
    return bool(a == b)


def assert_same_module(lazy: nn.Module, eager: nn.Module) -> None:
    """``lazy`` is exactly ``eager``: its class, no lazy machinery left (no build hook, no
    ``_lazynn_`` attribute), the same attributes with the same values, the same repr, and the
    same state: keys in order, tensor types, dtypes, devices and values bit for bit; its
    parameters are ``nn.Parameter`` with the same ``requires_grad``."""
    assert type(lazy) is type(eager)
    assert not lazynn.is_lazy(lazy)
    assert not lazy._forward_pre_hooks
    assert not lazy._load_state_dict_pre_hooks
    assert not [k for k in vars(lazy) if k.startswith("_lazynn")]
    assert vars(lazy).keys() == vars(eager).keys()
    for key, value in vars(eager).items():
        if key not in MODULE_KEYS:
            assert same(vars(lazy)[key], value), key
    assert repr(lazy) == repr(eager)
    ls, es = lazy.state_dict(), eager.state_dict()
    assert list(ls) == list(es)
    for key in es:
        assert type(ls[key]) is type(es[key]), key
        assert ls[key].dtype == es[key].dtype, key
        assert ls[key].device == es[key].device, key
        assert torch.equal(ls[key], es[key]), key
    for (name, p), (_, q) in zip(lazy.named_parameters(), eager.named_parameters(), strict=True):
        assert type(p) is type(q) is nn.Parameter, name
        assert p.requires_grad == q.requires_grad, name
