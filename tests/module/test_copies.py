"""Copies of lazy layers: ``copy.deepcopy``, ``copy.copy`` and pickle.

A copy of an unbuilt layer keeps dtype, device and ``requires_grad`` and builds on its own:
building it leaves the original unbuilt, and the original then builds with another size;
neither shares a tensor with the other. A copy of a built layer behaves as the same copy of
its eager twin.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
import torch
from torch import nn

import lazynn
from registry import TENSOR_ROWS, Row, assert_known_initial, build_pair, lazy_tensors

Copier = Callable[[nn.Module], nn.Module]


def _pickled(module: nn.Module) -> nn.Module:
    return pickle.loads(pickle.dumps(module))  # type: ignore[no-any-return]


COPIERS: dict[str, Copier] = {
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,
    "pickle": _pickled,
}
#: copies that, for torch, share no tensor with the original
DEEP = ["deepcopy", "pickle"]


def tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict(keep_vars=True))


def eager_state(row: Row, size: int, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return row.new_eager(row.simple, size).state_dict()


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize("copier", list(COPIERS))
@pytest.mark.parametrize(
    ("dtype", "device", "grad"),
    [(torch.float64, "cpu", False), (torch.float16, "meta", True), (torch.float32, "cpu", True)],
    ids=["float64-cpu-nograd", "float16-meta", "float32-cpu"],
)
def test_copy_of_unbuilt_keeps_dtype_device_grad(
    row: Row, copier: str, dtype: torch.dtype, device: str, grad: bool
) -> None:
    original = row.lazy(**row.simple, dtype=dtype, device=device).requires_grad_(grad)
    clone = COPIERS[copier](original)
    assert clone is not original
    assert type(clone) is row.lazy
    assert lazynn.is_lazy(clone)
    ours, theirs = tensors(clone), tensors(original)
    assert list(ours) == list(theirs)
    placeholders = lazy_tensors(original)
    assert set(lazy_tensors(clone)) == set(placeholders)
    for key, tensor in ours.items():
        source = theirs[key]
        assert type(tensor) is type(source), key
        # even copy.copy: each copy of an unbuilt layer owns its tensors (it builds alone)
        assert tensor is not source, key
        if key in placeholders:
            assert lazynn.is_lazy(tensor), key
        else:  # a real buffer (num_batches_tracked), which the build resets in place
            assert not lazynn.is_lazy(tensor), key
            assert device == "meta" or torch.equal(tensor, source), key
        assert tensor.dtype == source.dtype, key
        assert tensor.device == source.device, key
        assert tensor.device.type == device, key
        assert tensor.requires_grad == source.requires_grad, key
    for name, p in clone.named_parameters():
        assert p.dtype == dtype, name
        assert p.requires_grad is grad, name
    if "num_batches_tracked" in ours:  # norm buffers: the integer one stays integer
        assert ours["num_batches_tracked"].dtype == torch.int64
        assert isinstance(ours["running_mean"], lazynn.UninitializedBuffer)
    assert_known_initial(clone)
    if row.sized:
        assert row.size(clone) is lazynn.UNKNOWN


@pytest.mark.parametrize("copier", list(COPIERS))
@pytest.mark.parametrize("copy_first", [True, False], ids=["copy-first", "original-first"])
def test_copy_builds_independently(row: Row, copier: str, copy_first: bool) -> None:
    """Build one with size 2, the other stays unbuilt; then the other with size 5 (times the
    step the sizes must be multiples of)."""
    small, large = 2 * row.step(row.simple), 5 * row.step(row.simple)
    original = row.lazy(**row.simple)
    clone = COPIERS[copier](original)
    first, second = (clone, original) if copy_first else (original, clone)
    x_first, x_second = row.input(row.simple, small), row.input(row.simple, large)

    torch.manual_seed(1)
    row.call(first, x_first)
    assert type(first) is row.eager
    if row.sized:
        assert row.size(first) == small
    assert not first._forward_pre_hooks
    assert type(second) is row.lazy
    assert lazynn.is_lazy(second)
    assert set(lazy_tensors(second)) == set(lazy_tensors(row.lazy(**row.simple)))
    assert all(lazynn.is_lazy(t) for t in lazy_tensors(second).values())
    assert_known_initial(second)  # the first one's build left its counter at 0
    if row.sized:
        assert row.size(second) is lazynn.UNKNOWN

    torch.manual_seed(2)
    row.call(second, x_second)
    assert type(second) is row.eager
    if row.sized:
        assert row.size(second) == large
    assert not second._forward_pre_hooks
    for module, size, seed, x in ((first, small, 1, x_first), (second, large, 2, x_second)):
        expected = eager_state(row, size, seed)
        # the first call ran in train mode: compare the parameters, and the buffers' shapes
        state = module.state_dict()
        assert list(state) == list(expected)
        for key, value in expected.items():
            assert state[key].shape == value.shape, key
            assert state[key].dtype == value.dtype, key
        for name, p in module.named_parameters():
            assert torch.equal(p, expected[name]), name
        assert row.call(module, x).shape == _eager_output_shape(row, size, x)
    ids_first = {id(t) for t in tensors(first).values()}
    ids_second = {id(t) for t in tensors(second).values()}
    assert not ids_first & ids_second


def _eager_output_shape(row: Row, size: int, x: torch.Tensor) -> torch.Size:
    eager = row.new_eager(row.simple, size)
    return row.call(eager, x).shape


@pytest.mark.parametrize("copier", DEEP)
def test_deepcopy_of_unbuilt_norm_buffers_are_independent(copier: str) -> None:
    norm = lazynn.LazyBatchNorm2d()
    clone = COPIERS[copier](norm)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert getattr(clone, name) is not getattr(norm, name)
    for name in ("running_mean", "running_var"):
        assert isinstance(getattr(clone, name), lazynn.UninitializedBuffer)
    assert type(clone.num_batches_tracked) is torch.Tensor  # real before the build: tensor(0)
    assert torch.equal(clone.num_batches_tracked, torch.tensor(0))
    clone(torch.randn(4, 3, 2, 2))
    assert clone.running_mean.shape == (3,)
    assert clone.num_batches_tracked.item() == 1
    assert lazynn.is_lazy(norm.running_mean)
    assert norm.num_batches_tracked.item() == 0  # the original's counter is its own
    norm(torch.randn(4, 6, 2, 2))
    assert norm.running_var.shape == (6,)
    assert clone.running_var.shape == (3,)


@pytest.mark.parametrize("copier", list(COPIERS))
def test_copy_of_built_layer_behaves_as_eager(row: Row, copier: str) -> None:
    lazy, eager, x = build_pair(row, row.simple, row.simple_size)
    lazy_copy, eager_copy = COPIERS[copier](lazy), COPIERS[copier](eager)
    assert type(lazy_copy) is type(eager_copy) is row.eager
    assert repr(lazy_copy) == repr(eager_copy)
    assert vars(lazy_copy).keys() == vars(eager_copy).keys()
    assert not lazy_copy._forward_pre_hooks
    ours, theirs = tensors(lazy_copy), tensors(eager_copy)
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), key
        assert ours[key].dtype == value.dtype, key
        assert ours[key].requires_grad == value.requires_grad, key
        assert torch.equal(ours[key], value), key
    # sharing with the original: exactly as torch does for the eager twin
    shared_lazy = [a is b for a, b in zip(ours.values(), tensors(lazy).values(), strict=True)]
    shared_eager = [a is b for a, b in zip(theirs.values(), tensors(eager).values(), strict=True)]
    assert shared_lazy == shared_eager
    if copier in DEEP:
        assert not any(shared_lazy)
    assert torch.equal(row.call(lazy_copy, x), row.call(eager_copy, x))


@pytest.mark.parametrize("copier", DEEP)
def test_copy_of_unbuilt_model(copier: str) -> None:
    """A deep copy of a whole unbuilt model builds on its own, with other sizes."""
    model = nn.Sequential(
        lazynn.LazyConv2d(4, 3), lazynn.LazyBatchNorm2d(), nn.Flatten(), lazynn.LazyLinear(2)
    )
    clone = COPIERS[copier](model)
    assert clone(torch.randn(2, 3, 5, 5)).shape == (2, 2)
    assert lazynn.is_lazy(model)
    assert [type(m) for m in model] == [
        lazynn.LazyConv2d,
        lazynn.LazyBatchNorm2d,
        nn.Flatten,
        lazynn.LazyLinear,
    ]
    assert [type(m) for m in clone] == [nn.Conv2d, nn.BatchNorm2d, nn.Flatten, nn.Linear]
    assert model(torch.randn(2, 1, 6, 6)).shape == (2, 2)
    assert (clone[0].in_channels, clone[3].in_features) == (3, 36)
    assert (model[0].in_channels, model[3].in_features) == (1, 64)
    assert not {id(p) for p in model.parameters()} & {id(p) for p in clone.parameters()}
