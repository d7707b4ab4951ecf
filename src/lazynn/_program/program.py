"""Each tensor's init program, kept in the module that holds it.

A model built on meta keeps, in each module, a :class:`Program` for each of its own meta
tensors (parameters, buffers, tensors kept as plain attributes): the tape of the construction
that made it, where on that tape its value is, and the Python attributes the construction
gave it (Mamba's ``A_log._no_weight_decay``). The record lives in the module's ``__dict__``
under :data:`PROGRAM_KEY`, so it follows the module wherever it goes: into a wrapper
(``nn.Sequential(model)``, ``fully_shard``, ``parallelize_module``, which replace the tensors
but keep the modules), through ``copy.deepcopy`` (the copy's programs name the copy's
tensors: a tape names storages, not tensors) and through ``pickle`` / ``torch.save``.
``lazynn.materialize`` runs them (:func:`programs`), then drops them.

>>> import torch
>>> from lazynn._program.record import Recorder
>>> with torch.device("meta"), Recorder() as recorder:
...     layer = torch.nn.Linear(3, 2)
>>> attach(layer, recorder)
>>> sorted(name for _, name, _ in programs(layer))
['bias', 'weight']
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .record import Recorder
from .tape import Tape, View

__all__ = ["PROGRAM_KEY", "Program", "attach", "drop", "loaded", "programs", "tensor_slots"]

#: the attribute of a module that holds its tensors' programs, by name
PROGRAM_KEY = "_lazynn_programs"
#: the attribute of a module that holds the names of those tensors a checkpoint loaded since
LOADED_KEY = "_lazynn_loaded"


@dataclass(frozen=True)
class Program:
    """How a tensor was made: its place on ``tape``, and its Python attributes then."""

    tape: Tape
    view: View
    attrs: dict[str, Any] = field(default_factory=dict)
    #: a parameter (and whether it requires grad), or a buffer / attribute
    parameter: bool = False
    requires_grad: bool = False


def tensor_slots(module: nn.Module) -> Iterator[tuple[dict[str, Any], str, torch.Tensor]]:
    """(the dict holding it, its name, the tensor) for each of the module's own tensors:
    parameters, buffers, and tensors kept as plain attributes (``freqs_cis``)."""
    stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
    for store in stores:
        for name, tensor in list(store.items()):
            if tensor is not None:
                yield store, name, tensor
    for name, value in list(module.__dict__.items()):
        if isinstance(value, torch.Tensor):
            yield module.__dict__, name, value


def attach(model: nn.Module, recorder: Recorder) -> None:
    """Give every module of ``model`` the programs of its own meta tensors that the
    recording made."""
    for module in model.modules():
        found = {}
        for _, name, tensor in tensor_slots(module):
            if tensor.is_meta and recorder.knows(tensor):
                attrs = {k: v for k, v in tensor.__dict__.items() if not k.startswith("_lazynn")}
                found[name] = Program(
                    recorder.tape,
                    recorder.view_of(tensor),
                    attrs,
                    isinstance(tensor, nn.Parameter),
                    bool(tensor.requires_grad),
                )
        if found:
            if PROGRAM_KEY not in module.__dict__:
                module.register_load_state_dict_pre_hook(_note_loaded)
            module.__dict__[PROGRAM_KEY] = {**module.__dict__.get(PROGRAM_KEY, {}), **found}


def _note_loaded(module: nn.Module, state_dict: Any, prefix: str, *rest: Any) -> None:
    """A checkpoint loads into ``module``: note which of its tensors that keep a program it
    gives (a tensor replaced since the build, not by a load, is refused: ``to_empty`` leaves
    uninitialized memory)."""
    kept = module.__dict__.get(PROGRAM_KEY, {})
    names = {name for name in kept if prefix + name in state_dict}
    if names:
        module.__dict__[LOADED_KEY] = frozenset(module.__dict__.get(LOADED_KEY, ())) | names


def loaded(module: nn.Module) -> frozenset[str]:
    """The names of ``module``'s tensors that keep a program and that a checkpoint loaded."""
    return frozenset(module.__dict__.get(LOADED_KEY, ()))


def programs(model: nn.Module) -> Iterator[tuple[nn.Module, str, Program]]:
    """(module, tensor name, program) for each program kept in ``model``."""
    for module in model.modules():
        for name, program in module.__dict__.get(PROGRAM_KEY, {}).items():
            yield module, name, program


def drop(module: nn.Module, name: str) -> None:
    """Forget the program of ``module``'s tensor ``name`` (it has its value now)."""
    kept = module.__dict__.get(PROGRAM_KEY)
    if kept is not None:
        kept.pop(name, None)
        if not kept:  # (the last: the module is plain torch.nn again)
            del module.__dict__[PROGRAM_KEY]
            module.__dict__.pop(LOADED_KEY, None)
            hooks = module._load_state_dict_pre_hooks
            for key in [k for k, h in hooks.items() if getattr(h, "hook", h) is _note_loaded]:
                del hooks[key]
