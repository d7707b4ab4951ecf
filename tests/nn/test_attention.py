"""LazyMultiheadAttention's kdim / vdim read from the key and value when they differ from the
query's size: the layer is laid out with separate projections, as the eager class is."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module

Q, K, V = (5, 3, 8), (4, 3, 6), (4, 3, 7)


def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(torch.randn(s, generator=g) for s in (Q, K, V))


class Cross(nn.Module):
    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        self.attn = lazynn.LazyMultiheadAttention(2, **kwargs)  # type: ignore[arg-type]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attn(q, k, v)[0]


@pytest.mark.parametrize("declared", [{}, {"kdim": 6}, {"vdim": 7}])
def test_first_call_infers_kdim_and_vdim_as_the_eager_layer(declared: dict[str, int]) -> None:
    q, k, v = inputs()
    torch.manual_seed(0)
    model = Cross(**declared)
    early = list(model.parameters())
    if declared:  # one size unlike the query's declared: separate projections from the start
        assert early[2] is model.attn.v_proj_weight
        out = model(q, k, v)
    else:
        with pytest.warns(UserWarning, match=r"'attn'.*kdim=6, vdim=7.*optimizer.*Declare kdim="):
            out = model(q, k, v)
    torch.manual_seed(0)
    eager = nn.MultiheadAttention(8, 2, kdim=6, vdim=7)
    assert_same_module(model.attn, eager)
    assert torch.equal(out, eager(q, k, v)[0])
    # the in_proj_weight placeholder an early optimizer holds is now q_proj_weight
    assert early[0] is model.attn.q_proj_weight
    assert not any(lazynn.is_lazy(p) for p in model.parameters())
    assert model.attn.in_proj_weight is None
    assert not model.attn._qkv_same_embed_dim


def test_declared_or_matching_sizes_do_not_warn() -> None:
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazynn.LazyMultiheadAttention(2, kdim=6, vdim=7)(q, k, v)
        same_size = lazynn.LazyMultiheadAttention(2)
        same_size(q, q, q)
    assert same_size.in_proj_weight.shape == (24, 8)


def test_declared_sizes_equal_to_the_query_fuse_the_projection() -> None:
    q, _, _ = inputs()
    torch.manual_seed(0)
    layer = lazynn.LazyMultiheadAttention(2, kdim=8, vdim=8)  # the probe layout is separate
    early = list(layer.parameters())
    with pytest.warns(UserWarning, match=r"kdim=8, vdim=8 equal to embed_dim=8.*in_proj_weight"):
        out = layer(q, q, q)
    torch.manual_seed(0)
    eager = nn.MultiheadAttention(8, 2, kdim=8, vdim=8)
    assert_same_module(layer, eager)
    assert torch.equal(out[0], eager(q, q, q)[0])
    assert early[0] is layer.in_proj_weight


def test_build_and_meta_build_then_materialize_equal_eager() -> None:
    q, k, v = inputs()
    torch.manual_seed(0)
    eager = nn.MultiheadAttention(8, 2, kdim=6, vdim=7)
    for device in (None, "meta"):
        torch.manual_seed(0)
        with pytest.warns(UserWarning, match="kdim=6, vdim=7"):
            model = lazynn.build(Cross(), q, k, v, device=device)
        if device == "meta":
            assert model.attn.k_proj_weight.is_meta
            lazynn.materialize(model, "cpu")
        assert_same_module(model.attn, eager)


def test_summary_reports_the_separate_projections_and_changes_nothing() -> None:
    q, k, v = inputs()
    model = Cross()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rehearsal does not warn
        s = lazynn.summary(model, q, k, v)
    row = next(r for r in s.rows if r.path == "attn")
    assert row.parameters == (
        ("q_proj_weight", (8, 8)),
        ("k_proj_weight", (8, 6)),
        ("v_proj_weight", (8, 7)),
        ("in_proj_bias", (24,)),
    )
    assert lazynn.is_lazy(model.attn)
    assert next(iter(model.attn._parameters)) == "in_proj_weight"


def test_failed_first_call_puts_the_layout_back() -> None:
    q, k, _ = inputs()
    layer = lazynn.LazyMultiheadAttention(2)
    before = dict(layer._parameters)
    with pytest.raises(lazynn.InferenceError, match="LazyMultiheadAttention"):
        layer(q, k, torch.randn(5, 3, 7))  # value and key lengths differ
    assert layer._parameters == before
    assert lazynn.is_lazy(layer)
    with pytest.warns(UserWarning, match="vdim=7"):
        layer(*inputs())
    assert layer.vdim == 7


@pytest.mark.parametrize("declared", [{}, {"kdim": 6}])
def test_checkpoint_of_separate_projections_builds_an_unbuilt_layer(
    declared: dict[str, int],
) -> None:
    eager = nn.MultiheadAttention(8, 2, kdim=6, vdim=7)
    layer = lazynn.LazyMultiheadAttention(2, **declared)  # type: ignore[arg-type]
    if declared:
        layer.load_state_dict(eager.state_dict())
    else:
        with pytest.warns(UserWarning, match="kdim=6"):
            layer.load_state_dict(eager.state_dict())
    assert_same_module(layer, eager)


def test_fused_checkpoint_into_a_layer_declared_with_the_query_size() -> None:
    eager = nn.MultiheadAttention(8, 2)
    layer = lazynn.LazyMultiheadAttention(2, kdim=8)
    with pytest.warns(UserWarning, match="equal to embed_dim"):
        layer.load_state_dict(eager.state_dict())
    assert_same_module(layer, eager)


def test_checkpoint_the_arguments_cannot_take_is_refused_and_changes_nothing() -> None:
    eager = nn.MultiheadAttention(8, 2, kdim=6, vdim=7)
    model = nn.Sequential(lazynn.LazyMultiheadAttention(3))
    before = list(model[0]._parameters.items())
    with pytest.raises(lazynn.CheckpointError, match=r"'0'.*embed_dim=8.*divisible.*Fix:"):
        model.load_state_dict({"0." + k: v for k, v in eager.state_dict().items()})
    assert list(model[0]._parameters.items()) == before
    assert lazynn.is_lazy(model[0])
