"""A Mamba language model, written from state-spaces/mamba: ``mamba_ssm/modules/mamba_simple.py``
(``Mamba``: ``dt_proj`` initialized from a uniform draw and the ``inv_dt`` of a ``torch.rand``
draw copied into its bias, marked ``_no_reinit``; ``A_log`` and ``D`` marked
``_no_weight_decay``), the reference selective scan of ``selective_scan_interface.py``, and
``mamba_ssm/models/mixer_seq_simple.py`` (``MixerModel``, ``MambaLMHeadModel``: the head tied to
the embedding, ``_init_weights`` with the prenorm-residual rescaling of ``out_proj.weight``).

Its forward multiplies by ``in_proj.weight`` and ``dt_proj.weight`` without calling those
layers, so no input tells their sizes: they keep their sizes written (the kit's eager
``Linear``) in the lazy port too; lazynn names such a layer if it is made lazy.
"""

from __future__ import annotations

import math
from collections import namedtuple
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kit import EAGER, Kit


def selective_scan_ref(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> Any:
    """mamba_ssm/ops/selective_scan_interface.py ``selective_scan_ref``, without einops.

    u: r(B D L), delta: r(B D L), A: c(D N) or r(D N), B and C: c(D N) or r(B N L) or
    r(B N 2L) or r(B G N L) or (B G N L), D: r(D), z: r(B D L), delta_bias: r(D), fp32;
    out: r(B D L), last_state (optional): r(B D dstate) or c(B D dstate)."""
    dtype_in = u.dtype
    u = u.float()
    delta = delta.float()
    if delta_bias is not None:
        delta = delta + delta_bias[..., None].float()
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    is_variable_B = B.dim() >= 3
    is_variable_C = C.dim() >= 3
    if A.is_complex():
        if is_variable_B:  # "... (L two) -> ... L two"
            B = torch.view_as_complex(B.float().unflatten(-1, (-1, 2)))
        if is_variable_C:
            C = torch.view_as_complex(C.float().unflatten(-1, (-1, 2)))
    else:
        B = B.float()
        C = C.float()
    x = A.new_zeros((batch, dim, dstate))
    ys = []
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    if not is_variable_B:
        deltaB_u = torch.einsum("bdl,dn,bdl->bdln", delta, B, u)
    else:
        if B.dim() == 3:
            deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
        else:  # "B G N L -> B (G H) N L"
            B = B.repeat_interleave(dim // B.shape[1], dim=1)
            deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", delta, B, u)
    if is_variable_C and C.dim() == 4:
        C = C.repeat_interleave(dim // C.shape[1], dim=1)
    last_state = None
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        if not is_variable_C:
            y = torch.einsum("bdn,dn->bd", x, C)
        else:
            if C.dim() == 3:
                y = torch.einsum("bdn,bn->bd", x, C[:, :, i])
            else:
                y = torch.einsum("bdn,bdn->bd", x, C[:, :, :, i])
        if i == u.shape[2] - 1:
            last_state = x
        if y.is_complex():
            y = y.real * 2
        ys.append(y)
    y = torch.stack(ys, dim=2)  # (batch dim L)
    out = y if D is None else y + u * D[:, None]  # "d -> d 1"
    if z is not None:
        out = out * F.silu(z)
    out = out.to(dtype=dtype_in)
    return out if not return_last_state else (out, last_state)


class Mamba(nn.Module):
    """mamba_ssm/modules/mamba_simple.py ``Mamba``, its forward on the reference path (no
    causal_conv1d, no fused kernel: ``self.conv1d`` then ``selective_scan_ref``).

    Its init code: ``dt_proj``'s weight ``uniform_(-dt_rank**-0.5 * dt_scale, ...)``; its bias
    the inverse softplus of a ``torch.rand`` draw log-uniform in [dt_min, dt_max], copied in
    under ``no_grad`` and marked ``_no_reinit`` (so ``_init_weights`` keeps it); ``A_log`` the
    S4D-real ``log(1..d_state)`` and ``D`` ones, both parameters it makes itself, marked
    ``_no_weight_decay``."""

    def __init__(
        self,
        kit: Kit,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init: str = "random",
        dt_scale: float = 1.0,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        layer_idx: int | None = None,
        proj_kit: Kit | None = None,
    ) -> None:
        super().__init__()
        # (not in the published code: the kit for in_proj and dt_proj, whose weights the forward
        # reads without calling them; None: the model's kit)
        proj_kit = kit if proj_kit is None else proj_kit
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = expand
        self.d_inner = int(self.expand * self.d_model)
        self.dt_rank = math.ceil(self.d_model / 16) if dt_rank == "auto" else dt_rank
        self.layer_idx = layer_idx

        self.in_proj = proj_kit.Linear(self.d_model, self.d_inner * 2, bias=bias)

        self.conv1d = kit.Conv1d(
            self.d_inner,
            self.d_inner,
            d_conv,
            bias=conv_bias,
            groups=self.d_inner,
            padding=d_conv - 1,
        )

        self.activation = "silu"
        self.act = nn.SiLU()

        self.x_proj = kit.Linear(self.d_inner, self.dt_rank + self.d_state * 2, bias=False)
        self.dt_proj = proj_kit.Linear(self.dt_rank, self.d_inner, bias=True)

        # Initialize special dt projection to preserve variance at initialization
        dt_init_std = self.dt_rank**-0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, dt_init_std)
        elif dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        else:
            raise NotImplementedError

        # Initialize dt bias so that F.softplus(dt_bias) is between dt_min and dt_max
        dt = torch.exp(
            torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        ).clamp(min=dt_init_floor)
        # Inverse of softplus: https://github.com/pytorch/pytorch/issues/72759
        inv_dt = dt + torch.log(-torch.expm1(-dt))
        with torch.no_grad():
            self.dt_proj.bias.copy_(inv_dt)
        # Our initialization would set all Linear.bias to zero, need to mark this one as _no_reinit
        self.dt_proj.bias._no_reinit = True

        # S4D real initialization ("n -> d n", d=d_inner)
        A = (
            torch.arange(1, self.d_state + 1, dtype=torch.float32)[None, :]
            .expand(self.d_inner, -1)
            .contiguous()
        )
        A_log = torch.log(A)  # Keep A_log in fp32
        self.A_log = nn.Parameter(A_log)
        self.A_log._no_weight_decay = True

        # D "skip" parameter
        self.D = nn.Parameter(torch.ones(self.d_inner))  # Keep in fp32
        self.D._no_weight_decay = True

        self.out_proj = kit.Linear(self.d_inner, self.d_model, bias=bias)

    def forward(self, hidden_states: torch.Tensor, inference_params: Any = None) -> torch.Tensor:
        """hidden_states: (B, L, D); returns the same shape."""
        batch, seqlen, dim = hidden_states.shape

        # We do matmul and transpose BLH -> HBL at the same time
        # ("b l d -> d (b l)", then "d (b l) -> b d l")
        xz = (
            (self.in_proj.weight @ hidden_states.permute(2, 0, 1).reshape(dim, batch * seqlen))
            .reshape(-1, batch, seqlen)
            .permute(1, 0, 2)
        )
        if self.in_proj.bias is not None:
            xz = xz + self.in_proj.bias.to(dtype=xz.dtype)[:, None]

        A = -torch.exp(self.A_log.float())  # (d_inner, d_state)
        x, z = xz.chunk(2, dim=1)
        # Compute short convolution
        x = self.act(self.conv1d(x)[..., :seqlen])

        # We're careful here about the layout, to avoid extra transposes.
        # We want dt to have d as the slowest moving dimension
        # and L as the fastest moving dimension, since those are what the ssm_scan kernel expects.
        x_dbl = self.x_proj(x.permute(0, 2, 1).reshape(batch * seqlen, -1))  # (bl d)
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = self.dt_proj.weight @ dt.t()
        dt = dt.reshape(-1, batch, seqlen).permute(1, 0, 2)  # "d (b l) -> b d l"
        B = B.reshape(batch, seqlen, -1).permute(0, 2, 1).contiguous()  # "(b l) n -> b n l"
        C = C.reshape(batch, seqlen, -1).permute(0, 2, 1).contiguous()
        assert self.activation in ["silu", "swish"]
        y = selective_scan_ref(
            x,
            dt,
            A,
            B,
            C,
            self.D.float(),
            z=z,
            delta_bias=self.dt_proj.bias.float(),
            delta_softplus=True,
            return_last_state=False,
        )
        y = y.permute(0, 2, 1)  # "b d l -> b l d"
        out = self.out_proj(y)
        return out


class MambaRMSNorm(nn.Module):
    """mamba_ssm/ops/triton/layer_norm.py ``RMSNorm`` in plain torch (``rms_norm_ref``): its
    own class, sized by the config; ``reset_parameters`` fills the weight with ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)
        return x * rstd * self.weight


class MambaBlock(nn.Module):
    """mamba_ssm/modules/block.py ``Block``: Add -> Norm -> Mixer, returning both the mixer's
    output and the residual (the unfused path, no MLP)."""

    def __init__(
        self,
        dim: int,
        mixer_cls: Any,
        mlp_cls: Any,
        norm_cls: Any = nn.LayerNorm,
        fused_add_norm: bool = False,
        residual_in_fp32: bool = False,
    ) -> None:
        super().__init__()
        self.residual_in_fp32 = residual_in_fp32
        self.fused_add_norm = fused_add_norm
        self.norm = norm_cls(dim)
        self.mixer = mixer_cls(dim)
        if mlp_cls is not nn.Identity:
            self.norm2 = norm_cls(dim)
            self.mlp = mlp_cls(dim)
        else:
            self.mlp = None

    def forward(
        self,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None = None,
        inference_params: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = (hidden_states + residual) if residual is not None else hidden_states
        hidden_states = self.norm(residual.to(dtype=self.norm.weight.dtype))
        if self.residual_in_fp32:
            residual = residual.to(torch.float32)
        hidden_states = self.mixer(hidden_states, inference_params=inference_params)
        if self.mlp is not None:
            residual = hidden_states + residual
            residual = self.norm2(residual.to(dtype=self.norm2.weight.dtype))
            if self.residual_in_fp32:
                residual = residual.to(torch.float32)
            hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


def create_block(
    kit: Kit,
    d_model: int,
    ssm_cfg: dict[str, Any] | None = None,
    norm_epsilon: float = 1e-5,
    rms_norm: bool = False,
    residual_in_fp32: bool = False,
    layer_idx: int | None = None,
) -> MambaBlock:
    if ssm_cfg is None:
        ssm_cfg = {}
    mixer_cls = partial(Mamba, kit, layer_idx=layer_idx, **ssm_cfg)
    norm_cls = partial(kit.LayerNorm if not rms_norm else MambaRMSNorm, eps=norm_epsilon)
    block = MambaBlock(
        d_model, mixer_cls, nn.Identity, norm_cls=norm_cls, residual_in_fp32=residual_in_fp32
    )
    block.layer_idx = layer_idx
    return block


def _init_weights(
    module: nn.Module,
    n_layer: int,
    initializer_range: float = 0.02,  # Now only used for embedding layer.
    rescale_prenorm_residual: bool = True,
    n_residuals_per_layer: int = 1,  # Change to 2 if we have MLP
) -> None:
    """mamba_ssm/models/mixer_seq_simple.py ``_init_weights``: Linear biases to zero (unless
    ``_no_reinit``), Embedding ``normal_(std=0.02)``, and every ``out_proj.weight`` re-drawn
    ``kaiming_uniform_(a=sqrt(5))`` then divided by ``sqrt(n_residuals_per_layer * n_layer)``
    (GPT-2's depth scaling)."""
    if isinstance(module, nn.Linear):
        if module.bias is not None:
            if not getattr(module.bias, "_no_reinit", False):
                nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=initializer_range)

    if rescale_prenorm_residual:
        # Reinitialize selected weights subject to the OpenAI GPT-2 Paper Scheme:
        #   > A modified initialization which accounts for the accumulation on the residual path
        #   > with model depth. Scale the weights of residual layers at initialization by a
        #   > factor of 1/sqrt(N) where N is the # of residual layers.
        for name, p in module.named_parameters():
            if name in ["out_proj.weight", "fc2.weight"]:
                # Special Scaled Initialization --> There are 2 Layer Norms per Transformer Block
                # Following Pytorch init, except scale by 1/sqrt(2 * n_layer)
                # We need to reinit p since this code could be called multiple times
                # Having just p *= scale would repeatedly scale it down
                nn.init.kaiming_uniform_(p, a=math.sqrt(5))
                with torch.no_grad():
                    p /= math.sqrt(n_residuals_per_layer * n_layer)


class MixerModel(nn.Module):
    """mamba_ssm/models/mixer_seq_simple.py ``MixerModel``: embedding, ``n_layer`` blocks,
    ``norm_f``; ``self.apply(partial(_init_weights, n_layer=n_layer))``."""

    def __init__(
        self,
        kit: Kit,
        d_model: int,
        n_layer: int,
        vocab_size: int,
        ssm_cfg: dict[str, Any] | None = None,
        norm_epsilon: float = 1e-5,
        rms_norm: bool = False,
        initializer_cfg: dict[str, Any] | None = None,
        residual_in_fp32: bool = False,
    ) -> None:
        super().__init__()
        self.residual_in_fp32 = residual_in_fp32
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            [
                create_block(
                    kit,
                    d_model,
                    ssm_cfg=ssm_cfg,
                    norm_epsilon=norm_epsilon,
                    rms_norm=rms_norm,
                    residual_in_fp32=residual_in_fp32,
                    layer_idx=i,
                )
                for i in range(n_layer)
            ]
        )
        self.norm_f = (kit.LayerNorm if not rms_norm else MambaRMSNorm)(d_model, eps=norm_epsilon)
        self.apply(
            partial(
                _init_weights,
                n_layer=n_layer,
                **(initializer_cfg if initializer_cfg is not None else {}),
            )
        )

    def forward(self, input_ids: torch.Tensor, inference_params: Any = None) -> torch.Tensor:
        hidden_states = self.embedding(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(
                hidden_states, residual, inference_params=inference_params
            )
        residual = (hidden_states + residual) if residual is not None else hidden_states
        hidden_states = self.norm_f(residual.to(dtype=self.norm_f.weight.dtype))
        return hidden_states


class MambaLMHeadModel(nn.Module):
    """mamba_ssm/models/mixer_seq_simple.py ``MambaLMHeadModel``: the backbone, ``lm_head``,
    ``_init_weights`` applied again over the whole model, then ``tie_weights``
    (``self.lm_head.weight = self.backbone.embedding.weight``)."""

    def __init__(
        self,
        kit: Kit,
        d_model: int = 16,
        n_layer: int = 2,
        vocab_size: int = 32,
        ssm_cfg: dict[str, Any] | None = None,
        rms_norm: bool = True,
        residual_in_fp32: bool = True,
        pad_vocab_size_multiple: int = 8,
        tie_embeddings: bool = True,
        initializer_cfg: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.tie_embeddings = tie_embeddings
        if vocab_size % pad_vocab_size_multiple != 0:
            vocab_size += pad_vocab_size_multiple - (vocab_size % pad_vocab_size_multiple)
        self.backbone = MixerModel(
            kit,
            d_model=d_model,
            n_layer=n_layer,
            vocab_size=vocab_size,
            ssm_cfg=ssm_cfg,
            rms_norm=rms_norm,
            initializer_cfg=initializer_cfg,
            residual_in_fp32=residual_in_fp32,
        )
        self.lm_head = kit.Linear(d_model, vocab_size, bias=False)

        # Initialize weights and apply final processing
        self.apply(
            partial(
                _init_weights,
                n_layer=n_layer,
                **(initializer_cfg if initializer_cfg is not None else {}),
            )
        )
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: Any = None,
        inference_params: Any = None,
        num_last_tokens: int = 0,
    ) -> Any:
        hidden_states = self.backbone(input_ids, inference_params=inference_params)
        if num_last_tokens > 0:
            hidden_states = hidden_states[:, -num_last_tokens:]
        lm_logits = self.lm_head(hidden_states)
        CausalLMOutput = namedtuple("CausalLMOutput", ["logits"])
        return CausalLMOutput(logits=lm_logits)


def make(kit: Kit) -> nn.Module:
    """The model, ``in_proj`` and ``dt_proj`` with their sizes written (see the module doc)."""
    ssm_cfg: dict[str, Any] = {"d_state": 4, "d_conv": 4, "expand": 2, "proj_kit": EAGER}
    return MambaLMHeadModel(kit, d_model=16, n_layer=2, vocab_size=32, ssm_cfg=ssm_cfg)


def inputs() -> tuple[Any, ...]:
    return (torch.randint(32, (2, 8), generator=torch.Generator().manual_seed(1)),)
