"""lazynn's state, in one place: the build lock, each thread's context, each lazy module's.

* :data:`BUILD_LOCK`: one re-entrant lock for every build, rehearsal, allocation and queue
  run in the process (docs/design.md, "Threads", says what it guards).
* :func:`context`: what the current thread is doing (a rehearsal, a build, a queue run...),
  one :class:`Context` per thread.
* :class:`LazyState`: what an unbuilt lazy layer knows, under the one attribute
  ``module.__dict__["_lazynn"]``; the build deletes it with the rest of the machinery.
* :func:`record_construction`: the CPU generator's state at each lazy module's construction,
  for ``build``'s replay of an eager construction.
* :class:`Drafting` / :class:`Constructing`: the two runs of a model's factory in
  ``lazynn.build(Net, ...)`` (``_build/factory.py``), as the lazy layers it constructs see them.

>>> context().builds
0
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "BUILD_LOCK",
    "QUEUE_KEY",
    "STATE_KEY",
    "WAITING",
    "Constructing",
    "Context",
    "Drafting",
    "Entry",
    "LazyState",
    "Rehearsing",
    "constructed",
    "context",
    "find_state",
    "lazy_state",
    "next_order",
    "note_built",
    "record_construction",
]

#: One lock for every materialization in the process. A build happens once per module, so
#: contention is negligible; one re-entrant lock cannot deadlock when a lazy module builds
#: lazy children.
BUILD_LOCK = threading.RLock()


#: The attribute of an unbuilt lazy layer that holds its :class:`LazyState`.
STATE_KEY = "_lazynn"
#: The attribute of a module that holds its ``lazynn.on_build`` queue (``_build/queue.py``; not a
#: "_lazynn" name, which a lazy layer's build deletes)
QUEUE_KEY = "_on_build_queue"


@dataclass
class Rehearsing:
    """A meta rehearsal in progress on this thread: what each lazy layer read."""

    #: id(layer) -> the sizes it read (and, for a rank-agnostic layer, the class it chose)
    sizes: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: id(layer) -> why a size it read may not be the one meant (``_layer.infer.ambiguity``)
    notes: dict[int, str] = field(default_factory=dict)
    #: its FLOP counter's running total (None: it counts none)
    counted: Callable[[], int] | None = None
    #: FLOPs that counter counted which are not the forward's: lazynn's own work the forward
    #: called (a summary or build of a submodule, which count their own), and whether such
    #: work is running now (``_rehearsal.rehearse.apart``)
    apart: int = 0
    aside: bool = False
    #: how its forward sees the model's real tensors (``_rehearsal.stand_ins.StandIns``),
    #: shared by a rehearsal its forward runs
    stand_ins: Any = None


@dataclass(frozen=True)
class Entry:
    """A lazy layer the factory's first run constructed: its class and arguments, and the
    sizes the rehearsal gave it (None: the forward never called it)."""

    cls: type
    kwargs: dict[str, Any]
    sizes: dict[str, Any] | None = None
    #: its path in the first run's model, for messages ("" if it is not in the model)
    path: str = ""


@dataclass
class Drafting:
    """The factory's first run (on meta): each lazy layer it constructs is numbered, in
    construction order, and lays out placeholders that stand for meta tensors of its probe
    sizes, so the model's own ``__init__`` code runs on them (drawing nothing)."""

    #: the lazy layers constructed, in order (a layer's ``LazyState.index`` is its position)
    entries: list[Entry] = field(default_factory=list)
    #: id(placeholder) -> (the placeholder, the shape of the eager tensor it replaced): a lazy
    #: layer's weight tied into an eager module (``wte.weight = lm_head.weight``)
    ties: dict[int, tuple[torch.Tensor, torch.Size]] = field(default_factory=dict)
    #: the sizes an earlier run's rehearsal learnt, by layer number: those layers are laid
    #: out with them, for their probes (code that reads their sizes, ``nn.Linear(
    #: self.fc1.in_features, 8)``, reads them)
    known: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: the call that runs the factory, for errors (``lazynn.build(factory)``)
    where: str = "lazynn.build(factory)"
    #: layer number -> (the layer, the sizes it was last built with) for lazy layers the
    #: factory's ``__init__`` itself builds (``lazynn.build(inner, x)`` inside it): those
    #: still built when the run ends take their sizes from there
    built: dict[int, tuple[nn.Module, dict[str, Any]]] = field(default_factory=dict)
    #: the numbers of the lazy layers laid out as their eager class, on meta (with the sizes
    #: ``known`` gives, else stand-ins): a step of ``__init__`` needs their tensors
    #: (``weight_norm``), which placeholders cannot give
    eager: set[int] = field(default_factory=set)
    #: the lines of code (file, line) whose lazy layers are laid out so too: those that
    #: constructed one a step needed (a loop's, a helper's layers share the step)
    eager_sites: set[tuple[str, int]] = field(default_factory=set)
    #: layer number -> the line of code outside lazynn that constructed it
    sites: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: layer number -> the layer, for those laid out eager (no longer lazy, each reads its
    #: sizes in a rehearsal through a hook of this run)
    laid: dict[int, nn.Module] = field(default_factory=dict)
    #: id(placeholder) -> the number of the lazy layer that holds it
    owners: dict[int, int] = field(default_factory=dict)


@dataclass
class Constructing:
    """The factory's second run: the k-th lazy layer constructed becomes ``entries[k]``'s
    eager class, constructed for real with its sizes, as the eager program constructs it."""

    entries: list[Entry]
    #: how many lazy layers this run has constructed
    position: int = 0


@dataclass
class Context:
    """What this thread is doing inside lazynn."""

    #: the meta rehearsal running (``lazynn.build`` / ``summary``), or None
    rehearsal: Rehearsing | None = None
    #: how many builds (``_infer_parameters``) are running, nested
    builds: int = 0
    #: ids of the modules built during the current first call (``LazyModuleMixin.__call__``)
    built_here: set[int] | None = None
    #: ids of the modules whose current first call has snapshotted them (their build need
    #: not snapshot again: the first call puts everything back on any failure)
    covered: set[int] = field(default_factory=set)
    #: whether a refusal is being worded (wording it hashes placeholders: not again)
    wording: bool = False
    #: warnings of builds inside the current first call, held until its forward succeeds
    #: (a rolled-back first call warns nothing)
    held_warnings: list[str | Warning] | None = None
    #: a run of a model's factory (``lazynn.build(Net, ...)``), or None
    program: Drafting | Constructing | None = None
    #: whether checkpoint loads build layers as eager constructions (drawing their numbers,
    #: running their kept initializations) rather than allocating them uninitialized: work
    #: queued with ``on_build`` runs on them before the values are copied
    loading_for_queue: bool = False
    #: the last build inside ``torch.utils.checkpoint``: (a weak reference to the function
    #: checkpointed, the generator state it left for the forward, the state its own draws
    #: ended at), so the next one in the same checkpoint continues those draws
    #: (``snapshot.continue_builds``; the states are ``snapshot.RandomState``)
    build_stream: tuple[Any, Any, Any] | None = None
    #: the function modes lazynn entered on this thread (a rehearsal's meta device, a draft's
    #: meta device and recorder), which its own work on a layer steps out of
    #: (``lifecycle.own_work``)
    own_modes: list[object] = field(default_factory=list)
    #: the modules whose queued functions (``on_build``) are running on this thread: a call
    #: of one of them inside such a function runs no other of its functions first (eager
    #: code runs each to its end, in order)
    queue_scopes: list[nn.Module] = field(default_factory=list)


_LOCAL = threading.local()


def context() -> Context:
    """This thread's :class:`Context`."""
    found: Context | None = getattr(_LOCAL, "context", None)
    if found is None:
        found = _LOCAL.context = Context()
    return found


@dataclass(eq=False)
class LazyState:
    """What an unbuilt ``LazyLayer`` knows (its sizes are what it does not)."""

    #: constructor arguments, without the inferred ones, device and dtype
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: the device it was declared on (placeholders record where they were moved since)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: the floating dtype it was declared with
    dtype: torch.dtype = torch.float32
    #: (submodule path, tensor name) -> the placeholder made at construction
    placeholders: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    #: this instance's own inferred arguments (``dims=``, undeclared ``kdim``), or None for
    #: the class's ``inferred``
    specs: Mapping[str, Any] | None = None
    #: a rank-agnostic layer: the input ranks it accepts, and its arguments for ``repr``
    ranks: tuple[int, ...] = ()
    shown: tuple[Any, ...] | None = None
    #: the CPU generator's state at construction (shared with the lazy modules constructed
    #: right before it, while nothing drew in between)
    rng: torch.Tensor | None = None
    #: construction number: copies (``deepcopy``) keep it, so ``build`` gives copies built
    #: together the values of the first, as eager copies have
    birth: int = -1
    #: (class, sizes) -> the shape of each tensor of the layer built with them: derived, so
    #: copies share it and a rollback leaves it
    shapes: dict[Any, dict[tuple[str, str], torch.Size]] = field(default_factory=dict)
    #: its number in a factory's first run (``Drafting``), or -1; copies keep it
    index: int = -1

    def copy(self) -> LazyState:
        """An independent copy (its own dicts), for a copy of the module."""
        return LazyState(
            kwargs=dict(self.kwargs),
            device=self.device,
            dtype=self.dtype,
            placeholders=dict(self.placeholders),
            specs=self.specs,
            ranks=self.ranks,
            shown=self.shown,
            rng=self.rng,
            birth=self.birth,
            shapes=self.shapes,
            index=self.index,
        )

    def restore(self, saved: LazyState) -> None:
        """Take back every field of ``saved`` (a :meth:`copy`), in place."""
        self.kwargs.clear()
        self.kwargs.update(saved.kwargs)
        self.placeholders.clear()
        self.placeholders.update(saved.placeholders)
        self.device, self.dtype, self.specs = saved.device, saved.dtype, saved.specs
        self.ranks, self.shown, self.rng, self.birth, self.index = (
            saved.ranks,
            saved.shown,
            saved.rng,
            saved.birth,
            saved.index,
        )


def find_state(module: nn.Module) -> LazyState | None:
    """The module's :class:`LazyState`, or None (a built or an eager module)."""
    return module.__dict__.get(STATE_KEY)


def note_built(module: nn.Module, sizes: dict[str, Any]) -> None:
    """In a factory's first run, note that its ``__init__`` built a lazy layer it constructed
    (``lazynn.build(inner, x)`` inside it), with these sizes (:attr:`Drafting.built`)."""
    program = context().program
    state = find_state(module)
    if isinstance(program, Drafting) and state is not None and state.index >= 0:
        program.built[state.index] = (module, dict(sizes))


def lazy_state(module: nn.Module) -> LazyState:
    """The module's :class:`LazyState` (created empty if it has none yet)."""
    state = module.__dict__.get(STATE_KEY)
    if state is None:
        state = module.__dict__[STATE_KEY] = LazyState()
    return state


_LAST_RNG_STATE: list[torch.Tensor] = []
#: how many lazy modules the process has constructed (the next birth number), and its lock
_CONSTRUCTED = [0]
_CONSTRUCTED_LOCK = threading.Lock()
_ORDER = itertools.count()


def constructed() -> int:
    """How many lazy modules the process has constructed so far: work a program writes now
    (an initialization kept on a placeholder, a queued function) comes after their
    constructions and before the next one's, which ``build`` reproduces."""
    return _CONSTRUCTED[0]


def next_order() -> int:
    """A process-wide sequence number: the order in which a program wrote its kept
    initializations and queued functions (``kept.py``, ``_build/queue.py``)."""
    return next(_ORDER)


def record_construction(module: nn.Module) -> None:
    """Remember the CPU generator's state at construction, for build()'s replay.

    ``lazynn.build`` initializes as an eager model's construction would have: from this state,
    in construction order. Consecutive lazy modules share one recorded tensor (5 KB) as long as
    nothing drew random numbers between their constructions.
    """
    state = torch.get_rng_state()
    if not _LAST_RNG_STATE or not torch.equal(state, _LAST_RNG_STATE[0]):
        _LAST_RNG_STATE[:] = [state]
    record = lazy_state(module)
    record.rng = _LAST_RNG_STATE[0]
    with _CONSTRUCTED_LOCK:  # (one counter: the birth numbers and constructed() agree)
        record.birth = _CONSTRUCTED[0]
        _CONSTRUCTED[0] += 1


#: Modules whose ``lazynn.on_build`` queue waits for a build (weak: a dropped model is
#: forgotten): what torch.compile, which builds layer by layer as it traces, must know of.
WAITING: weakref.WeakSet[nn.Module] = weakref.WeakSet()
