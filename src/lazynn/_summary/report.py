"""The summary's data: frozen rows (:class:`SummaryRow`) and totals (:class:`Report`), and
their JSON-ready form (``to_dict()``). Nothing here renders: ``render.py`` does, and
:class:`lazynn.Summary` (``summary.py``) is a :class:`Report` with its renderings.

>>> import torch, lazynn
>>> net = torch.nn.Sequential(lazynn.LazyLinear(8), torch.nn.ReLU(), lazynn.LazyLinear(2))
>>> report = lazynn.summary(net, (4, 16))
>>> report.to_dict()["rows"][1]["params"], report.to_dict()["total_flops"]
(136, 1152)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .memory import Memory

__all__ = ["Dim", "Report", "Shape", "SummaryRow", "dtype_name"]

#: a dimension: a size, or a symbolic batch such as "B" (or "2B")
Dim = int | str
#: a tensor's shape and dtype
Shape = tuple[tuple[Dim, ...], torch.dtype]


@dataclass(frozen=True)
class SummaryRow:
    """One module: where it is, what it becomes, what it sees, what it holds.

    Counts are its own tensors (not its submodules'); a tensor tied to one listed earlier
    (``tied``) is counted there, so the rows add up to the totals. ``flops`` are those of all
    its calls, its submodules' included.
    """

    path: str
    depth: int
    type: str
    lazy_type: str | None  # the lazy class it was before the build, if any
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    num_parameters: int
    trainable: int
    param_bytes: int
    buffer_bytes: int
    calls: int = 1
    flops: int = 0
    #: own tensor name -> the path of the tensor it is (counted there)
    tied: tuple[tuple[str, str], ...] = ()
    #: why a size this lazy layer read may not be the one meant, with the fix (marked ``!``)
    note: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes of its own parameters and buffers."""
        return self.param_bytes + self.buffer_bytes

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (dtypes as names)."""
        return {
            "path": self.path,
            "type": self.type,
            "lazy_type": self.lazy_type,
            "input_shapes": [list(dims) for dims, _ in self.inputs],
            "input_dtypes": [dtype_name(d) for _, d in self.inputs],
            "output_shapes": [list(dims) for dims, _ in self.outputs],
            "output_dtypes": [dtype_name(d) for _, d in self.outputs],
            "params": self.num_parameters,
            "trainable_params": self.trainable,
            "param_shapes": {name: list(shape) for name, shape in self.parameters},
            "param_bytes": self.param_bytes,
            "buffer_bytes": self.buffer_bytes,
            "flops": self.flops,
            "calls": self.calls,
            "tied": dict(self.tied),
            "note": self.note or None,
        }


@dataclass(frozen=True)
class Report:
    """The layers of a model as the build makes them, as data (``lazynn.Summary`` is this
    with its renderings).

    Totals count each tensor once (shared weights once), and equal
    ``sum(p.numel() for p in model.parameters())`` of the built model. ``total_flops`` is what
    ``torch.utils.flop_counter.FlopCounterMode`` counts for one forward of the examples.
    """

    model_type: str
    rows: tuple[SummaryRow, ...]
    total_parameters: int
    trainable_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    #: lazy layers the examples never reached: their sizes, and so the totals, are unknown
    unreached: tuple[str, ...] = ()
    total_flops: int = 0
    #: "train" or "eval": the mode the examples ran in
    mode: str = "train"
    #: the symbolic batch dimension's name ("B"), if the examples had one: shapes show it,
    #: FLOPs and activations are per sample (B=1)
    batch: str | None = None
    #: the training-memory estimate, when asked for (``training=True``)
    memory: Memory | None = None

    @property
    def non_trainable_parameters(self) -> int:
        return self.total_parameters - self.trainable_parameters

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready values: ``json.dumps(summary.to_dict())`` works."""
        out: dict[str, Any] = {
            "model_type": self.model_type,
            "mode": self.mode,
            "batch": self.batch,
            "input_shapes": [list(dims) for dims, _ in self.inputs],
            "output_shapes": [list(dims) for dims, _ in self.outputs],
            "total_params": self.total_parameters,
            "trainable_params": self.trainable_parameters,
            "non_trainable_params": self.non_trainable_parameters,
            "total_flops": self.total_flops,
            "param_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "unreached": list(self.unreached),
            "rows": [row.to_dict() for row in self.rows],
        }
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).replace("torch.", "")
