"""The one rollback: everything a build may change in a model, and every random generator, put
back on failure.

:func:`atomic` is the rollback every door uses (a first call, a layer's build, ``build``,
``materialize``, a queue's run): what runs inside it happens whole, or not at all. It takes a
:class:`Snapshot` of each model given and a :class:`RandomState`, and on any exception restores
them, so that "on any failure the model and every random generator are left as they were"
holds by construction. A :class:`Snapshot` holds:

* each module's class and attribute dict (``in_features``, hook handles, ``training``...);
* the content of every dict, set and list a module holds (``_parameters``, ``_buffers``,
  ``_modules``, every hook dict, lazynn's own records), restored in place and in order;
* each lazy layer's :class:`~lazynn._module.state.LazyState` (its fields, restored in place);
* each placeholder's data, class and attributes (a build fills placeholders in place);
* the value of each real buffer a lazy layer keeps before its build (``known_buffers``:
  ``num_batches_tracked``), which a build resets and a first call's forward counts in place;
* with ``values=True``, the value of every real tensor (work that may write any of them: a
  queued initialization);
* with ``reach=True``, everything a forward may write that the modules reach, to any depth
  (``reach.py``). A rehearsal, which runs the model's own forward, takes this one: what it
  changes is put back after, whatever happened.

``restore`` writes back only what differs from the snapshot (a container, an attribute dict),
which it cannot tell another thread's writes from the run's: a change another thread makes
meanwhile to what the snapshot holds is undone too.
"""

from __future__ import annotations

import contextlib
import random
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .reach import Reach, put_back
from .state import Context, LazyState
from .tensors import is_placeholder, own_slots, own_tensors, raw

__all__ = [
    "EveryRandom",
    "OtherRandom",
    "RandomState",
    "Snapshot",
    "atomic",
    "continue_builds",
    "weak",
]

#: weak proxies: nothing of the model's (a trainer's back reference), and not to be read
_PROXIES = frozenset({weakref.ProxyType, weakref.CallableProxyType})
#: attribute types that hold nothing a snapshot must copy
_PLAIN = frozenset({bool, int, float, str, type(None), torch.device, torch.dtype})


class Snapshot:
    """The restorable state of ``root`` and every module below it.

    >>> import torch, lazynn
    >>> layer = lazynn.LazyLinear(2)
    >>> snap = Snapshot(layer)
    >>> _ = layer(torch.ones(1, 3))
    >>> snap.restore()
    >>> layer
    LazyLinear(in_features=?, out_features=2, bias=True)
    """

    def __init__(self, root: nn.Module, values: bool = False, reach: bool = False) -> None:
        self.modules: list[tuple[nn.Module, type, dict[str, Any]]] = []
        self.containers: list[tuple[Any, Any]] = []
        self.states: list[tuple[LazyState, LazyState]] = []
        self.tensors: list[tuple[torch.Tensor, type, torch.Tensor, dict[str, Any]]] = []
        self.values: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._own: dict[int, dict[str, torch.Tensor | None]] = {}
        kept: set[int] = set()
        # (a layer without submodules, a first call's common case, needs no walk)
        for module in root.modules() if root._modules else (root,):
            names = (
                [name for _, name, _ in own_slots(module)]
                if values
                else getattr(type(module), "known_buffers", ())
            )
            for name in names:
                known = module._parameters.get(name, module._buffers.get(name))
                if (
                    known is not None
                    and not is_placeholder(known)
                    and not known.is_meta
                    and id(known) not in kept
                ):
                    kept.add(id(known))
                    self.values.append((known, known.detach().clone()))
            attrs = dict(module.__dict__)
            self._own[id(module)] = {**module._parameters, **module._buffers}
            self.modules.append((module, module.__class__, attrs))
            for value in attrs.values():
                kind = type(value)
                if kind in _PLAIN or kind in _PROXIES:  # (most of a module's attributes;
                    continue  # a weak proxy, which a dead one's isinstance refuses)
                if kind is OrderedDict or isinstance(value, dict):
                    # (an empty one, most hook dicts, is put back by clearing it)
                    self.containers.append((value, dict(value) if value else None))
                elif isinstance(value, (set, list)):
                    self.containers.append((value, type(value)(value) if value else None))
                elif isinstance(value, LazyState):
                    self.states.append((value, value.copy()))
            for tensor in own_tensors(module):
                if is_placeholder(tensor):
                    self.tensors.append(
                        (tensor, tensor.__class__, raw(tensor), dict(tensor.__dict__))
                    )
        self.reach = Reach(self.modules, self.containers) if reach else None

    def original_tensors(self, module: nn.Module) -> dict[str, torch.Tensor | None]:
        """The module's own parameters and buffers as they were at the snapshot."""
        return self._own.get(id(module), {})

    def restore(self) -> None:
        """Put every recorded module, container and placeholder back as it was."""
        for module, cls, attrs in self.modules:
            if module.__class__ is not cls:
                module.__class__ = cls
            put_back(module.__dict__, attrs)
        for container, content in self.containers:
            put_back(container, content)
        if self.reach is not None:
            self.reach.restore()
        for state, saved in self.states:
            state.restore(saved)
        for tensor, cls, data, tensor_attrs in self.tensors:
            with torch._C.DisableTorchFunctionSubclass():
                tensor.data = data
            tensor.__class__ = cls
            tensor.__dict__.clear()
            tensor.__dict__.update(tensor_attrs)
        with torch.no_grad():
            for tensor, value in self.values:
                if tensor.shape != value.shape or tensor.dtype != value.dtype:
                    tensor.data = value  # (replaced by one of another shape: parametrized)
                elif not torch.equal(tensor, value):  # (unchanged: no write, as under torch.func)
                    tensor.copy_(value)


class RandomState:
    """The state of every random generator a build may draw from: the CPU generator, and
    each CUDA device's once CUDA is initialized (``restore()`` puts them back).

    >>> import torch
    >>> saved = RandomState()
    >>> _ = torch.rand(3)
    >>> saved.restore()
    >>> torch.equal(saved.cpu, torch.get_rng_state())
    True
    """

    def __init__(self) -> None:
        # (a clone of the generator: no state tensor is made unless it is asked for)
        self._cpu = torch.default_generator.clone_state()
        cuda = torch.cuda.is_initialized() and torch.cuda.is_available()
        self.cuda = torch.cuda.get_rng_state_all() if cuda else None

    @property
    def cpu(self) -> torch.Tensor:
        """The CPU generator's state, as ``torch.get_rng_state()`` gives it."""
        return self._cpu.get_state()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)

    def same_as(self, other: RandomState) -> bool:
        """Whether both hold the same generator states."""
        if not torch.equal(self.cpu, other.cpu):
            return False
        if self.cuda is None or other.cuda is None:
            return self.cuda is other.cuda
        return all(torch.equal(a, b) for a, b in zip(self.cuda, other.cuda, strict=True))


@contextlib.contextmanager
def atomic(
    *models: nn.Module,
    values: bool = False,
    undo: Callable[[], None] | None = None,
    others: bool = True,
) -> Iterator[None]:
    """What runs inside happens whole, or not at all: on any exception, ``undo()`` runs (a
    step the snapshot cannot see), then every module below each of ``models`` is put back as it
    was (``values``: the values of its real tensors too) and every random generator (torch's;
    Python's and numpy's unless ``others`` is False: a caller that runs only torch's code,
    which never draws from them, saves their snapshot), and the exception propagates. A caller
    that holds no model passes none (generators only).

    >>> import torch, lazynn
    >>> layer = lazynn.LazyLinear(2)
    >>> before = torch.get_rng_state()
    >>> try:
    ...     with atomic(layer):
    ...         _ = layer(torch.ones(1, 3))  # builds it, drawing its weights
    ...         raise KeyError("a later step fails")
    ... except KeyError:
    ...     pass
    >>> lazynn.is_lazy(layer), torch.equal(torch.get_rng_state(), before)
    (True, True)
    """
    snapshots = [Snapshot(model, values=values) for model in models]
    rng = RandomState()
    outside = OtherRandom() if others else None  # (the code may draw from Python's, numpy's)
    try:
        yield
    except BaseException:
        if undo is not None:
            undo()
        for snapshot in snapshots:
            snapshot.restore()
        rng.restore()
        if outside is not None:
            outside.restore()
        raise


class OtherRandom:
    """The random states outside torch that a model's code may draw from (Python's ``random``,
    numpy's global generator, once numpy is imported): ``restore()`` puts each back, only if
    it moved (a draft's draws are not the program's).

    >>> import random
    >>> saved = OtherRandom()
    >>> _ = random.random()
    >>> saved.restore()
    >>> saved.python == random.getstate()
    True
    """

    def __init__(self) -> None:
        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = numpy.random.get_state() if numpy is not None else None

    def restore(self) -> None:
        if random.getstate() != self.python:
            random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            now = numpy.random.get_state()
            if any(_differs(a, b) for a, b in zip(now, self.numpy, strict=True)):
                numpy.random.set_state(self.numpy)


class EveryRandom:
    """Every generator a model's code may draw from: torch's (:class:`RandomState`) and
    Python's and numpy's (:class:`OtherRandom`); ``restore()`` puts them all back.

    >>> import random, torch
    >>> saved = EveryRandom()
    >>> _ = torch.rand(2), random.random()
    >>> saved.restore()
    >>> torch.equal(saved.torch.cpu, torch.get_rng_state())
    True
    """

    def __init__(self) -> None:
        self.torch, self.others = RandomState(), OtherRandom()

    def restore(self) -> None:
        self.torch.restore()
        self.others.restore()


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool((a != b).any()) if hasattr(a, "any") else bool(a != b)
    except (TypeError, ValueError):
        return True


def continue_builds(here: Context, scope: Any, forward: RandomState) -> None:
    """Inside ``torch.utils.checkpoint``, for a call of ``scope`` (the model, or the
    checkpointed function; ``forward``: the generator's state now): go on with the builds' own
    stream if the last such build was of the same scope (the blocks of one model, checkpointed
    one after another, get the weights of consecutive constructions); else the builds draw
    from here."""
    if here.build_stream is not None:
        owner, _, stream = here.build_stream
        if owner() is scope:
            stream.restore()


def end_builds(here: Context, calling: Callable[[Any], bool]) -> None:
    """Outside ``torch.utils.checkpoint``: a build in the call of the model whose checkpointed
    blocks built before it goes on with their stream, and leaves the generator at its end
    (the model's builds draw one stream, in order, as a first call without checkpointing
    draws them); ``calling(owner)`` tells whether that model's call is on the stack."""
    if here.build_stream is None:
        return
    owner, _, stream = here.build_stream
    here.build_stream = None  # (the generator goes on from the stream's end: one stream again)
    model = owner()
    if model is not None and calling(model):
        stream.restore()


def weak(value: Any) -> Callable[[], Any]:
    """A weak reference to ``value`` (one that is always None where it takes none)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: None
