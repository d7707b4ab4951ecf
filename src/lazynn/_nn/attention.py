"""Multi-head attention: ``embed_dim`` from the query, ``kdim`` / ``vdim`` from key and value.

LazyMultiheadAttention(num_heads, ...)   embed_dim = E of the query (L, N, E);
                                         kdim, vdim = last dims of key and value
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from .._errors import module_path
from .._layer.base import LazyLayer
from .._layer.infer import CLASS_KEY, Infer
from .._module.kept import Init
from .._module.lifecycle import is_unbuilt, rehearsing, warn_built
from .._module.placeholder import UninitializedParameter, placeholder_for
from .._module.snapshot import Snapshot
from .._module.state import find_state, lazy_state
from .._module.tensors import raw

__all__ = ["LazyMultiheadAttention"]


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
        lazy_state(self).specs = specs
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
                placed[name] = placeholder_for(
                    carrier, UninitializedParameter, raw(carrier).device, self, "", name
                )
        own.clear()
        own.update(placed)
        declared = self._lazynn.placeholders
        record = {k: v for k, v in declared.items() if k[0]}
        record.update({("", n): t for n, t in placed.items() if t is not None})
        declared.clear()
        declared.update(sorted(record.items(), key=lambda kv: kv[0][0] != ""))
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
    ) -> list[tuple[Init, torch.Tensor]]:
        if self._lazynn_relayout(sizes) and not rehearsing():
            _warn_relayout(self, sizes)  # (lazynn.build comes here directly)
        return super()._lazynn_build(sizes, device, dtype, source)

    def _lazynn_build_from_state(
        self, state_dict: dict[str, Any], prefix: str, assign: bool = False
    ) -> None:
        # Lay the placeholders out as the checkpoint is, solve, or put everything back.
        snapshot = Snapshot(self)
        try:
            probe = {
                name: spec.probe_value(self._lazynn.kwargs)
                for name, spec in self._lazynn_specs().items()
            }
            separate = prefix + "q_proj_weight" in state_dict
            unlike: dict[str, Any] = {
                n: probe["embed_dim"] + separate for n in ("kdim", "vdim") if n in probe
            }
            changed = self._lazynn_relayout({**probe, **unlike})
            super()._lazynn_build_from_state(state_dict, prefix, assign)
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
        state = self._lazynn
        specs = state.specs
        assert specs is not None  # (set in __init__)
        state.specs = {"embed_dim": specs["embed_dim"]}
        try:
            sizes = super()._lazynn_solve_sizes(found, where, prefix)
        finally:
            state.specs = specs
        for name, weight in (("kdim", "k_proj_weight"), ("vdim", "v_proj_weight")):
            if name in specs:
                shape = found.get(("", weight))
                sizes[name] = shape[-1] if shape is not None else sizes["embed_dim"]
        return sizes


def _warn_relayout(layer: nn.Module, sizes: Mapping[str, Any]) -> None:
    embed = sizes["embed_dim"]
    state = find_state(layer)
    declared = state.kwargs if state is not None else {}
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
    warn_built(f"lazynn: {module_path(layer)} built with {change}.", stacklevel=4)
