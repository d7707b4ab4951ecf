"""A batch the examples leave free: ``Spec(("B", 16))``, or Keras's ``(None, 16)``.

Sizes never follow the batch in a model that is written to take any batch, so an example may
leave it free: a summary reports shapes and FLOPs per sample of it, and a build runs it as a
number. Either way the model is run at two sizes of it (:data:`TRIES`), and one whose
parameters or buffers change with it (a layer reading its size from a flattened batch) is
refused, naming the tensor: a free batch cannot describe it.

>>> keras_batch(((None, 16), [(None, 3, 8)]))
(Spec(shape=('B', 16), dtype=None), [Spec(shape=('B', 3, 8), dtype=None)])
>>> substituted(Spec(("B", 16)), 2)
Spec(shape=(2, 16), dtype=None)
"""

from __future__ import annotations

from typing import Any

from .._errors import Fix, InferenceError, LazynnError, message
from .learnt import Rehearsal
from .spec import Spec

__all__ = ["BATCH", "TRIES", "batch_name", "check_batch_free", "keras_batch", "substituted"]

#: the batch sizes a free batch is run at (a summary's per-sample figures use all three)
TRIES = (2, 3, 4)
#: the name a Keras shape's ``None`` batch is given
BATCH = "B"


def keras_batch(value: Any) -> Any:
    """``value`` (an example) with each Keras shape, a tuple or list of sizes whose first is
    ``None`` and the rest ints (``(None, 16)``), made a :class:`Spec` whose first dimension
    is :data:`BATCH`; the rest as it is (structures walked)."""
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        if len(value) > 1 and value[0] is None and all(_size(d) for d in value[1:]):
            return Spec((BATCH, *value[1:]))
        return type(value)(keras_batch(v) for v in value)
    if isinstance(value, dict):
        return {k: keras_batch(v) for k, v in value.items()}
    return value


def _size(d: object) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


def _specs(value: Any) -> list[Spec]:
    if isinstance(value, Spec):
        return [value]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _specs(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _specs(v)]
    return []


def batch_name(args: Any, kwargs: dict[str, Any], where: str) -> str | None:
    """The examples' free batch's name, if any: a name as the first dimension of a
    :class:`Spec` (one name at most, and only there); else an error naming ``where``."""
    specs = _specs([args, kwargs])
    inner = [s for s in specs if any(isinstance(d, str) for d in s.shape[1:])]
    if inner:
        raise LazynnError(
            message(
                where,
                "a symbolic dimension as the batch only: the first of a shape (Bx3x224x224)",
                f"Spec{inner[0].shape}",
                "give the other dimensions as numbers: Spec(('B', 3, 224, 224)), or "
                "--input Bx3x224x224",
                key=Fix.SYMBOLIC_FIRST,
            )
        )
    names = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], str)}
    if len(names) > 1:
        raise LazynnError(
            message(
                where,
                "one symbolic dimension (the batch) in the example shapes",
                ", ".join(sorted(names)),
                "name the batch with one name everywhere (Bx3x224x224, Bx16) and give the "
                "other dimensions as numbers",
            )
        )
    return next(iter(names), None)


def substituted(value: Any, n: int) -> Any:
    """``value`` with the free batch of each :class:`Spec` given as ``n``."""
    if isinstance(value, Spec):
        return Spec(tuple(n if isinstance(d, str) else d for d in value.shape), value.dtype)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(substituted(v, n) for v in value)
    if isinstance(value, list):
        return [substituted(v, n) for v in value]
    if isinstance(value, dict):
        return {k: substituted(v, n) for k, v in value.items()}
    return value


def check_batch_free(first: Rehearsal, second: Rehearsal, batch: str) -> None:
    """Refuse a model whose tensors' shapes follow the batch (a layer inferring its size from
    a flattened batch), seen in two runs at ``TRIES[0]`` and ``TRIES[1]``: a free batch
    cannot describe it."""
    for path, infos in first.tensors.items():
        for a, b in zip(infos, second.tensors.get(path, []), strict=False):
            if a.shape != b.shape:
                n, m = TRIES[:2]
                raise InferenceError(
                    message(
                        f"'{path}.{a.name}'" if path else f"'{a.name}'",
                        "parameter and buffer shapes that do not depend on the batch",
                        f"{list(a.shape)} at {batch}={n}, {list(b.shape)} at {batch}={m}",
                        "give the batch as a number (a layer reads its size from it)",
                        key=Fix.NUMERIC_BATCH,
                    )
                )
