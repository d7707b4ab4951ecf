"""More torch.nn layers whose sizes the input tells, each declared in one line with lazy().

    LazyGroupNorm(num_groups, ...)      num_channels = C of (N, C, *)
    LazyPReLU(init=0.25, ...)           num_parameters = C of (N, C, *): one slope per channel
    LazySyncBatchNorm(...)              num_features = C of (N, C, *)
    LazyBilinear(out_features, ...)     in1_features, in2_features = last dims of the two inputs
    LazyRNNCell / LazyLSTMCell / LazyGRUCell(hidden_size, ...)   input_size = last dim
    LazyTransformerEncoderLayer / LazyTransformerDecoderLayer(nhead, ...)  d_model = last dim
    LazyAdaptiveLogSoftmaxWithLoss(n_classes, cutoffs, ...)      in_features = last dim
    LazyLinearCrossEntropyLoss(num_classes, ...)                  in_features = last dim
    LazyTransformer(nhead=8, ...)                                 d_model = the source's last dim
    LazyLayerNorm(..., dims=1) / LazyRMSNorm(..., dims=1)   normalized_shape = last `dims` dims

>>> import torch, lazynn
>>> norm = lazynn.LazyGroupNorm(2)
>>> norm(torch.randn(4, 6, 5)).shape, type(norm).__name__, norm.num_channels
(torch.Size([4, 6, 5]), 'GroupNorm', 6)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from ._declare import CLASS_KEY, Infer, LazyLayer, _placeholder_for
from ._errors import module_path
from ._factory import lazy
from ._mixin import is_unbuilt, rehearsing
from ._placeholder import UninitializedParameter, _raw
from ._snapshot import Snapshot

__all__ = [
    "LazyAdaptiveLogSoftmaxWithLoss",
    "LazyBilinear",
    "LazyGRU",
    "LazyGRUCell",
    "LazyGroupNorm",
    "LazyLSTM",
    "LazyLSTMCell",
    "LazyLayerNorm",
    "LazyLinearCrossEntropyLoss",
    "LazyMultiheadAttention",
    "LazyPReLU",
    "LazyRMSNorm",
    "LazyRNN",
    "LazyRNNCell",
    "LazySyncBatchNorm",
    "LazyTransformer",
    "LazyTransformerDecoderLayer",
    "LazyTransformerEncoderLayer",
]

_LAST = Infer(dim=-1)

LazyGroupNorm = lazy(nn.GroupNorm, num_channels=Infer(dim=1, probe="num_groups"))
LazyPReLU = lazy(nn.PReLU, num_parameters=Infer(dim=1))
LazySyncBatchNorm = lazy(nn.SyncBatchNorm, num_features=Infer(dim=1))
LazyBilinear = lazy(
    nn.Bilinear, in1_features=Infer(arg=0, dim=-1), in2_features=Infer(arg=1, dim=-1)
)
LazyRNNCell = lazy(nn.RNNCell, input_size=_LAST)
LazyLSTMCell = lazy(nn.LSTMCell, input_size=_LAST)
LazyGRUCell = lazy(nn.GRUCell, input_size=_LAST)
LazyTransformerEncoderLayer = lazy(nn.TransformerEncoderLayer, d_model=Infer(probe="nhead"))
LazyTransformerDecoderLayer = lazy(nn.TransformerDecoderLayer, d_model=Infer(probe="nhead"))
LazyAdaptiveLogSoftmaxWithLoss = lazy(nn.AdaptiveLogSoftmaxWithLoss, in_features=_LAST)
LazyLinearCrossEntropyLoss = lazy(nn.LinearCrossEntropyLoss, in_features=_LAST)
LazyTransformer = lazy(nn.Transformer, d_model=Infer(probe="nhead"))


def _trailing(dims: int) -> Mapping[str, Infer]:
    if not isinstance(dims, int) or dims < 1:
        raise ValueError(
            f"dims: expected a positive number of trailing dimensions, received {dims!r}"
        )
    return {"normalized_shape": Infer(trailing=dims)}


class LazyLayerNorm(LazyLayer, nn.LayerNorm):
    """``nn.LayerNorm`` with ``normalized_shape`` read from the input's trailing dimensions.

    Input ``(*, D_1, ..., D_k)``; ``normalized_shape = (D_1, ..., D_k)`` with ``k = dims``
    (default 1: the last dimension). Other arguments as ``nn.LayerNorm``.

    >>> import torch, lazynn
    >>> norm = lazynn.LazyLayerNorm(dims=2)
    >>> norm(torch.randn(4, 3, 5)).shape, norm.normalized_shape
    (torch.Size([4, 3, 5]), (3, 5))
    """

    cls_to_become = nn.LayerNorm
    inferred: ClassVar[Mapping[str, Infer]] = _trailing(1)
    mixed_precision_input = True  # float16/bfloat16 input with float32 parameters, as eager

    def __init__(
        self,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dims: int = 1,
    ) -> None:
        self.__dict__["_lazynn_inferred"] = _trailing(dims)
        self._lazynn_setup(
            eps=eps, elementwise_affine=elementwise_affine, bias=bias, device=device, dtype=dtype
        )


class LazyRMSNorm(LazyLayer, nn.RMSNorm):
    """``nn.RMSNorm`` with ``normalized_shape`` read from the input's trailing dimensions.

    Input ``(*, D_1, ..., D_k)``; ``normalized_shape = (D_1, ..., D_k)`` with ``k = dims``
    (default 1). Other arguments as ``nn.RMSNorm``.

    >>> import torch, lazynn
    >>> norm = lazynn.LazyRMSNorm()
    >>> norm(torch.randn(4, 6)).shape, norm.normalized_shape
    (torch.Size([4, 6]), (6,))
    """

    cls_to_become = nn.RMSNorm
    inferred: ClassVar[Mapping[str, Infer]] = _trailing(1)
    any_float_input = True  # nn.RMSNorm computes a float64 input with float32 weights

    def __init__(
        self,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        dims: int = 1,
    ) -> None:
        self.__dict__["_lazynn_inferred"] = _trailing(dims)
        self._lazynn_setup(
            eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype
        )


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
    """``nn.GRU(input_size, hidden_size, ...)`` with ``input_size`` inferred (as LazyRNN)."""

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


class LazyMultiheadAttention(LazyLayer, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` with ``embed_dim`` from the query's last dimension.

    ``kdim`` / ``vdim`` are read from the key and value too, unless given. A key or value
    whose size differs from the query's gives the eager layer other parameters: separate
    ``q_proj_weight`` / ``k_proj_weight`` / ``v_proj_weight`` instead of one
    ``in_proj_weight``. The build then lays the layer out that way: the ``in_proj_weight``
    placeholder becomes ``q_proj_weight`` and the other two are added, with a warning, since
    an optimizer made before the build holds neither. Declare ``kdim=`` / ``vdim=`` to have
    every parameter from construction.

    Shapes: query ``(L, E)`` or ``(N, L, E)`` (``batch_first``) or ``(L, N, E)``; key
    ``(S, N, kdim)``, value ``(S, N, vdim)`` in the same layout.

    >>> import torch, lazynn
    >>> mha = lazynn.LazyMultiheadAttention(2, batch_first=True)
    >>> q = torch.randn(3, 5, 8)
    >>> out, weights = mha(q, q, q)
    >>> type(mha).__name__, mha.embed_dim, tuple(out.shape)
    ('MultiheadAttention', 8, (3, 5, 8))
    >>> cross = lazynn.LazyMultiheadAttention(2, kdim=6, vdim=6)
    >>> _ = cross(torch.randn(5, 3, 8), torch.randn(4, 3, 6), torch.randn(4, 3, 6))
    >>> cross.k_proj_weight.shape
    torch.Size([8, 6])
    """

    cls_to_become = nn.MultiheadAttention
    inferred: ClassVar[Mapping[str, Infer]] = {"embed_dim": Infer(dim=-1, probe="num_heads")}

    def __init__(
        self,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        specs = dict(self.inferred)
        if kdim is None:
            specs["kdim"] = Infer(arg=1, dim=-1, probe="num_heads")
        if vdim is None:
            specs["vdim"] = Infer(arg=2, dim=-1, probe="num_heads")
        self.__dict__["_lazynn_inferred"] = specs
        kwargs = {"kdim": kdim} if kdim is not None else {}
        if vdim is not None:
            kwargs["vdim"] = vdim
        self._lazynn_setup(
            num_heads=num_heads, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, batch_first=batch_first, device=device, dtype=dtype,
            **kwargs,
        )  # fmt: skip

    # --- one fused projection or three, as the key and value sizes decide ---------------------
    def _lazynn_relayout(self, sizes: Mapping[str, Any]) -> bool:
        """Lay the placeholders out as the eager layer with ``sizes`` has them: one
        ``in_proj_weight``, or separate ``q/k/v_proj_weight`` (a key or value size unlike the
        query's). Returns whether anything changed."""
        layout = self._lazynn_construct(
            {k: v for k, v in sizes.items() if k != CLASS_KEY}, "meta"
        )._parameters
        own = self._parameters
        if [n for n, t in layout.items() if t is not None] == [
            n for n, t in own.items() if t is not None
        ]:
            return False
        # The query's placeholder (perhaps held by an optimizer) carries over: in_proj_weight
        # becomes q_proj_weight, or q_proj_weight becomes in_proj_weight.
        fused = own.get("in_proj_weight")
        carrier: Any = fused if fused is not None else own["q_proj_weight"]
        placed: dict[str, Any] = {}
        for name, tensor in layout.items():
            if tensor is None:
                placed[name] = None
            elif name in ("in_proj_weight", "q_proj_weight"):
                placed[name] = carrier
                carrier._lazynn_owner = f"the '{name}' of {type(self).__name__}"
            elif own.get(name) is not None:
                placed[name] = own[name]
            else:
                placed[name] = _placeholder_for(
                    carrier, UninitializedParameter, _raw(carrier).device, self, "", name
                )
        own.clear()
        own.update(placed)
        record = {k: v for k, v in self._lazynn_placeholders.items() if k[0]}
        record.update({("", n): t for n, t in placed.items() if t is not None})
        self._lazynn_placeholders.clear()
        self._lazynn_placeholders.update(sorted(record.items(), key=lambda kv: kv[0][0] != ""))
        return True

    def _lazynn_check_layout(self, shadow: nn.Module, sizes: Mapping[str, Any]) -> None:
        if self._lazynn_relayout(sizes) and not rehearsing():
            _warn_relayout(self, sizes)  # (a rehearsal puts everything back after)
        super()._lazynn_check_layout(shadow, sizes)

    def _lazynn_build(
        self,
        sizes: Mapping[str, int],
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        source: nn.Module | None = None,
    ) -> None:
        if self._lazynn_relayout(sizes) and not rehearsing():
            _warn_relayout(self, sizes)  # (lazynn.build comes here directly)
        super()._lazynn_build(sizes, device, dtype, source)

    def _lazynn_build_from_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        # Lay the placeholders out as the checkpoint is, solve, or put everything back.
        snapshot = Snapshot(self)
        try:
            probe = {
                name: spec.probe_value(self._lazynn_kwargs)
                for name, spec in self._lazynn_specs().items()
            }
            separate = prefix + "q_proj_weight" in state_dict
            unlike: dict[str, Any] = {
                n: probe["embed_dim"] + separate for n in ("kdim", "vdim") if n in probe
            }
            changed = self._lazynn_relayout({**probe, **unlike})
            super()._lazynn_build_from_state(state_dict, prefix)
        except BaseException:
            snapshot.restore()
            raise
        if changed and not is_unbuilt(self):
            _warn_relayout(
                self, {"embed_dim": self.embed_dim, "kdim": self.kdim, "vdim": self.vdim}
            )

    def _lazynn_solve_sizes(
        self, found: Mapping[tuple[str, str], torch.Size], where: str, prefix: str
    ) -> dict[str, Any]:
        # kdim / vdim are the checkpoint's k/v_proj_weight widths (separate projections), or
        # the query's size (one in_proj_weight): solve embed_dim alone.
        specs = self.__dict__["_lazynn_inferred"]
        self.__dict__["_lazynn_inferred"] = {"embed_dim": specs["embed_dim"]}
        try:
            sizes = super()._lazynn_solve_sizes(found, where, prefix)
        finally:
            self.__dict__["_lazynn_inferred"] = specs
        for name, weight in (("kdim", "k_proj_weight"), ("vdim", "v_proj_weight")):
            if name in specs:
                shape = found.get(("", weight))
                sizes[name] = shape[-1] if shape is not None else sizes["embed_dim"]
        return sizes


def _warn_relayout(layer: nn.Module, sizes: Mapping[str, Any]) -> None:
    embed = sizes["embed_dim"]
    declared = layer.__dict__.get("_lazynn_kwargs", {})
    kdim, vdim = (sizes.get(n, declared.get(n)) for n in ("kdim", "vdim"))
    if layer._parameters.get("in_proj_weight") is None:
        change = (
            f"kdim={kdim}, vdim={vdim} unlike embed_dim={embed}: it has separate "
            "q_proj_weight, k_proj_weight and v_proj_weight (its in_proj_weight became "
            "q_proj_weight), so an optimizer made before this build lacks k_proj_weight and "
            "v_proj_weight. Declare kdim= and vdim= to have every parameter from construction"
        )
    else:
        change = (
            f"kdim={kdim}, vdim={vdim} equal to embed_dim={embed}: it has one in_proj_weight "
            "(its q_proj_weight became in_proj_weight), so an optimizer made before this build "
            "holds k_proj_weight and v_proj_weight, which the layer no longer has. Leave kdim "
            "and vdim undeclared when they equal the query's size"
        )
    warnings.warn(f"lazynn: {module_path(layer)} built with {change}.", stacklevel=4)
