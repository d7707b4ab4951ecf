"""Recurrent layers and cells: ``input_size`` read from the input's last dimension.

LazyRNN / LazyLSTM / LazyGRU(hidden_size, ...)              input_size = H_in of (L, N, H_in),
                                                            (N, L, H_in), (L, H_in) or a
                                                            PackedSequence's data
LazyRNNCell / LazyLSTMCell / LazyGRUCell(hidden_size, ...)  input_size = last dim
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn

from .._layer.base import LazyLayer
from .._layer.infer import Infer
from .._layer.lazy import lazy

__all__ = ["LazyGRU", "LazyGRUCell", "LazyLSTM", "LazyLSTMCell", "LazyRNN", "LazyRNNCell"]

_LAST = Infer(dim=-1)

LazyRNNCell = lazy(nn.RNNCell, input_size=_LAST)
LazyRNNCell.__doc__ = """``nn.RNNCell(input_size, hidden_size, ...)`` with ``input_size`` read from
the input's last dimension, ``(N, H_in)`` or ``(H_in,)``. Other arguments as ``nn.RNNCell``'s.

>>> import torch, lazynn
>>> cell = lazynn.LazyRNNCell(4, nonlinearity="relu")
>>> cell(torch.randn(3, 7)).shape, cell.input_size
(torch.Size([3, 4]), 7)
"""
LazyLSTMCell = lazy(nn.LSTMCell, input_size=_LAST)
LazyLSTMCell.__doc__ = """``nn.LSTMCell(input_size, hidden_size, ...)`` with ``input_size`` read
from the input's last dimension, ``(N, H_in)`` or ``(H_in,)``. Other arguments as ``nn.LSTMCell``'s.

>>> import torch, lazynn
>>> cell = lazynn.LazyLSTMCell(4)
>>> h, c = cell(torch.randn(3, 7))
>>> h.shape, c.shape, cell.input_size
(torch.Size([3, 4]), torch.Size([3, 4]), 7)
"""
LazyGRUCell = lazy(nn.GRUCell, input_size=_LAST)
LazyGRUCell.__doc__ = """``nn.GRUCell(input_size, hidden_size, ...)`` with ``input_size`` read from
the input's last dimension, ``(N, H_in)`` or ``(H_in,)``. Other arguments as ``nn.GRUCell``'s.

>>> import torch, lazynn
>>> cell = lazynn.LazyGRUCell(4)
>>> cell(torch.randn(3, 7)).shape, cell.input_size
(torch.Size([3, 4]), 7)
"""


class _LazyRNNBase(LazyLayer):
    """``input_size`` from the input's last dimension (a ``PackedSequence``'s data too)."""

    inferred: ClassVar[Mapping[str, Infer]] = {"input_size": Infer(dim=-1)}


class LazyRNN(_LazyRNNBase, nn.RNN):
    """``nn.RNN(input_size, hidden_size, ...)`` with ``input_size`` inferred.

    Input ``(L, N, H_in)`` (``(N, L, H_in)`` with ``batch_first``), unbatched ``(L, H_in)``,
    or a ``PackedSequence``; ``input_size = H_in``.

    >>> import torch, lazynn
    >>> rnn = lazynn.LazyRNN(4, num_layers=2)
    >>> out, h = rnn(torch.randn(5, 3, 7))
    >>> type(rnn).__name__, rnn.input_size, tuple(out.shape)
    ('RNN', 7, (5, 3, 4))
    """

    cls_to_become = nn.RNN

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(
            hidden_size=hidden_size, num_layers=num_layers, nonlinearity=nonlinearity,
            bias=bias, batch_first=batch_first, dropout=dropout, bidirectional=bidirectional,
            device=device, dtype=dtype,
        )  # fmt: skip


class LazyLSTM(_LazyRNNBase, nn.LSTM):
    """``nn.LSTM(input_size, hidden_size, ...)`` with ``input_size`` inferred (as LazyRNN).

    >>> import torch, lazynn
    >>> lstm = lazynn.LazyLSTM(4, batch_first=True)
    >>> out, (h, c) = lstm(torch.randn(3, 5, 7))
    >>> type(lstm).__name__, lstm.input_size, tuple(out.shape)
    ('LSTM', 7, (3, 5, 4))
    """

    cls_to_become = nn.LSTM

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(
            hidden_size=hidden_size, num_layers=num_layers, bias=bias, batch_first=batch_first,
            dropout=dropout, bidirectional=bidirectional, proj_size=proj_size, device=device,
            dtype=dtype,
        )  # fmt: skip


class LazyGRU(_LazyRNNBase, nn.GRU):
    """``nn.GRU(input_size, hidden_size, ...)`` with ``input_size`` inferred (as LazyRNN).

    >>> import torch, lazynn
    >>> gru = lazynn.LazyGRU(4, batch_first=True)
    >>> out, h = gru(torch.randn(3, 5, 7))
    >>> type(gru).__name__, gru.input_size, tuple(out.shape)
    ('GRU', 7, (3, 5, 4))
    """

    cls_to_become = nn.GRU

    def __init__(
        self,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._lazynn_setup(
            hidden_size=hidden_size, num_layers=num_layers, bias=bias, batch_first=batch_first,
            dropout=dropout, bidirectional=bidirectional, device=device, dtype=dtype,
        )  # fmt: skip
