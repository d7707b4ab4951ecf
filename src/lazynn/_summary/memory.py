"""training_memory(): the bytes one training step needs, estimated on meta.

Method. The estimate runs the model itself, as a rehearsal does (``_rehearsal/rehearse.py``):
under the build lock, its lazy layers built on meta for the run (a lazy layer the forward
does not reach stays unbuilt and is not counted), its tensors seen through stand-ins on this
thread only (``_rehearsal/stand_ins.py``: here fake CPU tensors of their shapes and dtypes,
tied tensors one tensor), and everything the run changed in the model, and in the state its
modules reach, put back after (``Snapshot(reach=True)``); then:

- ``params``: the bytes of the model's parameters and buffers, each tensor once (a tied
  weight once), ``numel * itemsize``;
- ``gradients``: the same for the trainable parameters (a gradient has its parameter's
  dtype and shape), counted for every trainable parameter, reached by the forward or not;
- ``activations``: one forward of the copy, in training mode with grad enabled, inside
  ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves for the backward
  is kept, and the bytes of each distinct *storage* are summed (``untyped_storage().nbytes()``:
  a saved view keeps its whole storage alive; two ops saving one tensor count it once),
  leaving out the storages of the model's parameters and buffers (counted in ``params``).
  The example input counts when autograd saves it. The forward runs on *fake CPU tensors*
  (torch.compile's ``FakeTensorMode``: meta storage, no data, but the device a CPU is), so
  every kernel choice is the CPU's: on plain meta tensors ``scaled_dot_product_attention``
  takes the math kernel and saves the ``T x T`` attention weights, where a CPU (like a GPU)
  takes flash attention. Two CPU kernels keep more than their outputs' shapes show, and are
  given the CPU's sizes (``kernels.py``): oneDNN's LSTM its workspace (every step's gates and
  states), EmbeddingBag an ``offset2bag`` one element longer. Storages are told apart by the
  identity of their ``StorageImpl`` (``StorageWeakRef``), since the data pointer of every meta
  storage is 0;
- ``optimizer_states``: the optimizer is constructed on meta copies of the trainable
  parameters, each is given a meta ``.grad`` and one ``step()`` runs; the bytes of every tensor in
  ``optimizer.state`` are summed, each tensor once (``step`` counters included: torch keeps
  those on the CPU, a few bytes each).

Nothing of the model's size is allocated, the model is left exactly as it was, and every
random generator is restored.

Limits: this counts tensors, not what an allocator reserves: no allocator rounding (the CUDA
caching allocator rounds each block up, to 512 bytes and more, and keeps freed blocks
cached), no kernel workspaces (cuBLAS, cuDNN), no temporaries a forward frees before it
ends, no peak within the backward (gradients of activations, freed as it goes). Saved
tensors are counted as the forward saves them: an in-place op that later changes a saved
tensor's storage does not change the count, and activation checkpointing, offloading,
mixed precision (autocast) and ``torch.compile`` are not modelled (run the estimate on the
model as it will be trained). Kernels are chosen as on a CPU: a GPU may choose others
that save other tensors (memory-efficient or cuDNN attention, cuDNN's batch norm and
LSTM workspace). A
forward that reads values (``.item()``, data-dependent shapes) cannot run and is refused,
and so, before anything runs, is an optimizer whose step cannot stand on meta (``LBFGS``
needs a closure, ``SparseAdam`` sparse gradients); ``ASGD`` and ``Adafactor`` read values of
the state they create, which is counted as created; ``Muon`` takes 2-D parameters only.

>>> import torch, lazynn
>>> from torch import nn
>>> model = nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(2))
>>> memory = training_memory(model, ((4, 16),), optimizer="adamw")
>>> memory.params, memory.gradients, memory.optimizer_states
(616, 616, 1248)
>>> memory.activations        # the input (4, 16) and the ReLU's output (4, 8), float32
384
>>> lazynn.is_lazy(model)     # the model itself is untouched
True
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# FakeTensorMode: private (torch.compile's fake tensors), no public equivalent; see _activations
from torch._subclasses.fake_tensor import FakeTensorMode

# StorageWeakRef: torch's own key for "the same storage" (fake tensors and functionalization
# use it); it compares StorageImpl addresses, which tell meta storages apart. Public module.
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from .._errors import Fix, InferenceError, LazynnError, first_line, message, meta_limitation
from .._layer.base import LazyLayer
from .._module.lifecycle import build_lazy_module, finish, is_unbuilt
from .._module.placeholder import is_lazy
from .._module.snapshot import RandomState, Snapshot
from .._module.state import BUILD_LOCK, Rehearsing, context
from .._module.tensors import is_placeholder, map_tensors
from .._rehearsal.collector import paused
from .._rehearsal.rehearse import first_paths as _first_paths
from .._rehearsal.rehearse import rehearse
from .._rehearsal.spec import Spec, as_meta
from .._rehearsal.stand_ins import StandIns, meta_version, placeholders_on_meta
from .kernels import CpuKernels

__all__ = ["Memory", "optimizer_class", "supported_optimizers", "training_memory"]

#: the learning rate given to an optimizer whose constructor requires one, when none is given
DEFAULT_LR = 1e-3


@dataclass(frozen=True)
class Memory:
    """Bytes a training step needs, estimated on meta (nothing allocated)."""

    params: int  # parameters and buffers, each tensor once (tied weights once)
    gradients: int  # gradients of the trainable parameters (each its parameter's dtype)
    optimizer_states: int  # every tensor in optimizer.state after one step
    activations: int  # storages autograd saves for backward in one forward of the example
    optimizer: str  # the optimizer's class name, e.g. "AdamW"

    @property
    def total(self) -> int:
        """``params + gradients + optimizer_states + activations``."""
        return self.params + self.gradients + self.optimizer_states + self.activations

    def to_dict(self) -> dict[str, Any]:
        """The figures by name, ``total`` included."""
        return {
            "params": self.params,
            "gradients": self.gradients,
            "optimizer_states": self.optimizer_states,
            "activations": self.activations,
            "total": self.total,
            "optimizer": self.optimizer,
        }


def training_memory(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    example_kwargs: dict[str, Any] | None = None,
    optimizer: str | type[torch.optim.Optimizer] = "adamw",
    optimizer_kwargs: dict[str, Any] | None = None,
    paged: bool = True,
) -> Memory:
    """Estimate the memory of one training step of ``model`` on the examples, on meta.

    Args:
        model: built, unbuilt (lazy) or mixed; on any device, meta included. Not changed.
        example_inputs: the forward's positional inputs, as :func:`lazynn.build` takes them
            (tensors, shapes, :class:`lazynn.Spec`, structures of these).
        example_kwargs: the forward's keyword inputs, likewise.
        optimizer: a ``torch.optim.Optimizer`` subclass, or the name of one in
            ``torch.optim`` in any case (``"adamw"``, ``"sgd"``...).
        optimizer_kwargs: passed to its constructor (``lr`` defaults to 1e-3 when the
            constructor requires one).
        paged: an LSTM's oneDNN workspace as oneDNN lays it out, each part on 4 KiB pages
            (False: its parts alone, linear in the batch, for figures per sample).

    Raises:
        LazynnError: an unknown optimizer name, or an optimizer that cannot step on meta;
            :class:`~lazynn.InferenceError` if the model cannot be built or run on the
            examples.
    """
    cls = optimizer_class(optimizer)
    example_inputs = _as_inputs(example_inputs)
    kwargs = dict(example_kwargs or {})
    saved_rng = RandomState()
    # (the build lock: no build changes the model meanwhile; the snapshot puts back what
    # the run changes, whatever happens)
    with paused(), BUILD_LOCK, torch.inference_mode(False):
        snapshot = Snapshot(model, reach=True)
        try:
            assert snapshot.reach is not None
            return _estimated(
                model, snapshot.reach.tensors, cls, example_inputs, kwargs, optimizer_kwargs, paged
            )
        finally:
            snapshot.restore()
            saved_rng.restore()


def _estimated(
    model: nn.Module,
    tensors: list[torch.Tensor],
    cls: type[torch.optim.Optimizer],
    example_inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    optimizer_kwargs: dict[str, Any] | None,
    paged: bool,
) -> Memory:
    """:func:`training_memory` on ``model`` itself (``tensors``: the real tensors it reaches),
    which the caller puts back after."""
    with placeholders_on_meta(_first_paths(model)):  # (back as they were, on exit)
        if is_lazy(model):  # built on meta from a rehearsal of its own (lazy layers the forward
            # does not reach stay unbuilt, and are not counted)
            learnt = rehearse(model, example_inputs, kwargs)
            for layer, found in learnt.sizes.items():
                if isinstance(layer, LazyLayer) and is_unbuilt(layer):
                    layer._lazynn_build(found)
                    finish(layer)
            for module, (a, k) in learnt.inputs.items():  # (torch's lazy modules, mixins)
                if is_unbuilt(module):
                    with torch.device("meta"):
                        build_lazy_module(module, a, k)
        state = [t for t in _unique(model.parameters(), model.buffers()) if not is_placeholder(t)]
        trainable = [
            p for p in _unique(model.parameters()) if p.requires_grad and not is_placeholder(p)
        ]
        states = _optimizer_states(
            cls, [meta_version(p) for p in trainable], dict(optimizer_kwargs or {})
        )
        examples = tuple(as_meta(a) for a in example_inputs)  # (each: the tuple is no shape)
        activations = _activations(model, [*tensors, *state], examples, as_meta(kwargs), paged)
        return Memory(
            params=sum(t.nbytes for t in state),
            gradients=sum(p.nbytes for p in trainable),
            optimizer_states=states,
            activations=activations,
            optimizer=cls.__name__,
        )


def _as_inputs(examples: Any) -> tuple[Any, ...]:
    """The positional examples as a tuple: a lone tensor or Spec is one input; a bare shape
    is refused (is ``(4, 16)`` one input of that shape, or two integers?)."""
    if isinstance(examples, (torch.Tensor, Spec)):
        return (examples,)
    if isinstance(examples, torch.Size) or (
        isinstance(examples, tuple)
        and examples
        and all(isinstance(d, int) and not isinstance(d, bool) for d in examples)
    ):
        shape = tuple(examples)
        raise InferenceError(
            message(
                "training_memory(model, example_inputs)",
                "a tuple of the forward's positional inputs",
                f"{shape!r}, which reads as integers, not as a shape",
                f"wrap one input's shape in a tuple: training_memory(model, ({shape!r},))",
            )
        )
    return tuple(examples)


# --- the optimizer -------------------------------------------------------------------------
#: torch.optim classes the estimate refuses before anything runs, and why
_REFUSED = {
    "LBFGS": "its step() needs a closure that re-evaluates the loss (several forwards a "
    "step, and a history of flat vectors that grows over the steps), which one step on meta "
    "tensors cannot stand for",
    "SparseAdam": "it takes sparse gradients only (from nn.Embedding(sparse=True)), and the "
    "estimate gives every trainable parameter a dense one",
}
#: optimizers whose step reads values of the state it has just created (``.item()`` of ASGD's
#: ``eta`` and ``mu``, of the parameter's norm in Adafactor), which meta tensors do not hold:
#: their state is counted as created (tests/summary/test_training_memory.py checks it against real
#: steps)
_READ_VALUES = ("ASGD", "Adafactor")
#: the fix of an optimizer that refuses the model's parameters
_LIMITS = {
    "Muon": "Muon takes 2-D parameters only (a model's biases, norms and embeddings "
    "train with another optimizer)"
}


def _optimizers() -> dict[str, type[torch.optim.Optimizer]]:
    """torch.optim's optimizer classes, by lower-case name."""
    found = {}
    for name, value in vars(torch.optim).items():
        if (
            isinstance(value, type)
            and issubclass(value, torch.optim.Optimizer)
            and value is not torch.optim.Optimizer
        ):
            found[name.lower()] = value
    return dict(sorted(found.items()))


def supported_optimizers() -> list[str]:
    """The lower-case names of the torch.optim classes the estimate takes (not LBFGS nor
    SparseAdam, :data:`_REFUSED`)."""
    return [n for n, cls in _optimizers().items() if cls.__name__ not in _REFUSED]


def optimizer_class(optimizer: str | type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """The optimizer class for a name of torch.optim (any case) or a class (returned); an
    unknown name, or an optimizer the estimate cannot step (:data:`_REFUSED`), is refused.

    >>> optimizer_class("AdamW")
    <class 'torch.optim.adamw.AdamW'>
    """
    known = _optimizers()
    supported = supported_optimizers()
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        cls = optimizer
    elif isinstance(optimizer, str) and optimizer.lower() in known:
        cls = known[optimizer.lower()]
    else:
        close = difflib.get_close_matches(str(optimizer).lower(), supported, n=1)
        raise LazynnError(
            message(
                "training_memory(optimizer=...)",
                "a torch.optim.Optimizer subclass or the name of one: " + ", ".join(supported),
                repr(optimizer) + (f" (did you mean {close[0]!r}?)" if close else ""),
                "pass one of these names (any case) or an optimizer class",
                key=Fix.OPTIMIZER_NAME,
                value=optimizer,
            )
        )
    if cls.__name__ in _REFUSED and cls.__module__.startswith("torch.optim"):
        raise LazynnError(
            message(
                f"training_memory(optimizer={cls.__name__!r})",
                "an optimizer whose step the estimate can run on meta tensors: "
                + ", ".join(supported),
                f"{cls.__name__}: {_REFUSED[cls.__name__]}",
                "estimate with another optimizer: one of these names (any case) or a class",
                key=Fix.OPTIMIZER_REFUSED,
                value=cls.__name__,
            )
        )
    return cls


def _requires_lr(cls: type[torch.optim.Optimizer]) -> bool:
    try:
        lr = inspect.signature(cls).parameters.get("lr")
    except (TypeError, ValueError):  # (no signature to read)
        return False
    return lr is not None and lr.default is inspect.Parameter.empty


def _optimizer_states(
    cls: type[torch.optim.Optimizer], params: list[torch.Tensor], kwargs: dict[str, Any]
) -> int:
    """Bytes of ``cls``'s state after one step on meta ``params`` with meta gradients."""
    if "lr" not in kwargs and _requires_lr(cls):
        kwargs["lr"] = DEFAULT_LR
    if not params:  # nothing to train: no state (an optimizer refuses an empty list)
        return 0
    optimizer = None
    try:
        optimizer = cls(params, **kwargs)
        for p in params:
            p.grad = torch.empty_like(p)
        with torch.no_grad():
            optimizer.step()
    except Exception as error:
        created = optimizer is not None and all(p in optimizer.state for p in params)
        if not (
            created
            and meta_limitation(error)
            and cls.__name__ in _READ_VALUES
            and cls.__module__.startswith("torch.optim")
        ):
            raise _step_failed(cls, kwargs, error) from error
    assert optimizer is not None
    return sum(t.nbytes for t in _unique(_tensors_in(optimizer.state)))


def _step_failed(
    cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], error: Exception
) -> LazynnError:
    """The refusal of an optimizer that failed to construct or step on meta."""
    others = [n for n in ("adamw", "sgd", "adagrad") if n != cls.__name__.lower()]
    fix = (
        f"estimate with another optimizer: optimizer={others[0]!r} (or "
        f"{', '.join(repr(n) for n in others[1:])})"
        + (", or other optimizer_kwargs" if kwargs else "")
    )
    if cls.__name__ in _LIMITS:
        fix = f"{_LIMITS[cls.__name__]}: {fix}"
    return LazynnError(
        message(
            f"training_memory(optimizer={cls.__name__!r})",
            "an optimizer that can be constructed with "
            f"{kwargs or 'its defaults'} and take one step on meta tensors",
            f"{cls.__name__}, which failed",
            fix,
            detail=f"{type(error).__name__}: {first_line(error)}",
            key=Fix.OPTIMIZER_FAILED,
            value=(cls.__name__, tuple(others), _LIMITS.get(cls.__name__, "")),
        )
    )


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value)


# --- the meta copy -------------------------------------------------------------------------
def _unique(*groups: Iterator[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors, each object once, in order."""
    seen: dict[int, torch.Tensor] = {}
    for group in groups:
        for tensor in group:
            seen.setdefault(id(tensor), tensor)
    return list(seen.values())


# --- the activations -----------------------------------------------------------------------
def _fake(tensor: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor of ``tensor``'s shape, strides and dtype (a parameter's: a parameter),
    made under the estimate's ``FakeTensorMode``."""
    fake = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="cpu")
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(fake, tensor.requires_grad)
    return fake.requires_grad_(tensor.requires_grad)


class _Seen(TorchFunctionMode):
    """The model's tensors seen through their fake stand-ins on this thread (see
    ``_rehearsal/stand_ins.py``)."""

    def __init__(self, seen: StandIns) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", None)
        return self.seen.through(name, args, kwargs or {}, lambda a, k: func(*a, **k))


def _storage_key(tensor: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(tensor.untyped_storage())


def _activations(
    model: nn.Module,
    tensors: list[torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    paged: bool,
) -> int:
    """Bytes of the storages autograd saves in one training-mode forward of ``model``, whose
    ``tensors`` (its parameters and buffers first, then any other it reaches) this thread sees
    as fake CPU tensors, except the storages of its parameters and buffers; the CPU kernels'
    own (``kernels.py``)."""
    # FakeTensorMode is private (torch.compile's own fake tensors; no public equivalent):
    # fake CPU tensors hold no memory and, unlike meta tensors, make every choice a CPU
    # makes by device (scaled_dot_product_attention's kernel: flash on a CPU, math on meta).
    with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cpu"):
        seen = StandIns(tensors, make=_fake)
        state = [
            seen.of(t)
            for t in _unique(model.parameters(), model.buffers())
            if not is_placeholder(t)  # (a lazy layer the forward does not reach)
        ]
        args, kwargs = map_tensors(_fake, args), map_tensors(_fake, kwargs)
        # Kept alive to the end: a freed StorageImpl's address could be reused by another.
        saved: dict[StorageWeakRef, torch.Tensor] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            saved.setdefault(_storage_key(tensor), tensor)
            return tensor

        def unpack(tensor: torch.Tensor) -> torch.Tensor:
            return tensor

        model.train()  # (the modes are put back with the model)
        here = context()
        # (a run of its own: a rehearsal whose forward asked for this estimate records none
        # of its calls)
        outer, here.rehearsal = here.rehearsal, Rehearsing(stand_ins=seen)
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(pack, unpack),
            CpuKernels(paged),
            _Seen(seen),
        ):
            try:
                model(*args, **kwargs)
            except LazynnError:
                raise
            except Exception as error:
                raise InferenceError(
                    message(
                        "training_memory",
                        "a model whose training forward runs on fake (meta-like) tensors",
                        f"a forward that failed with {type(error).__name__}",
                        "make the forward independent of tensor values (no .item(), no "
                        "data-dependent shapes) and of tensors held outside parameters, "
                        "buffers and module attributes",
                        detail=first_line(error),
                    )
                ) from error
            finally:
                here.rehearsal = outer
        excluded = {_storage_key(t) for t in state}
        return sum(t.untyped_storage().nbytes() for k, t in saved.items() if k not in excluded)
