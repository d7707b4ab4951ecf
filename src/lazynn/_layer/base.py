"""Declarative lazy layers: an eager class, plus where its inferred sizes come from.

A lazy layer is a few lines::

    class LazyLinear(LazyLayer, nn.Linear):
        cls_to_become = nn.Linear
        inferred = {"in_features": Infer(dim=-1)}

        def __init__(self, out_features, bias=True, device=None, dtype=None):
            self._lazynn_setup(out_features=out_features, bias=bias, device=device, dtype=dtype)

``LazyLayer`` does the rest, the same way for every layer:

* construction runs the eager ``__init__`` on the meta device with a probe size, so the lazy
  module has every attribute of the eager one and one placeholder per parameter and buffer
  (with the eager dtype), and consumes no random numbers;
* the first call reads the sizes from the inputs, checks them (rank, dtype, and a forward of
  the eager layer on meta tensors, so a kernel larger than the input is caught), then
  constructs the eager layer for real, exactly as ``nn.Linear(in, out)`` would, under the
  current RNG, and moves its tensors into the placeholders (same Python objects);
* a built checkpoint builds an unbuilt layer: sizes are solved from the tensor shapes, and
  every shape is checked against what the layer already knows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from .._errors import (
    AmbiguousInputWarning,
    InferenceError,
    LazynnError,
    message,
    module_path,
)
from .._module.callers import under_dynamo, untraced
from .._module.kept import run as run_inits
from .._module.lifecycle import (
    finish,
    in_build,
    is_unbuilt,
    outside_inference_mode,
    own_work,
    rehearsing,
    warn_built,
)
from .._module.mixin import LazyModuleMixin
from .._module.snapshot import RandomState
from .._module.state import LazyState, context, lazy_state, note_built
from .._module.tensors import is_placeholder, raw
from .._program.record import recording
from .arguments import check_arguments
from .checkpoint import checked_layout, solve_sizes
from .construct import (
    Slot,
    allocate_empty,
    construct,
    forward_names,
    key_text,
    match_dtypes,
    new,
    of_torch,
    slots,
)
from .fill import (
    Pending,
    commit,
    copy_kept,
    goes_through_materialize,
    materialize_each,
    plan_moves,
    reset_as_eager,
    reset_known_buffers,
    take_settings,
)
from .infer import CLASS_KEY, Infer
from .inputs import (
    ambiguous_reading,
    check_input,
    construct_checked,
    forward_error,
    read_sizes,
    run_on_meta,
)
from .layout import lay_out

__all__ = ["LazyLayer"]


class LazyLayer(LazyModuleMixin):
    """Base of lazy layers declared by ``cls_to_become`` and ``inferred`` (see module doc).

    Class attributes:
        cls_to_become: the eager ``nn.Module`` class the layer becomes.
        inferred: constructor argument name -> :class:`Infer`.
        mixed_precision_input: whether a float16/bfloat16 input may meet float32 parameters
            (as torch's norm layers allow). Default: ``False``: the input's dtype must equal
            the parameters' (as ``nn.Linear`` and convolutions require).
    """

    cls_to_become: type[nn.Module]
    inferred: ClassVar[Mapping[str, Infer]]
    mixed_precision_input: ClassVar[bool] = False
    #: whether any floating input dtype is accepted (nn.RMSNorm computes mixed dtypes)
    any_float_input: ClassVar[bool] = False
    #: buffers whose shape no input decides and whose eager value is zero
    #: (``num_batches_tracked``): real tensors before the build, not placeholders
    known_buffers: ClassVar[frozenset[str]] = frozenset()

    #: what the layer knows before its build (deleted by the build)
    _lazynn: LazyState

    # --- construction ---------------------------------------------------------------------
    def _lazynn_setup(self, **kwargs: Any) -> None:
        """Lay out the layer: run the eager ``__init__`` on meta, then swap in placeholders
        (in a factory's run, see ``layout.py``). Arguments that contradict the eager signature
        (a half-ported line, ``LazyLinear(768, 3072)``) are refused first."""
        specs = self._lazynn_specs() if "_lazynn" in self.__dict__ else self.inferred
        untraced(check_arguments)(type(self), self.cls_to_become, kwargs, tuple(specs))
        held = [
            k
            for k, v in kwargs.items()
            if isinstance(v, nn.Module) and any(True for _ in (*v.parameters(), *v.buffers()))
        ]
        if held:
            # The layout would hold the user's module: its tensors would become placeholders
            # and the eager constructor (nn.Transformer's _reset_parameters) would rewrite it.
            raise LazynnError(
                message(
                    type(self).__name__,
                    "constructor arguments that hold no parameters (a lazy layer lays out "
                    "everything it holds before it knows its sizes)",
                    "modules with parameters for " + ", ".join(held),
                    f"construct nn.{self.cls_to_become.__name__} with the sizes written out "
                    "when you bring your own modules; keep lazy layers inside your modules "
                    "instead",
                )
            )
        # (by Python under a compiled function too: dynamo models the layout's dicts as plain)
        untraced(lay_out)(self, self.cls_to_become, specs, self.known_buffers, kwargs)

    def _lazynn_construct(self, sizes: Mapping[str, int], device: torch.device | str) -> nn.Module:
        """The eager layer with these sizes (``device="meta"``: shapes only, no RNG)."""
        return new(self.cls_to_become, {**self._lazynn.kwargs, **sizes}, device, self._lazynn.dtype)

    def _lazynn_slots(self) -> Iterator[tuple[Slot, torch.Tensor]]:
        """((module path, tensor name), placeholder) for every parameter and buffer.

        The placeholders made at construction, even while ``torch.func.functional_call``
        has put other tensors in their place.
        """
        # (a layer without submodules, the common case, needs no walk)
        modules = dict(self.named_modules()) if self._modules else {"": self}
        record = self._lazynn.placeholders
        for (prefix, name), tensor in record.items():
            module = modules[prefix]
            installed = module._parameters.get(name, module._buffers.get(name))
            if installed is None:
                installed = getattr(module, name)
            if installed is not tensor and is_placeholder(installed):
                # A move replaced the placeholder (`.to("meta")` can't change a tensor's
                # device in place, so nn.Module._apply installs a new one): follow it.
                record[(prefix, name)] = tensor = installed
            yield (prefix, name), tensor

    def __copy__(self) -> LazyLayer:
        new = super().__copy__()
        if is_unbuilt(self):
            # The submodules hold this layer's placeholders: a copy that builds on its own
            # needs its own (a built layer's copy shares them, as torch's does).
            for name, child in self._modules.items():
                new._modules[name] = copy.deepcopy(child)
        installed = slots(new)
        lazy_state(new).placeholders = {
            key: installed[key] for key in self._lazynn.placeholders if key in installed
        }
        return new

    # --- building from inputs -------------------------------------------------------------
    def _lazynn_specs(self) -> Mapping[str, Infer]:
        """The inferred arguments: the class's ``inferred``, or this instance's own."""
        own = self._lazynn.specs
        return own if own is not None else self.inferred

    def _lazynn_read_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The inferred sizes a call's inputs give (recorded for a rehearsal in progress)."""
        names = forward_names(self.cls_to_become)
        specs = self._lazynn_specs()
        sizes = read_sizes(self, specs, names, args, kwargs)
        note = ambiguous_reading(specs, names, args, kwargs)
        rehearsal = context().rehearsal
        if rehearsal is not None:
            # The rehearsal's record of what this layer read (and, for a rank-agnostic layer,
            # which class it chose), and why it may not be what was meant: the build warns
            chosen = self.__dict__.get("cls_to_become")
            rehearsal.sizes[id(self)] = sizes if chosen is None else {**sizes, CLASS_KEY: chosen}
            if note is not None:
                rehearsal.notes[id(self)] = note
        elif note is not None:
            where = module_path(self)
            warn_built(AmbiguousInputWarning(f"{where} {note}"), stacklevel=4)
        return sizes

    def _lazynn_check_dtype(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        placed: list[tuple[Slot, torch.Tensor]] | None = None,
    ) -> None:
        """The inputs are on the device and of the dtype of the placeholders still in place
        (``placed``: :meth:`_lazynn_slots`, if already listed)."""
        installed = slots(self)
        check_input(
            self,
            self._lazynn_specs(),
            forward_names(self.cls_to_become),
            (
                t
                for k, t in (self._lazynn_slots() if placed is None else placed)
                if is_placeholder(t) and installed.get(k) is t
            ),
            args,
            kwargs,
            mixed_precision=self.mixed_precision_input,
            any_float=self.any_float_input,
        )

    def _lazynn_shadow(self, sizes: Mapping[str, Any]) -> nn.Module:
        """The eager layer with ``sizes`` on meta, with the placeholders' (moved) dtypes."""
        shadow = self._lazynn_construct(sizes, "meta")
        match_dtypes(shadow, self._lazynn_slots())
        return shadow

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        """Read the sizes from example inputs, check them, and build the layer.

        Builds without running the forward, as torch's ``initialize_parameters`` does; called
        directly, it builds completely (class swap included), as a first call would.
        """
        if not in_build():
            self._infer_parameters(self, args, kwargs)
            return
        # (lazynn's own work, out of its modes: lifecycle.own_work; user code stays under them)
        own = own_work if rehearsing() and of_torch(self.cls_to_become) else nullcontext
        with own():
            sizes = self._lazynn_read_sizes(args, kwargs)
            placed = list(self._lazynn_slots())
            self._lazynn_check_dtype(args, kwargs, placed)
            on_meta = all(raw(t).is_meta for _, t in placed if is_placeholder(t))
        if on_meta and rehearsing():  # (its forward follows, and a failure restores all)
            shadow = self._lazynn_construct(sizes, "meta")  # (may run registration hooks)
            with own() if not goes_through_materialize(placed, None) else nullcontext():
                match_dtypes(shadow, placed)
                self._lazynn_check_layout(shadow, sizes)
                pending = self._lazynn_build(sizes, source=shadow)
            run_inits(pending)
            return
        source, hooked = None, False
        if on_meta or under_dynamo() or (hooked := goes_through_materialize(placed, None)):
            # (a placeholder with its own materialize() is built through it and initialized by
            # reset_parameters(), as torch's lazy modules are: the eager layer on meta) No real
            # forward follows to check the input (dynamo builds, then traces; a layer on meta
            # has no values): the eager layer runs on meta first.
            shadow = run_on_meta(self, lambda: self._lazynn_shadow(sizes), sizes, args, kwargs)
            source = shadow if on_meta or hooked else None
        else:
            # The first call: the layer is constructed for real, and the forward that follows
            # is the check; if it fails, LazyModuleMixin.__call__ undoes the build, random
            # numbers included. No meta tensor is touched.
            eager = partial(self._lazynn_new_eager, sizes)
            shadow = source = construct_checked(self, eager, sizes, args, kwargs)
        self._lazynn_check_layout(shadow, sizes)
        run_inits(self._lazynn_build(sizes, source=source))

    def _lazynn_forward_failed(
        self,
        args: tuple[Any, ...],
        error: BaseException,
        kind: type[nn.Module],
        before: LazyState | None,
    ) -> BaseException | None:
        """A first call's forward that refused its input: an InferenceError with the path,
        the layer as built, the input and torch's own words. (A kernel torch lacks for this
        dtype or device, NotImplementedError, and a warning turned error are raised as they are.)"""
        if not isinstance(error, Exception) or isinstance(
            error, (LazynnError, NotImplementedError, Warning)
        ):
            return None
        return forward_error(self, self, args, error, kind, before)

    def _lazynn_check_layout(self, shadow: nn.Module, sizes: Mapping[str, Any]) -> None:
        """The layer built with these sizes has the tensors the placeholders stand for.

        (``nn.MultiheadAttention`` with a key size unlike the query's has other parameters.)
        """
        built = set(slots(shadow)) - {("", name) for name in self.known_buffers}
        declared = set(self._lazynn.placeholders)
        if built != declared:
            extra = sorted(key_text(k) for k in built - declared)
            missing = sorted(key_text(k) for k in declared - built)
            raise InferenceError(
                message(
                    module_path(self),
                    "inputs that give the layer the parameters it was declared with ("
                    + ", ".join(sorted(key_text(k) for k in declared))
                    + ")",
                    "inputs giving "
                    + ", ".join(f"{k}={v}" for k, v in sizes.items())
                    + f", which would add {extra} and drop {missing}",
                    "declare those sizes in the constructor (for example kdim=, vdim=), or "
                    "pass inputs of the declared kind",
                )
            )

    def _lazynn_build(
        self,
        sizes: Mapping[str, int],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        source: nn.Module | None = None,
    ) -> Pending:
        """Construct the eager layer for real and move its tensors into the placeholders.

        By default the layer is constructed where and as it was declared (device, dtype),
        then each tensor is converted to its placeholder's dtype and device (as moved since).
        ``device`` / ``dtype`` construct it there directly instead (``lazynn.build``);
        ``source`` is an already constructed eager layer to take the tensors from. Returns
        the initializations written on its placeholders (``_module/kept.py``), each with the built
        tensor, for the caller to run: after this layer (a first call), after every layer
        (``lazynn.build``), or not at all (a checkpoint that holds them).
        """
        sizes = dict(sizes)
        note_built(self, sizes)  # (a factory's first run: built by its own __init__)
        chosen = sizes.pop(CLASS_KEY, None)
        if chosen is not None:  # a rank-agnostic layer's class, chosen by the rehearsal
            self.__dict__["cls_to_become"] = chosen
        placed = list(self._lazynn_slots())
        if goes_through_materialize(placed, device):
            return self._lazynn_build_through_materialize(sizes, placed, device, dtype, source)
        eager = source if source is not None else self._lazynn_new_eager(sizes, device, dtype)

        def elsewhere(held: torch.device) -> nn.Module:
            saved = RandomState()  # (its draws are not the model's: put back)
            try:
                return self._lazynn_new_eager(sizes, held, dtype)
            finally:
                saved.restore()

        moves = plan_moves(self, eager, placed, device, dtype, elsewhere)
        reset_known_buffers(self, eager, self.known_buffers, device)
        pending = commit(moves)
        take_settings(self, eager)
        return pending

    def _lazynn_build_through_materialize(
        self,
        sizes: Mapping[str, int],
        placed: list[tuple[Slot, torch.Tensor]],
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        source: nn.Module | None,
    ) -> Pending:
        """The build through each placeholder's own ``materialize()``, as torch's lazy
        modules build (tensordict's batched placeholders add an agent dimension there). Each
        is materialized with the eager tensor's shape; the eager layer's values go where the
        shape was kept. Where a ``materialize()`` gave another shape, the generator is put back
        where the build began and the eager class's ``reset_parameters()`` initializes the
        layer, drawing what torch's lazy modules draw."""
        layout = source if source is not None else self._lazynn_construct(sizes, "meta")
        placed = [(slot, t) for slot, t in placed if is_placeholder(t)]
        where = device if device is not None else raw(placed[0][1]).device if placed else None
        pending, changed = materialize_each(layout, placed, device, dtype)
        start = RandomState() if changed else None
        real = source
        if real is None or any(t.is_meta for t in (*real.parameters(), *real.buffers())):
            # (where the placeholders were: on meta, in a rehearsal's twin, it draws nothing)
            real = self._lazynn_new_eager(sizes, where, dtype)
        copy_kept(real, placed)
        reset_known_buffers(self, real, self.known_buffers, device)
        take_settings(self, real)
        if start is not None:
            start.restore()
            reset_as_eager(self)
        return pending

    def _lazynn_new_eager(
        self,
        sizes: Mapping[str, Any],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Module:
        """The eager layer with ``sizes``, constructed for real (drawing its numbers) on
        ``device`` with ``dtype``; by default where (:meth:`_lazynn_where`) and as the layer
        was declared. On meta while a construction is recorded, its eager constructor runs
        there (its init steps are the layer's program), rather than a layout's copy."""
        where = device if device is not None else self._lazynn_where()
        arguments = {**self._lazynn.kwargs, **sizes}
        chosen = dtype if dtype is not None else self._lazynn.dtype
        # Parameters as a construction outside the mode makes them, even in a first call
        # under torch.inference_mode() (inference tensors could not be trained).
        with outside_inference_mode():
            if str(where) == "meta" and recording() is not None:
                return construct(self.cls_to_become, arguments, "meta", chosen, None)
            return new(self.cls_to_become, arguments, where, chosen)

    def _lazynn_build_from_state(
        self, state_dict: dict[str, Any], prefix: str, assign: bool = False
    ) -> None:
        found: dict[tuple[str, str], torch.Size] = {}
        tied: dict[tuple[str, str], torch.Size] = {}
        installed = slots(self)
        for (path, name), _ in self._lazynn_slots():
            key = prefix + (f"{path}.{name}" if path else name)
            value = state_dict.get(key)
            tensor = installed.get((path, name))
            if isinstance(value, torch.Tensor) and not is_placeholder(value):
                found[(path, name)] = value.shape
            elif tensor is not None and not is_placeholder(tensor):  # tied to a built one
                tied[(path, name)] = tensor.shape  # (safetensors saves one name of a tie)
        if found or len(tied) == len(self._lazynn.placeholders):
            # (every tensor of the layer tied to a built one, whose checkpoint holds only the
            # other name of each tie: Hugging Face's save_pretrained; built from them, drawing
            # nothing, as its values are theirs)
            found |= tied
        if not found:
            return  # nothing built in the checkpoint: stay unbuilt
        where = module_path(self, prefix[:-1])
        sizes = self._lazynn_solve_sizes(found, where, prefix)
        shadow = checked_layout(
            lambda chosen: self._lazynn_construct(chosen, "meta"),
            self._lazynn.kwargs,
            sizes,
            found,
            where,
            prefix,
        )  # (the build allocates from it)
        every = len(found) == len(self._lazynn.placeholders)
        # A checkpoint that holds every tensor of the layer: allocated uninitialized, its
        # values come from the checkpoint, no random number is drawn. Otherwise (strict=False,
        # a non-persistent buffer), or when work queued with on_build runs before the values
        # are copied (the eager program: construct, initialize, load), the layer is
        # constructed as eager, and what the checkpoint holds overwrites it.
        # With assign=True the checkpoint's tensors replace the layer's: nothing is allocated.
        source = None
        if every and not context().loading_for_queue:
            # (assign=True: left on meta, since the checkpoint's tensors replace them)
            source = shadow if assign else allocate_empty(shadow, self._lazynn_where())
            for name in self.known_buffers:  # (their eager value, zero: a checkpoint written
                known = source._buffers.get(name)  # before num_batches_tracked lacks it)
                if known is not None and not known.is_meta:
                    known.zero_()
        pending = self._lazynn_build(
            sizes, device="meta" if source is not None and assign else None, source=source
        )
        if source is None:  # constructed as eager: its initializations, then the values
            run_inits(pending)
        finish(self)

    def _lazynn_where(self) -> torch.device | str:
        """Where the layer is constructed at its build: where it was declared; on meta if its
        placeholders were moved there; where they were moved, if it was declared on meta."""
        devices = {raw(t).device for _, t in self._lazynn_slots() if is_placeholder(t)}
        if any(d.type == "meta" for d in devices):
            return "meta"
        if self._lazynn.device.type == "meta" and devices:
            return next(iter(devices))  # declared on meta, then to_empty(): build there
        return self._lazynn.device

    def _lazynn_shapes(self, sizes: Mapping[str, Any]) -> dict[tuple[str, str], torch.Size]:
        """The shape of each tensor of the layer built with ``sizes`` (on meta; remembered, as
        the checkpoint solver asks again for the same sizes)."""
        cache = self._lazynn.shapes
        key = (self.cls_to_become, repr(sorted(sizes.items())))
        if key not in cache:
            shadow = self._lazynn_construct(sizes, "meta")
            cache[key] = {slot: t.shape for slot, t in slots(shadow).items()}
        return cache[key]

    def _lazynn_solve_sizes(
        self, found: Mapping[tuple[str, str], torch.Size], where: str, prefix: str
    ) -> dict[str, Any]:
        """Solve each inferred size from checkpoint shapes (see ``checkpoint.py``)."""
        specs = self._lazynn_specs()
        base = {name: spec.probe_value(self._lazynn.kwargs) for name, spec in specs.items()}
        return solve_sizes(base, self._lazynn_shapes, found, where, prefix)
