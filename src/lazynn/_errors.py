"""One error family for lazynn, and the helpers that word its messages.

Every message says *where* (the module's path in the model and its class), what was
*expected*, what was *received*, and how to *fix* it::

    LazyConv2d at 'features.0': expected a 3-d (C, H, W) or 4-d (N, C, H, W) input,
    received shape (8, 3). Fix: pass an image batch, or flatten with lazynn.LazyLinear.

An error keeps those parts (:class:`Parts`, ``error.parts``) as well as their text: a fix key
(:class:`Fix`) names what the fix asks, so that the command line can say it with its own flags
without reading the text (rewording a message changes no fix the command line gives).

>>> error = InferenceError(message("LazyLinear at 'fc'", "a tensor", "None",
...     "call the layer with a tensor", key=Fix.INPUT_TENSOR))
>>> error.parts.key
<Fix.INPUT_TENSOR: 'input_tensor'>
>>> str(error)
"LazyLinear at 'fc': expected a tensor, received None. Fix: call the layer with a tensor"
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch import nn

__all__ = [
    "BUILD",
    "CALL_NOT_FORWARD",
    "INIT_FIX",
    "QUEUE_IT",
    "AmbiguousInputWarning",
    "ArgumentError",
    "CheckpointError",
    "Fix",
    "InferenceError",
    "LazynnError",
    "NeedsValuesError",
    "Parts",
    "UnbuiltError",
    "a_or_an",
    "first_line",
    "frame_locals",
    "func_name",
    "message",
    "meta_limitation",
    "module_path",
    "shape_str",
    "torch_phrase",
    "with_note",
]

# --- shared message texts ------------------------------------------------------------------
#: the whole-model build, as every fix that needs a built model names it
BUILD = "lazynn.build(model, example)"
#: why a first call must go through the module, not its forward
CALL_NOT_FORWARD = "model(x), not model.forward(x), which skips the build"
#: the fix for tools that work on a module right after its construction
QUEUE_IT = (
    "queue it until the build: lazynn.on_build(module, fn) runs fn(module) once the module "
    f"is built (by lazynn.build, materialize, a checkpoint or its first call); or build first "
    f"with {BUILD}"
)

#: the fix for an initializer that needs a placeholder's shape (the others wait for the build)
INIT_FIX = (
    "construct the model with lazynn.build(Net, example) (the factory form: your __init__ "
    f"runs with every size known, and the result is the eager model's); or build first, "
    f"{BUILD}, then initialize; or queue it: lazynn.on_build(module, fn). normal_, uniform_, "
    "trunc_normal_, constant_, zeros_, ones_, kaiming_uniform_ and in-place fills wait for "
    "the build on their own"
)


class Fix(enum.Enum):
    """What an error's fix asks for, where a caller with other words for it (the command line,
    ``_cli/fixes.py``) says it in its own terms. ``Parts.value`` carries what the fix needs
    (the dtype received, the optimizer named)."""

    #: a tool (a parametrization, pruning, an averaged model) that needs a built tensor: its
    #: fix queues it until the build (``lazynn.on_build``)
    ON_BUILD = "on_build"
    #: an input whose rank no accepted layout has
    INPUT_LAYOUT = "input_layout"
    #: an input with an empty dimension
    INPUT_NONEMPTY = "input_nonempty"
    #: a forward argument that should be a tensor
    INPUT_TENSOR = "input_tensor"
    #: a forward that failed on the inputs' shapes (the layers before it may be the cause)
    INPUT_SHAPES = "input_shapes"
    #: not one example per argument of the model's forward
    INPUT_ARGUMENTS = "input_arguments"
    #: an input on another device than the layer
    INPUT_DEVICE = "input_device"
    #: an input of a dtype the layer does not take (value: that dtype)
    INPUT_DTYPE = "input_dtype"
    #: token ids given as floating-point numbers to an embedding
    TOKEN_IDS = "token_ids"
    #: sizes from which the layer's arguments make no valid layer
    LAYER_ARGUMENTS = "layer_arguments"
    #: a first input the built layer's forward refuses
    VALID_INPUT = "valid_input"
    #: a batch of one for a BatchNorm in training
    BATCH_OF_MORE = "batch_of_more"
    #: a forward whose shapes depend on values (meta tensors have none)
    NEEDS_VALUES = "needs_values"
    #: a module whose forward does not implement the call
    NOT_IMPLEMENTED = "not_implemented"
    #: the batch given as a number instead of a symbolic one
    NUMERIC_BATCH = "numeric_batch"
    #: a symbolic dimension anywhere but first
    SYMBOLIC_FIRST = "symbolic_first"
    #: an optimizer name that is not torch.optim's (value: the name given)
    OPTIMIZER_NAME = "optimizer_name"
    #: an optimizer the estimate cannot step (value: its class name)
    OPTIMIZER_REFUSED = "optimizer_refused"
    #: an optimizer that failed on meta (value: its class name, the others to try, a limit)
    OPTIMIZER_FAILED = "optimizer_failed"


@dataclass(frozen=True)
class Parts:
    """An error's message in parts: ``str(parts)`` is its text,
    ``"{where}: expected {expected}, received {received}. ({detail}) Note: {note}. Fix: {fix};
    {outcome}"``."""

    where: str
    expected: str
    received: str
    fix: str
    #: the words of the error underneath (torch's), shown in parentheses
    detail: str = ""
    #: what the fix asks for, for callers that word it otherwise
    key: Fix | None = None
    #: what the fix needs (see :class:`Fix`)
    value: Any = None
    #: what the failure left as it was ("the model is unchanged"), after the fix
    outcome: str = ""
    #: notes added on the way out (an earlier layer's ambiguous reading)
    notes: tuple[str, ...] = ()

    def head(self) -> str:
        """The text before the fix: where, expected, received, detail and notes."""
        text = f"{self.where}: expected {self.expected}, received {self.received}"
        text += "" if text.endswith(("?", ".")) else "."
        if self.detail:
            text += f" ({self.detail})"
        for note in self.notes:
            text = f"{text.rstrip('.')}. Note: {note}."
        return text

    def __str__(self) -> str:
        outcome = f"; {self.outcome}" if self.outcome else ""
        return f"{self.head()} Fix: {self.fix}{outcome}"


class LazynnError(Exception):
    """Base class of every error lazynn raises. ``parts``: its message in parts (``where``,
    ``expected``, ``received``, ``fix``, and torch's words underneath as ``detail``), or None
    for a message given as plain text.

    >>> import torch, lazynn
    >>> try:
    ...     lazynn.LazyLinear(4)(torch.tensor(1.0))  # a 0-d input: no last dimension to read
    ... except lazynn.LazynnError as error:
    ...     print(error.parts.where, "|", error.parts.expected)
    LazyLinear | an input of rank >= 1 to infer in_features
    >>> lazynn.LazynnError("plain text").parts is None
    True
    """

    parts: Parts | None

    def __init__(self, message: Parts | str = "", *args: Any) -> None:
        super().__init__(str(message), *args)
        self.parts = message if isinstance(message, Parts) else None


class InferenceError(LazynnError, ValueError, RuntimeError):
    """An input from which a layer's sizes cannot be inferred, or that the built layer's
    forward refuses; the layer is left unbuilt.

    Subclasses both ``ValueError`` and ``RuntimeError``: for the same bad first input torch
    raises one or the other (a batch of one for BatchNorm, a kernel larger than the input),
    so code written against torch keeps working.

    >>> import torch, lazynn
    >>> layer = lazynn.LazyConv2d(4, kernel_size=3)
    >>> try:
    ...     layer(torch.randn(2, 3, 2, 2))  # smaller than the kernel
    ... except ValueError as error:
    ...     print(type(error).__name__, isinstance(error, RuntimeError), lazynn.is_lazy(layer))
    InferenceError True True
    """


class UnbuiltError(LazynnError, RuntimeError, ValueError):
    """Data was asked of a placeholder, or of a module that has not been built yet.

    Subclasses both ``RuntimeError`` and ``ValueError``: torch raises one or the other for the
    same misuse of its own lazy placeholders, so code written against torch keeps working.
    ``placeholder``: the placeholder asked, when one was.

    >>> import lazynn
    >>> layer = lazynn.LazyLinear(4)
    >>> try:
    ...     layer.weight.sum()
    ... except RuntimeError as error:
    ...     print(type(error).__name__, "|", str(error).split(":")[0])
    UnbuiltError | the 'weight' of LazyLinear
    """

    placeholder: Any = None


class NeedsValuesError(InferenceError):
    """A forward whose shapes depend on values (``torch.nonzero``), which a run on meta
    tensors cannot follow: build it with a real call instead.

    >>> import torch, lazynn
    >>> from torch import nn
    >>> class Positives(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = lazynn.LazyLinear(2)
    ...     def forward(self, x):
    ...         return self.fc(x[x > 0])  # its size: how many values are positive
    >>> try:
    ...     lazynn.build(Positives(), (4,))
    ... except lazynn.NeedsValuesError as error:
    ...     print(str(error).split(":")[0])
    Positives (root)
    >>> Positives()(torch.ones(4)).shape  # a real call builds it
    torch.Size([2])
    """


class AmbiguousInputWarning(UserWarning):
    """A first input from which a layer read a size that may not be the one meant: an
    unbatched input (a forgotten batch or channel dimension), or a channel count that looks
    like a spatial size (channels-last images). The layer is built as torch reads the input;
    the warning says how to give the other reading. Silence it where the reading is meant:
    ``warnings.filterwarnings("ignore", category=lazynn.AmbiguousInputWarning)``.

    >>> import warnings, torch, lazynn
    >>> conv = lazynn.LazyConv2d(8, 3)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = conv(torch.randn(3, 32, 32))  # one (C, H, W) image, or 3 one-channel ones?
    >>> caught[0].category.__name__, conv.in_channels
    ('AmbiguousInputWarning', 3)
    """


class ArgumentError(LazynnError, TypeError, ValueError):
    """A lazy layer's constructor argument that contradicts its eager class's signature: a
    number other than 0 or 1 for a bool parameter (``bias=3072``), an int of 1 or more for an
    ``eps`` or a ``momentum``. Most often a half-ported line, its input size left in:
    ``LazyLinear(768, 3072)`` reads as ``out_features=768, bias=3072``.

    Subclasses both ``TypeError`` (an argument of the wrong type) and ``ValueError`` (torch
    refuses a constructor argument out of range with one, ``nn.Dropout(p=2)``), so code that
    guards a construction with either catches it.

    >>> import lazynn
    >>> try:
    ...     lazynn.LazyLinear(768, 3072)  # the input size left in
    ... except lazynn.ArgumentError as error:
    ...     print(str(error).split(" Fix: ")[1].split(";")[0])
    delete the input size, which lazynn infers: LazyLinear(3072)
    """


class CheckpointError(LazynnError, RuntimeError):
    """A checkpoint whose sizes contradict what a lazy module already knows.

    >>> import lazynn
    >>> from torch import nn
    >>> try:
    ...     lazynn.LazyLinear(4).load_state_dict(nn.Linear(3, 5).state_dict())  # 5 outputs, not 4
    ... except lazynn.CheckpointError as error:
    ...     print(str(error).split(" Fix: ")[1].split(";")[0])
    construct the layer with the arguments the checkpoint was saved with
    """


#: words spelt with a vowel but said with a consonant ("a unicode", "a UUID", "a one")
_CONSONANT_SOUND = ("uni", "use", "usu", "uu", "eu", "one")


def a_or_an(word: str) -> str:
    """``word`` after its indefinite article, for messages that name a type
    (``f"is {a_or_an(type(value).__name__)} object"``).

    >>> a_or_an("int"), a_or_an("float"), a_or_an("OrderedDict"), a_or_an("UUID")
    ('an int', 'a float', 'an OrderedDict', 'a UUID')
    """
    vowel = word[:1].lower() in ("a", "e", "i", "o", "u")
    return f"{'an' if vowel and not word.lower().startswith(_CONSONANT_SOUND) else 'a'} {word}"


def shape_str(shape: Sequence[int]) -> str:
    """``(8, 3, 32, 32)`` for a shape; ``(5,)`` for one dimension."""
    dims = tuple(int(d) for d in shape)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def message(
    where: str,
    expected: str,
    received: str,
    fix: str,
    detail: str = "",
    *,
    key: Fix | None = None,
    value: Any = None,
    outcome: str = "",
) -> Parts:
    """An error's message in its parts (:class:`Parts`; ``str()`` of it is the text
    ``"{where}: expected {expected}, received {received}. Fix: {fix}"``)."""
    return Parts(where, expected, received, fix, detail, key, value, outcome)


#: CPython before 3.13 caches a frame's locals in a dict the frame keeps (PEP 667 ended that)
_CACHED_LOCALS = sys.version_info < (3, 13)
_OPTIMIZED = inspect.CO_OPTIMIZED


def frame_locals(frame: FrameType, names: tuple[str, ...]) -> dict[str, Any]:
    """The locals ``names`` of a calling frame (those it has), read without keeping its other
    locals alive: before Python 3.13, ``frame.f_locals`` of a function's frame is a snapshot
    the frame holds until it returns, so objects its code has dropped would live on. The
    snapshot is emptied after the read (the frame's own variables are not touched: the next
    ``f_locals`` rebuilds it)."""
    snapshot = frame.f_locals
    try:
        return {name: snapshot[name] for name in names if name in snapshot}
    finally:
        if _CACHED_LOCALS and frame.f_code.co_flags & _OPTIMIZED:
            snapshot.clear()


def _find_child(root: nn.Module, target: nn.Module) -> str | None:
    """The dotted path of ``target`` below ``root``, or None (breadth-first, no recursion)."""
    queue: list[tuple[str, nn.Module]] = [("", root)]
    seen = {id(root)}
    while queue:
        prefix, module = queue.pop(0)
        for name, child in module._modules.items():
            if child is None or id(child) in seen:
                continue
            path = f"{prefix}.{name}" if prefix else name
            if child is target:
                return path
            seen.add(id(child))
            queue.append((path, child))
    return None


def _is_wrapper(module: nn.Module) -> bool:
    """A module that only wraps the user's model (its path step is not the user's)."""
    return type(module).__name__ in (
        "OptimizedModule",
        "DistributedDataParallel",
        "DataParallel",
        "FullyShardedDataParallel",
    )


def module_path(module: nn.Module, known: str | None = None, name: str | None = None) -> str:
    """Where ``module`` sits in the model being run, as ``"LazyLinear at 'encoder.fc'"``.

    ``known`` is used when the caller knows the path (a state_dict prefix, a build pass).
    Otherwise the path is read off the Python call stack: each enclosing frame whose ``self``
    is an ``nn.Module`` that holds the module below it names one more step. This costs a
    stack walk, so it runs only when an error is being worded. ``name`` is the module's class
    name to show (a lazy layer's, once the build swapped its class).
    """
    name = name or type(module).__name__
    if known is not None:
        return f"{name} at '{known}'" if known else f"{name} (the root module)"
    if torch.compiler.is_dynamo_compiling():
        # traced by torch.compile: dynamo cannot follow a frame walk (2.15 warns of
        # sys._getframe, which a warning filter can make an error), and the frames are its own
        return name
    parts = _steps(module)
    if not parts:
        return name
    return f"{name} at '{'.'.join(parts)}'"


def _steps(module: nn.Module) -> list[str]:
    """The path steps of ``module`` read off the call stack, outermost first."""
    parts: list[str] = []
    target = module
    frame: FrameType | None = sys._getframe(1)  # CPython frame access: only on the error path.
    while frame is not None:
        owner = frame_locals(frame, ("self",)).get("self")
        if isinstance(owner, nn.Module) and owner is not target:
            step = _find_child(owner, target)
            if step is not None:
                if _is_wrapper(owner):  # torch.compile / DDP / DataParallel add one level
                    step = step.split(".", 1)[1] if "." in step else ""
                if step:
                    parts.insert(0, step)
                target = owner
        frame = frame.f_back
    return parts


def meta_limitation(error: BaseException) -> bool:
    """Whether a failure on meta tensors says nothing about the input: an operation that
    needs values (``.item()``, ``torch.nonzero``), which meta tensors do not hold, or that
    has no meta kernel. (A ``NotImplementedError`` of a module's own, a forward not written
    or an input it does not support, is about the input.)"""
    text = str(error).lower()
    if isinstance(error, NotImplementedError):
        return "meta" in text  # ("... with arguments from the 'Meta' backend", "Meta kernel")
    return isinstance(error, RuntimeError) and ("meta tensor" in text or "data-dependent" in text)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (torch's messages run on with context)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


# --- torch's own words, kept inside lazynn's ----------------------------------------------


def func_name(func: Callable[..., Any]) -> str:
    """A torch function's name as a user writes it (``Tensor.shape``, ``torch.add``,
    ``torch.nn.functional.linear``), for messages."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") in ("__get__", "__set__") and owner is not None:
        return f"Tensor.{owner.__name__}"  # a property such as Tensor.shape
    qual = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    module = str(getattr(func, "__module__", None) or "")
    if isinstance(owner, types.ModuleType) and owner.__name__ == "torch._C._nn":
        return f"torch.nn.functional.{qual}"
    if qual.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + qual.split(".", 1)[1]
    if qual.startswith("_VariableFunctionsClass."):
        return "torch." + qual.split(".", 1)[1]
    return f"{module}.{qual}" if module and not module.startswith("torch._C") else f"torch.{qual}"


def torch_phrase(what: str) -> str:
    """torch's own words for using an uninitialized placeholder in ``what`` (kept inside
    lazynn's messages: code and tests that match torch's phrases keep working)."""
    if what in ("Tensor.shape", "Tensor.ndim", "Tensor.size()"):
        return "Can't access the shape of an uninitialized parameter or buffer"
    if what.startswith("Tensor.share_memory_"):
        return "Can't share memory on an uninitialized parameter or buffer"
    return f"Attempted to use an uninitialized parameter in {what}"


def with_note(error: Exception, note: str) -> Exception:
    """``error`` (a new one of its class) with ``note`` before its fix: ``"... received X.
    Note: NOTE. Fix: ..."``. Its parts (and so its fix key) and its other attributes (an
    :class:`UnbuiltError`'s ``placeholder``) are kept: the way to add context to an error
    on its way out, never ``type(error)(f"{error} ...")``, which keeps the text alone."""
    parts = getattr(error, "parts", None)
    if isinstance(parts, Parts):
        noted = type(error)(dataclasses.replace(parts, notes=(*parts.notes, note)))
    else:
        head, sep, fix = str(error).rpartition(" Fix: ")
        head = (head if sep else str(error)).rstrip(".")
        noted = type(error)(f"{head}. Note: {note}.{sep}{fix}")
    for name, value in vars(error).items():
        if name != "parts":
            setattr(noted, name, value)
    return noted
