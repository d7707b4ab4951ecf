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
import functools
import inspect
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from ._errors import (
    CheckpointError,
    InferenceError,
    LazynnError,
    UnbuiltError,
    describe,
    message,
    module_path,
    shape_str,
)
from ._mixin import LazyModuleMixin, in_build, is_unbuilt, rehearsing
from ._placeholder import UninitializedBuffer, UninitializedParameter, _fill, _raw, is_placeholder

__all__ = ["UNKNOWN", "Infer", "LazyLayer"]


class _Unknown:
    """The value of an inferred size before the build; prints as ``?``."""

    _instance: ClassVar[_Unknown | None] = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    def __format__(self, spec: str) -> str:
        return "?"

    def __reduce__(self) -> str:
        return "UNKNOWN"

    def __deepcopy__(self, memo: dict[int, Any]) -> _Unknown:
        return self

    def _refuse(self, *args: object) -> Any:
        from ._callers import tool_fix

        tool = tool_fix()
        raise UnbuiltError(
            message(
                "an inferred size (shown as ?)",
                f"a built layer for {tool[0]}" if tool else "a built layer to compute with it",
                "a layer whose sizes the first input has not decided yet",
                tool[1]
                if tool
                else "build first: lazynn.build(model, example), or call the model on an "
                "example input (model(x), not model.forward(x), which skips the build), or "
                "load a built checkpoint",
            )
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse  # type: ignore[assignment]
    __index__ = __int__ = __float__ = __bool__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = _refuse
    __hash__ = object.__hash__


#: The value of an inferred size (``in_features``...) before the build.
UNKNOWN = _Unknown()

_LAYOUT = re.compile(r"^\((.*)\)$")


@dataclass(frozen=True)
class Infer:
    """Where a constructor argument is read from a forward call's inputs.

    Args:
        dim: the input dimension that gives the size. Default: ``-1`` (the last).
        arg: which forward argument: a position or a parameter name. Default: ``0``.
        layouts: the input layouts accepted, such as ``("(C, H, W)", "(N, C, H, W)")``.
            When given, the input's rank must be one of theirs, and the size is read at the
            position of ``letter`` in the matching layout (so unbatched and batched inputs
            each read the right dimension). When empty, any rank reaching ``dim`` is fine.
        letter: the layout letter to read. Default: ``"C"``.
        probe: a value valid for the constructor, used to lay out placeholders before the
            build: an int, or the name of another constructor argument whose value is valid
            (``"groups"`` for convolutions). Default: ``1``.
        trailing: read the last ``trailing`` dimensions as a tuple (``LayerNorm``'s
            ``normalized_shape``) instead of one dimension. Default: ``None``.

    >>> Infer(dim=-1).read_dim(3)
    2
    >>> Infer(layouts=("(C, L)", "(N, C, L)")).read_dim(2)
    0
    """

    dim: int = -1
    arg: int | str = 0
    layouts: tuple[str, ...] = ()
    letter: str = "C"
    probe: int | str = 1
    trailing: int | None = None

    def _letters(self, layout: str) -> list[str]:
        match = _LAYOUT.match(layout.strip())
        inner = match.group(1) if match else layout
        return [part.strip() for part in inner.split(",") if part.strip()]

    def accepted(self) -> str:
        """The accepted inputs, for messages: ``"a 3-d (C, H, W) or 4-d (N, C, H, W) input"``."""
        if self.trailing is not None:
            return f"an input of rank >= {self.trailing}"
        if not self.layouts:
            return f"an input of rank >= {self.dim + 1 if self.dim >= 0 else -self.dim}"
        parts = [f"{len(self._letters(lay))}-d {lay}" for lay in self.layouts]
        return "a " + " or ".join(parts) + " input"

    def read_dim(self, rank: int) -> int | None:
        """The dimension to read for an input of ``rank``, or None if the rank is refused."""
        if not self.layouts:
            ok = -rank <= self.dim < rank
            return (self.dim % rank) if ok else None
        for layout in self.layouts:
            letters = self._letters(layout)
            if len(letters) == rank:
                return letters.index(self.letter)
        return None

    def probe_value(self, kwargs: Mapping[str, Any]) -> Any:
        value = int(kwargs[self.probe]) if isinstance(self.probe, str) else self.probe
        return (value,) * self.trailing if self.trailing is not None else value

    def read(self, shape: Sequence[int]) -> Any:
        """The size this spec reads from an input of ``shape`` (None if the rank is refused)."""
        if self.trailing is not None:
            ok = 0 < self.trailing <= len(shape)
            return tuple(int(d) for d in shape[len(shape) - self.trailing :]) if ok else None
        dim = self.read_dim(len(shape))
        return None if dim is None else int(shape[dim])


def _map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, lists, dicts and named tuples.

    A ``PackedSequence`` keeps its ``batch_sizes`` (torch requires them on the CPU).
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, PackedSequence):
        return PackedSequence(
            fn(obj.data),
            obj.batch_sizes,
            None if obj.sorted_indices is None else fn(obj.sorted_indices),
            None if obj.unsorted_indices is None else fn(obj.unsorted_indices),
        )
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(fn, v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(fn, v) for v in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    return obj


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``t``'s shape and dtype.

    Under torch.compile the input is a fake tensor whose batch size may be symbolic
    (``dynamic=True``, ``mark_dynamic``): read its hint, which adds no guard, so the compiled
    graph stays dynamic (``int()`` would specialize it to the first batch size).
    """
    return torch.empty(tuple(_hint(s) for s in t.shape), dtype=t.dtype, device="meta")


def _hint(size: int | torch.SymInt) -> int:
    if not isinstance(size, torch.SymInt):
        return int(size)
    # torch.fx.experimental.symbolic_shapes is public but experimental: optimization_hint
    # (newer torch) replaced hint_int (older). tests/test_compile.py's mark_dynamic cases
    # cover it.
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint as hint
    except ImportError:  # pragma: no cover - older torch
        from torch.fx.experimental.symbolic_shapes import (  # type: ignore[attr-defined,no-redef]
            hint_int as hint,
        )
    return int(hint(size))


_MODULE_KEYS = frozenset(nn.Module().__dict__)
#: In a size record: the class a rank-agnostic layer chose (not a constructor argument).
CLASS_KEY = "__lazynn_class__"
#: Per thread, during a rehearsal: the sizes the last LazyLayer read (see _rehearse.post).
_REHEARSED_SIZES = threading.local()
_LOWER_PRECISION = (torch.float16, torch.bfloat16)
#: the second probe of _lazynn_hide_probes, as a multiple of the first
_FAR = 1024


class LazyLayer(LazyModuleMixin):
    """Base of lazy layers declared by ``cls_to_become`` and ``inferred`` (see module doc).

    Class attributes:
        cls_to_become: the eager ``nn.Module`` class the layer becomes.
        inferred: constructor argument name -> :class:`Infer`.
        mixed_precision_input: whether a float16/bfloat16 input may meet float32 parameters
            (as torch's norm layers allow). Default: ``False``: the input's dtype must equal
            the parameters' (as ``nn.Linear`` and convolutions require).
    """

    cls_to_become: type[nn.Module]  # type: ignore[assignment]
    inferred: ClassVar[Mapping[str, Infer]]
    mixed_precision_input: ClassVar[bool] = False
    #: whether any floating input dtype is accepted (nn.RMSNorm computes mixed dtypes)
    any_float_input: ClassVar[bool] = False

    _lazynn_kwargs: dict[str, Any]
    _lazynn_device: torch.device
    _lazynn_dtype: torch.dtype
    _lazynn_placeholders: dict[tuple[str, str], torch.Tensor]

    # --- construction ---------------------------------------------------------------------
    def _lazynn_setup(self, **kwargs: Any) -> None:
        """Lay out the layer: run the eager ``__init__`` on meta, then swap in placeholders."""
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
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        target = torch.device(device) if device is not None else torch.get_default_device()
        probes = {name: spec.probe_value(kwargs) for name, spec in self._lazynn_specs().items()}
        if isinstance(self, self.cls_to_become):
            _new(self.cls_to_become, {**kwargs, **probes}, "meta", dtype, into=self)
        else:  # not a subclass of the class it becomes (rank-agnostic): copy a meta layout
            self.__dict__.update(
                _new(self.cls_to_become, {**kwargs, **probes}, "meta", dtype).__dict__
            )
        placeholders: dict[tuple[str, str], torch.Tensor] = {}
        for prefix, module in self.named_modules():
            for tensors, kind in (
                (module._parameters, UninitializedParameter),
                (module._buffers, UninitializedBuffer),
            ):
                for name, tensor in tensors.items():
                    if tensor is not None:
                        placeholder = _placeholder_for(tensor, kind, target, self, prefix, name)
                        tensors[name] = placeholders[(prefix, name)] = placeholder
        self._lazynn_placeholders = placeholders
        for name, spec in self._lazynn_specs().items():
            if name in self.__dict__:  # stored by the eager class (not all store it)
                unknown = (UNKNOWN,) * spec.trailing if spec.trailing else UNKNOWN
                setattr(self, name, unknown)
        if self._modules:
            self._lazynn_hide_probes({**kwargs, **probes}, dtype)
        self._lazynn_kwargs = kwargs
        self._lazynn_device = target
        self._lazynn_dtype = dtype if dtype is not None else torch.get_default_dtype()
        from ._mixin import _attach, _record_construction

        _attach(self)
        _record_construction(self)

    def _lazynn_hide_probes(self, layout_kwargs: Mapping[str, Any], dtype: Any) -> None:
        """Show ``?`` for every attribute of a submodule that the probe sizes decided.

        (``linear1.in_features`` of a transformer layer is ``d_model``.) A second meta layout
        with every probe multiplied tells them apart; the build copies the real values back.
        """
        # (A large multiple, not double: a floor division by a constant, such as
        # AdaptiveLogSoftmaxWithLoss's in_features // div_value**k, must tell them apart too.)
        doubled = {
            name: tuple(_FAR * v for v in probe) if isinstance(probe, tuple) else _FAR * probe
            for name, probe in (
                (n, spec.probe_value(layout_kwargs)) for n, spec in self._lazynn_specs().items()
            )
        }
        other = _new(self.cls_to_become, {**layout_kwargs, **doubled}, "meta", dtype)
        theirs = dict(other.named_modules())
        for path, module in self.named_modules():
            if not path or path not in theirs:
                continue
            for key, value in list(module.__dict__.items()):
                if key in _MODULE_KEYS or key not in theirs[path].__dict__:
                    continue
                other_value = theirs[path].__dict__[key]
                if _differs(value, other_value):
                    module.__dict__[key] = _unknown_parts(value, other_value)

    def _lazynn_construct(self, sizes: Mapping[str, int], device: torch.device | str) -> nn.Module:
        """The eager layer with these sizes (``device="meta"``: shapes only, no RNG)."""
        return _new(
            self.cls_to_become, {**self._lazynn_kwargs, **sizes}, device, self._lazynn_dtype
        )

    def _lazynn_slots(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        """(module path, tensor name, placeholder) for every parameter and buffer.

        The placeholders made at construction, even while ``torch.func.functional_call``
        has put other tensors in their place.
        """
        modules = dict(self.named_modules())
        record = self._lazynn_placeholders
        for (prefix, name), tensor in record.items():
            installed = getattr(modules[prefix], name)
            if installed is not tensor and is_placeholder(installed):
                # A move replaced the placeholder (`.to("meta")` can't change a tensor's
                # device in place, so nn.Module._apply installs a new one): follow it.
                record[(prefix, name)] = tensor = installed
            yield prefix, name, tensor

    def __copy__(self) -> LazyLayer:
        new = super().__copy__()
        if is_unbuilt(self):  # type: ignore[arg-type]
            # The submodules hold this layer's placeholders: a copy that builds on its own
            # needs its own (a built layer's copy shares them, as torch's does).
            for name, child in self._modules.items():
                new._modules[name] = copy.deepcopy(child)
        installed = {
            (prefix, name): tensor
            for prefix, module in new.named_modules()
            for name, tensor in (*module._parameters.items(), *module._buffers.items())
        }
        new.__dict__["_lazynn_placeholders"] = {
            key: installed[key] for key in self._lazynn_placeholders
        }
        return new  # type: ignore[return-value]

    # --- building from inputs -------------------------------------------------------------
    def _lazynn_specs(self) -> Mapping[str, Infer]:
        """The inferred arguments: the class's ``inferred``, or this instance's own."""
        own = self.__dict__.get("_lazynn_inferred")
        return own if own is not None else self.inferred

    def _lazynn_read_sizes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        sizes = {}
        for name, spec in self._lazynn_specs().items():
            value = self._lazynn_argument(spec.arg, args, kwargs)
            if isinstance(value, PackedSequence):
                value = value.data
            if not isinstance(value, torch.Tensor):
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        f"{spec.accepted()} (a tensor) to infer {name}",
                        describe(value),
                        "call the layer with a tensor",
                    )
                )
            size = spec.read(value.shape)
            if size is None:
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        f"{spec.accepted()} to infer {name}",
                        f"shape {shape_str(value.shape)}",
                        "reshape the input to one of the accepted layouts",
                    )
                )
            if min(size if isinstance(size, tuple) else (size,)) < 1:
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        f"a positive {name} (read from the input's shape)",
                        f"shape {shape_str(value.shape)}, which gives {name}={size}",
                        "call the layer with a non-empty input",
                    )
                )
            sizes[name] = size
        record = getattr(_REHEARSED_SIZES, "by_module", None)
        if record is not None and rehearsing():
            # The rehearsal's record of what this layer read (and, for a rank-agnostic layer,
            # which class it chose).
            chosen = self.__dict__.get("cls_to_become")
            record[id(self)] = sizes if chosen is None else {**sizes, CLASS_KEY: chosen}
        return sizes

    def _lazynn_argument(
        self, arg: int | str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        names = _forward_names(self.cls_to_become)  # type: ignore[arg-type]
        if isinstance(arg, int):
            if arg < len(args):
                return args[arg]
            arg = names[arg] if arg < len(names) else str(arg)
        if arg in kwargs:
            return kwargs[arg]
        index = names.index(arg) if arg in names else len(args)
        return args[index] if index < len(args) else None

    def _lazynn_check_dtype(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        floats = [
            _raw(t).dtype
            for _, _, t in self._lazynn_slots()
            if is_placeholder(t) and (t.is_floating_point() or t.is_complex())
        ]
        devices = {_raw(t).device for _, _, t in self._lazynn_slots() if is_placeholder(t)}
        for name, spec in self._lazynn_specs().items():
            value = self._lazynn_argument(spec.arg, args, kwargs)
            if isinstance(value, PackedSequence):
                value = value.data
            if devices and value.device not in devices:
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        f"an input on {', '.join(sorted(map(str, devices)))} (the layer's device)",
                        f"an input on {value.device} (to infer {name})",
                        "move the input (x.to(device)) or the layer (layer.to(device)) before "
                        "the first call, or use lazynn.build(model, example) for a dry run",
                    )
                )
            dtype = value.dtype
            kind = value.device.type
            if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
                continue  # autocast casts inputs and weights; eager accepts any float here
            expected = floats[0] if floats else None
            ok = dtype.is_floating_point or dtype.is_complex
            if ok and expected is not None and dtype != expected and not self.any_float_input:
                ok = (
                    self.mixed_precision_input
                    and expected == torch.float32
                    and dtype in _LOWER_PRECISION
                )
            if not ok:
                want = (
                    f"a {expected} input (the layer's dtype)"
                    if expected
                    else "a floating-point input"
                )
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        want,
                        f"a {dtype} input (to infer {name})",
                        "cast the input (x.to(dtype)) or the layer (layer.to(dtype)) "
                        "before the first call",
                    )
                )

    def _lazynn_validate(
        self, sizes: Mapping[str, int], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> nn.Module:
        """Construct the eager layer on meta and run it on meta copies of the inputs.

        Returns that meta layer (with the placeholders' dtypes), so a build on meta can use it.
        """
        try:
            shadow = self._lazynn_construct(sizes, "meta")
        except Exception as error:
            raise InferenceError(
                message(
                    module_path(self),  # type: ignore[arg-type]
                    "inputs from which a valid layer can be made",
                    f"{describe(args[0] if args else kwargs)}, which gives "
                    + ", ".join(f"{k}={v}" for k, v in sizes.items()),
                    "check the input's layout and the layer's arguments",
                    detail=str(error),
                )
            ) from error
        shadow.train(self.training)
        _match_dtypes(shadow, self._lazynn_slots())
        meta_args = _map_tensors(_to_meta, args)
        meta_kwargs = _map_tensors(_to_meta, kwargs)
        try:
            # The real forward warns as eager does; the meta rehearsal must not warn first.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                shadow(*meta_args, **meta_kwargs)
        except Exception as error:
            if _meta_limitation(error):
                return shadow  # meta cannot run this forward (e.g. .item()): no verdict
            raise InferenceError(
                message(
                    module_path(self),  # type: ignore[arg-type]
                    f"an input that {_short_repr(shadow)} accepts",
                    describe(args[0] if len(args) == 1 else args),
                    "call it with a valid input; the layer is still unbuilt",
                    detail=str(error).strip().splitlines()[0],
                )
            ) from error
        return shadow

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        """Read the sizes from example inputs, check them, and build the layer.

        Builds without running the forward, as torch's ``initialize_parameters`` does; called
        directly, it builds completely (class swap included), as a first call would.
        """
        if not in_build():
            self._infer_parameters(self, args, kwargs)  # type: ignore[arg-type]
            return
        sizes = self._lazynn_read_sizes(args, kwargs)
        self._lazynn_check_dtype(args, kwargs)
        on_meta = all(_raw(t).is_meta for _, _, t in self._lazynn_slots() if is_placeholder(t))
        if on_meta and rehearsing():
            # The rehearsal runs this layer's forward right after, and restores everything
            # if it fails: checking on meta first would only run the forward twice.
            shadow = self._lazynn_construct(sizes, "meta")
            _match_dtypes(shadow, self._lazynn_slots())
        else:
            shadow = self._lazynn_validate(sizes, args, kwargs)
        self._lazynn_check_layout(shadow, sizes)
        self._lazynn_build(sizes, source=shadow if on_meta else None)

    def _lazynn_check_layout(self, shadow: nn.Module, sizes: Mapping[str, Any]) -> None:
        """The layer built with these sizes has the tensors the placeholders stand for.

        (``nn.MultiheadAttention`` with a key size unlike the query's has other parameters.)
        """
        built = {
            (p, n)
            for p, m in shadow.named_modules()
            for n, t in (*m._parameters.items(), *m._buffers.items())
            if t is not None
        }
        declared = set(self._lazynn_placeholders)
        if built != declared:
            extra = sorted(_key(k) for k in built - declared)
            missing = sorted(_key(k) for k in declared - built)
            raise InferenceError(
                message(
                    module_path(self),  # type: ignore[arg-type]
                    "inputs that give the layer the parameters it was declared with ("
                    + ", ".join(sorted(_key(k) for k in declared))
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
    ) -> None:
        """Construct the eager layer for real and move its tensors into the placeholders.

        By default the layer is constructed where and as it was declared (device, dtype),
        then each tensor is converted to its placeholder's dtype and device (as moved since).
        ``device`` / ``dtype`` construct it there directly instead (``lazynn.build``);
        ``source`` is an already constructed eager layer to take the tensors from.
        """
        sizes = dict(sizes)
        chosen = sizes.pop(CLASS_KEY, None)
        if chosen is not None:  # a rank-agnostic layer's class, chosen by the rehearsal
            self.__dict__["cls_to_become"] = chosen
        slots = list(self._lazynn_slots())
        if source is not None:
            eager = source
        else:
            devices = {_raw(t).device for _, _, t in slots if is_placeholder(t)}
            if device is not None:
                where: torch.device | str = device
            elif any(d.type == "meta" for d in devices):
                where = "meta"
            elif self._lazynn_device.type == "meta" and devices:
                where = next(iter(devices))  # declared on meta, then to_empty(): build there
            else:
                where = self._lazynn_device
            eager = _new(
                self.cls_to_become,
                {**self._lazynn_kwargs, **sizes},
                where,
                dtype if dtype is not None else self._lazynn_dtype,
            )
        eager_modules = dict(eager.named_modules())
        own_modules = dict(self.named_modules())
        moves = []
        for prefix, name, tensor in slots:  # allocate everything first, commit after
            if not is_placeholder(tensor):
                continue
            value: torch.Tensor = getattr(eager_modules[prefix], name).detach()
            current = getattr(own_modules[prefix], name)
            if current is not tensor and (
                is_placeholder(current) or tuple(current.shape) != tuple(value.shape)
            ):
                raise InferenceError(
                    message(
                        module_path(self),  # type: ignore[arg-type]
                        f"'{_key((prefix, name))}' of shape {shape_str(value.shape)} "
                        "(from the inputs)",
                        _describe_substitute(current),
                        "build the model with a plain call first (model(example)), then take "
                        "its parameters for torch.func; the layer is still unbuilt",
                    )
                )
            raw = _raw(tensor)
            target_device = raw.device if device is None else value.device
            target_dtype = raw.dtype if dtype is None or not value.is_floating_point() else dtype
            if value.device != target_device or value.dtype != target_dtype:
                value = value.to(device=target_device, dtype=target_dtype)
            moves.append((own_modules[prefix], name, tensor, value))
        for module, name, tensor, value in moves:
            if _raw(tensor).device.type == value.device.type:
                _fill(tensor, value)  # in place: an optimizer holding it trains it
            else:  # a tensor cannot change device type in place (as eager `.to("meta")`)
                store = module._parameters if name in module._parameters else module._buffers
                kind = type(tensor).cls_to_become  # type: ignore[attr-defined]
                store[name] = (
                    nn.Parameter(value, tensor.requires_grad) if kind is nn.Parameter else value
                )
        for prefix, module in eager_modules.items():
            for key, value in module.__dict__.items():
                if key not in _MODULE_KEYS:
                    own_modules[prefix].__dict__[key] = value

    # --- building from a checkpoint -------------------------------------------------------
    def _lazynn_build_from_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        found: dict[tuple[str, str], torch.Size] = {}
        for path, name, _ in self._lazynn_slots():
            key = prefix + (f"{path}.{name}" if path else name)
            value = state_dict.get(key)
            if isinstance(value, torch.Tensor) and not is_placeholder(value):
                found[(path, name)] = value.shape
        if not found:
            return  # nothing built in the checkpoint: stay unbuilt
        where = module_path(self, prefix[:-1])  # type: ignore[arg-type]
        sizes = self._lazynn_solve_sizes(found, where, prefix)
        try:
            expected = self._lazynn_shapes(sizes)
        except Exception as error:  # the eager class refuses these sizes with these arguments
            known = ", ".join(f"{k}={v!r}" for k, v in self._lazynn_kwargs.items())
            raise CheckpointError(
                message(
                    where,
                    f"a checkpoint whose sizes make a valid layer with its arguments ({known})",
                    "a checkpoint giving " + ", ".join(f"{k}={v}" for k, v in sizes.items()),
                    "construct the layer with the arguments the checkpoint was saved with; "
                    "nothing was loaded into this layer",
                    detail=str(error),
                )
            ) from error
        wrong = {k: v for k, v in found.items() if tuple(expected[k]) != tuple(v)}
        if wrong:
            known = ", ".join(f"{k}={v!r}" for k, v in self._lazynn_kwargs.items())
            raise CheckpointError(
                message(
                    where,
                    "checkpoint shapes that agree with the layer's arguments ("
                    + known
                    + "): "
                    + ", ".join(f"'{prefix}{_key(k)}' {shape_str(expected[k])}" for k in wrong),
                    ", ".join(f"{shape_str(v)}" for v in wrong.values()),
                    "construct the layer with the arguments the checkpoint was saved with; "
                    "nothing was loaded into this layer",
                )
            )
        self._lazynn_build(sizes)
        from ._mixin import _finish

        _finish(self)  # type: ignore[arg-type]

    def _lazynn_shapes(self, sizes: Mapping[str, Any]) -> dict[tuple[str, str], torch.Size]:
        shadow = self._lazynn_construct(sizes, "meta")
        return {
            (path, name): t.shape
            for path, module in shadow.named_modules()
            for name, t in (*module._parameters.items(), *module._buffers.items())
            if t is not None
        }

    def _lazynn_solve_sizes(
        self, found: Mapping[tuple[str, str], torch.Size], where: str, prefix: str
    ) -> dict[str, Any]:
        """Solve each inferred size from checkpoint shapes.

        Each tensor dimension is an affine function of an inferred size (``in_channels /
        groups``, ``in_features``...): two meta constructions with different probe values
        give its slope and offset, and the checkpoint's dimension gives the size.
        """
        specs = self._lazynn_specs()
        base = {name: spec.probe_value(self._lazynn_kwargs) for name, spec in specs.items()}
        shapes = self._lazynn_shapes(base)
        for key, shape in found.items():
            if key in shapes and len(shapes[key]) != len(shape):
                twice: dict[str, Any] = {
                    n: tuple(2 * v for v in p) if isinstance(p, tuple) else 2 * p
                    for n, p in base.items()
                }
                varied = self._lazynn_shapes(twice)
                dims = [
                    "?" if x != y else str(x)
                    for x, y in zip(shapes[key], varied.get(key, shapes[key]), strict=True)
                ]
                expected = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
                raise CheckpointError(
                    message(
                        where,
                        f"'{prefix}{_key(key)}' of shape {expected}",
                        f"shape {shape_str(shape)}",
                        "load a checkpoint saved from this kind of layer and arguments",
                    )
                )
        # One unknown per int size, one per element of a tuple size (LayerNorm's shape).
        unknowns = [
            (name, index)
            for name, value in base.items()
            for index in (range(len(value)) if isinstance(value, tuple) else (None,))
        ]
        solved: dict[tuple[str, int | None], int] = {}
        for name, index in unknowns:
            probe = base[name] if index is None else base[name][index]
            doubled: Any = 2 * probe
            if index is not None:
                doubled = tuple(2 * v if i == index else v for i, v in enumerate(base[name]))
            other = self._lazynn_shapes({**base, name: doubled})
            value = None
            for key, shape in found.items():
                if key not in shapes or key not in other:
                    continue  # this size changes which tensors the layer has
                a, b = shapes[key], other[key]
                if len(a) != len(shape):
                    continue
                for dim, (x, y) in enumerate(zip(a, b, strict=True)):
                    if x != y:
                        slope = (y - x) / probe
                        guess = probe + (shape[dim] - x) / slope
                        if guess != int(guess) or guess < 1:
                            raise CheckpointError(
                                message(
                                    where,
                                    f"'{prefix}{_key(key)}' with dimension {dim} giving a whole "
                                    f"{name}",
                                    f"shape {shape_str(shape)}",
                                    "load a checkpoint saved from this kind of layer",
                                )
                            )
                        value = int(guess)
                        break
                if value is not None:
                    break
            if value is None:
                raise CheckpointError(
                    message(
                        where,
                        f"a checkpoint entry from which {name} can be read",
                        "entries " + ", ".join(f"'{prefix}{_key(k)}'" for k in found),
                        "load a checkpoint that has this layer's parameters",
                    )
                )
            solved[(name, index)] = value
        sizes: dict[str, Any] = {}
        for name, value in base.items():
            if isinstance(value, tuple):
                sizes[name] = tuple(solved[(name, i)] for i in range(len(value)))
            else:
                sizes[name] = solved[(name, None)]
        return sizes


@functools.cache
def _takes_factory_kwargs(cls: type[nn.Module]) -> bool:
    """Whether ``cls(...)`` accepts ``device=`` and ``dtype=`` (every torch.nn layer does)."""
    params = inspect.signature(cls.__init__).parameters
    if "device" in params and "dtype" in params:
        return True
    # nn.RNN/LSTM/GRU take (*args, **kwargs) and pass device/dtype on to RNNBase.
    return any(p.kind is p.VAR_KEYWORD for p in params.values()) and cls.__module__.startswith(
        "torch.nn"
    )


def _new(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    device: torch.device | str,
    dtype: torch.dtype | None,
    into: nn.Module | None = None,
) -> nn.Module:
    """``cls(**kwargs)`` on ``device`` with floating dtype ``dtype``; or, with ``into``, its
    ``__init__`` run on that (lazy) instance.

    A class without ``device``/``dtype`` arguments is constructed under the
    ``torch.device(device)`` context and its floating tensors cast to ``dtype`` after.
    """
    if str(device) == "meta":
        # Tensor arguments (LinearCrossEntropyLoss's class weights) go to meta with the layer.
        kwargs = {k: _map_tensors(_to_meta, v) for k, v in kwargs.items()}
        # A layout with probe sizes may warn where the real sizes would not (a zero-row
        # tensor's init): the real construction warns as eager does.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _construct(cls, kwargs, device, dtype, into)
    return _construct(cls, kwargs, device, dtype, into)


def _construct(
    cls: type[nn.Module],
    kwargs: Mapping[str, Any],
    device: torch.device | str,
    dtype: torch.dtype | None,
    into: nn.Module | None,
) -> nn.Module:
    init: Any = cls.__init__
    if _takes_factory_kwargs(cls):  # type: ignore[arg-type]
        full = {**kwargs, "device": device, "dtype": dtype}
        if into is not None:
            init(into, **full)
            return into
        return cls(**full)
    with torch.device(device):
        module = into if into is not None else cls.__new__(cls)
        init(module, **kwargs)
    if dtype is not None and dtype != torch.get_default_dtype() and into is None:
        module.to(dtype)
    return module


@functools.cache
def _forward_names(cls: type[nn.Module]) -> list[str]:
    """The names of ``cls.forward``'s arguments, without ``self``."""
    return list(inspect.signature(cls.forward).parameters)[1:]


def _differs(a: Any, b: Any) -> bool:
    """Whether two attribute values differ (plain values only; anything else: no)."""
    plain = (int, float, bool, str, tuple, type(None))
    if isinstance(a, plain) and isinstance(b, plain):
        return bool(a != b)
    return False


def _unknown_parts(a: Any, b: Any) -> Any:
    """``UNKNOWN``, or for two tuples of one length, ``a`` with ``?`` where they differ."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(UNKNOWN if x != y else x for x, y in zip(a, b, strict=True))
    return UNKNOWN


def _short_repr(module: nn.Module) -> str:
    """``Conv2d(3, 8, kernel_size=(3, 3))``; for a module with children, its name only."""
    if module._modules:
        return f"{type(module).__name__}({module.extra_repr()})".replace("()", "")
    return repr(module)


def _match_dtypes(shadow: nn.Module, slots: Iterator[tuple[str, str, torch.Tensor]]) -> None:
    """Give a meta shadow the dtypes the placeholders were moved to (``.double()``...)."""
    modules = dict(shadow.named_modules())
    for prefix, name, placeholder in slots:
        module = modules[prefix]
        tensor = getattr(module, name)
        dtype = _raw(placeholder).dtype
        if tensor is not None and tensor.dtype != dtype:
            if name in module._parameters:
                module._parameters[name] = nn.Parameter(tensor.to(dtype), tensor.requires_grad)
            else:
                module._buffers[name] = tensor.to(dtype)


def _describe_substitute(tensor: torch.Tensor) -> str:
    """What torch.func.functional_call put in a placeholder's place, for an error message."""
    if is_placeholder(tensor) or tensor.numel() == 0:
        return "an unbuilt placeholder seen through torch.func (functional_call or a transform)"
    return (
        f"a tensor of shape {shape_str(tensor.shape)} from torch.func.functional_call, "
        "which does not fit"
    )


def _meta_limitation(error: Exception) -> bool:
    """Whether a failure on meta tensors says nothing about the input (a data-dependent op)."""
    if isinstance(error, NotImplementedError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("meta tensor" in text or "data-dependent" in text)


def _key(key: tuple[str, str]) -> str:
    path, name = key
    return f"{path}.{name}" if path else name


def _placeholder_for(
    tensor: torch.Tensor,
    kind: type[UninitializedParameter] | type[UninitializedBuffer],
    device: torch.device,
    owner: nn.Module,
    prefix: str,
    name: str,
) -> torch.Tensor:
    placeholder = kind(requires_grad=tensor.requires_grad, device=device, dtype=tensor.dtype)
    label = f"{prefix}.{name}" if prefix else name
    placeholder._lazynn_owner = f"the '{label}' of {type(owner).__name__}"
    if kind is UninitializedBuffer:
        del placeholder.__dict__["_is_buffer"], placeholder.__dict__["persistent"]
    return placeholder
