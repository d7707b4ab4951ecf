"""Placeholders: what they refuse, what they are, and what they become.

Spec (items 1, 8 and 11 of the issue):

* before the build, a placeholder refuses every data or shape access (``.shape``,
  ``numel()``, ``size()``, ``ndim``, math, torch functions) with ``lazynn.UnbuiltError``
  naming the owning layer and parameter ("the 'weight' of LazyLinear") and how to build it;
  ``size()`` and ``ndim`` raise too, so nothing contradicts ``.shape``;
* ``torch.nn.parameter.is_lazy`` recognizes lazynn placeholders; ``lazynn.is_lazy`` works
  on tensors and on modules;
* standalone ``UninitializedParameter`` / ``UninitializedBuffer`` materialize in place into a
  ``Parameter`` / plain ``Tensor``; a ``UninitializedBuffer`` assigned as a module attribute
  registers a buffer, as torch's does;
* the first call fills the placeholders in place (same Python objects), and leaves a module
  that is exactly the eager class: no pre-hooks, no lazynn attributes;
* the repr of an unbuilt layer shows ``?`` where the inferred size goes, and equals the eager
  twin's repr after the build.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import nn

import lazynn
from compare import assert_same_module
from registry import (
    ROWS,
    TENSOR_ROWS,
    Row,
    assert_known_initial,
    build_pair,
    known_tensors,
    lazy_tensors,
)

# (id, operation on a placeholder) for every kind of access the spec names.
OPERATIONS: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("shape", lambda p: p.shape),
    ("ndim", lambda p: p.ndim),
    ("size()", lambda p: p.size()),
    ("size(0)", lambda p: p.size(0)),
    ("dim()", lambda p: p.dim()),
    ("numel()", lambda p: p.numel()),
    ("len", lambda p: len(p)),
    ("add", lambda p: p + 1),
    ("radd", lambda p: 1 + p),
    ("mul", lambda p: p * 2),
    ("neg", lambda p: -p),
    ("matmul", lambda p: torch.ones(2, 2) @ p),
    ("index", lambda p: p[0]),
    ("view", lambda p: p.view(-1)),
    ("item", lambda p: p.item()),
    ("tolist", lambda p: p.tolist()),
    ("clone", lambda p: p.clone()),
    ("eq", lambda p: p == 0),
    ("bool", lambda p: bool(p)),
    ("torch.sum", lambda p: torch.sum(p)),
    ("torch.numel", lambda p: torch.numel(p)),
    ("torch.cat", lambda p: torch.cat([p, p])),
    ("F.linear", lambda p: F.linear(torch.ones(2, 2), p)),
    # (initializers that fill by one rule whatever the shape wait for the build instead:
    # tests/module/test_kept_initializations.py; these need the shape first)
    ("nn.init.xavier_uniform_", lambda p: nn.init.xavier_uniform_(p)),
    ("nn.init.kaiming_normal_", lambda p: nn.init.kaiming_normal_(p)),
    ("nn.init.orthogonal_", lambda p: nn.init.orthogonal_(p)),
    ("copy_ into a real tensor", lambda p: torch.ones(2).copy_(p)),
]


def assert_build_advice(text: str) -> None:
    """The message ends with a fix that says how to build: lazynn.build, or a call on an input."""
    assert "Fix:" in text, text
    fix = text.split("Fix:", 1)[1]
    assert "lazynn.build(model, example)" in fix or re.search(r"\bcall\b.*\binput\b", fix), text


def all_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


#: the lazy layers whose ``num_batches_tracked`` is a real tensor before the build: its shape
#: depends on no input (torch's own lazy norms hold it so too)
KNOWN_COUNTER = (
    lazynn.LazyBatchNorm1d,
    lazynn.LazyBatchNorm2d,
    lazynn.LazyBatchNorm3d,
    lazynn.LazyInstanceNorm1d,
    lazynn.LazyInstanceNorm2d,
    lazynn.LazyInstanceNorm3d,
    lazynn.LazySyncBatchNorm,
    lazynn.BatchNorm,  # rank-agnostic: the same
    lazynn.InstanceNorm,
)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "op"), OPERATIONS, ids=[n for n, _ in OPERATIONS])
def test_placeholder_refuses_data_access(name: str, op: Callable[[torch.Tensor], Any]) -> None:
    layer = lazynn.LazyLinear(3)
    with pytest.raises(lazynn.UnbuiltError, match=r"the 'weight' of LazyLinear\b") as info:
        op(layer.weight)
    assert_build_advice(str(info.value))
    assert lazynn.is_lazy(layer.weight)  # the refused operation changed nothing


@pytest.mark.parametrize(
    ("op", "named"),
    [
        (lambda p: p.shape, "shape"),
        (lambda p: p.numel(), "numel"),
        (lambda p: p.size(), "size"),
        (lambda p: torch.sum(p), "sum"),
        (lambda p: F.linear(torch.ones(2, 2), p), "linear"),
        (lambda p: nn.init.xavier_normal_(p), "torch.nn.init"),
    ],
    ids=["shape", "numel", "size", "torch.sum", "F.linear", "nn.init.xavier_normal_"],
)
def test_refusal_names_the_operation(op: Callable[[torch.Tensor], Any], named: str) -> None:
    """The 'expected a built tensor for X' part names the operation that was refused."""
    with pytest.raises(lazynn.UnbuiltError) as info:
        op(lazynn.LazyLinear(3).weight)
    expected = str(info.value).split("received", 1)[0]
    assert re.search(rf"\b{re.escape(named)}\b", expected), str(info.value)


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_every_placeholder_of_every_layer_refuses_shape(row: Row) -> None:
    """Parameters and buffers (running statistics too) name their own layer and name."""
    layer = row.lazy(**row.simple)
    tensors = lazy_tensors(layer)
    assert tensors, "the simple options should give the layer parameters or buffers"
    owner = row.lazy.__name__
    for name, tensor in tensors.items():
        for op in (lambda t: t.shape, lambda t: t.size(), lambda t: t.ndim, lambda t: t.numel()):
            with pytest.raises(lazynn.UnbuiltError, match=rf"the '{name}' of {owner}\b") as info:
                op(tensor)
            assert_build_advice(str(info.value))
    for name, tensor in known_tensors(layer).items():  # a real tensor: it has a shape
        assert (tensor.shape, tensor.size(), tensor.ndim, tensor.numel()) == ((), (), 0, 1), name


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_only_shape_free_buffers_are_real_before_the_build(row: Row) -> None:
    """The lazy norms' ``num_batches_tracked`` is ``tensor(0)`` before the build, as in torch's
    lazy norms; every other parameter and buffer (running statistics too) is a placeholder."""
    layer = row.lazy(**row.simple)
    tensors = all_tensors(layer)
    known = {"num_batches_tracked"} if row.lazy in KNOWN_COUNTER else set()
    assert set(known_tensors(layer)) == known
    assert known <= set(tensors)
    assert_known_initial(layer)
    assert set(lazy_tensors(layer)) == set(tensors) - known
    for name, tensor in lazy_tensors(layer).items():
        assert isinstance(tensor, (lazynn.UninitializedParameter, lazynn.UninitializedBuffer))
        assert lazynn.is_lazy(tensor), name
    if known:  # none without running statistics; nested in a model, the same
        off = row.lazy(**{**row.simple, "track_running_stats": False})
        assert not known_tensors(off)
        assert not dict(off.named_buffers())
        model = nn.Sequential(nn.Identity(), nn.Sequential(row.lazy(**row.simple)))
        assert set(known_tensors(model)) == {"1.0.num_batches_tracked"}
        assert_known_initial(model)
        assert all(lazynn.is_lazy(t) for t in lazy_tensors(model).values())


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lazynn.LazyBatchNorm1d, nn.LazyBatchNorm1d),
        (lazynn.LazyBatchNorm2d, nn.LazyBatchNorm2d),
        (lazynn.LazyBatchNorm3d, nn.LazyBatchNorm3d),
        (lazynn.LazyInstanceNorm1d, nn.LazyInstanceNorm1d),
        (lazynn.LazyInstanceNorm2d, nn.LazyInstanceNorm2d),
        (lazynn.LazyInstanceNorm3d, nn.LazyInstanceNorm3d),
    ],
    ids=lambda c: c.__name__,
)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_known_buffers_are_torch_lazy_norms_real_tensors(
    ours: type[nn.Module], theirs: type[nn.Module], device: str
) -> None:
    """The same tensors are real before the build as in torch's lazy norms, alike."""
    options = {"affine": True, "track_running_stats": True, "device": device}
    layer, reference = ours(**options), theirs(**options)
    real = {n: t for n, t in all_tensors(reference).items() if not torch.nn.parameter.is_lazy(t)}
    assert set(known_tensors(layer)) == set(real) == {"num_batches_tracked"}
    for name, tensor in known_tensors(layer).items():
        expected = real[name]
        assert type(tensor) is type(expected), name
        assert (tensor.shape, tensor.dtype, tensor.device) == (
            expected.shape,
            expected.dtype,
            expected.device,
        ), name
        if device != "meta":
            assert torch.equal(tensor, expected), name


def test_unbuilt_error_is_also_a_torch_error_type() -> None:
    """torch raises RuntimeError or ValueError for its placeholders; code catching those works."""
    p = lazynn.LazyLinear(3).weight
    with pytest.raises(RuntimeError):
        p.numel()
    with pytest.raises(ValueError, match="LazyLinear"):
        p.numel()


def test_standalone_placeholder_refuses_without_owner() -> None:
    p = lazynn.UninitializedParameter()
    with pytest.raises(lazynn.UnbuiltError, match="UninitializedParameter") as info:
        p.shape  # noqa: B018
    assert_build_advice(str(info.value))
    with pytest.raises(lazynn.UnbuiltError, match="UninitializedBuffer"):
        lazynn.UninitializedBuffer().size()


# --- is_lazy ----------------------------------------------------------------------------------


def test_is_lazy_on_placeholders_and_modules(row: Row) -> None:
    lazy = row.lazy(**row.simple)
    tensors = lazy_tensors(lazy)
    assert all(torch.nn.parameter.is_lazy(t) for t in tensors.values())
    assert all(lazynn.is_lazy(t) for t in tensors.values())
    assert_known_initial(lazy)  # num_batches_tracked: real already, not lazy
    assert lazynn.is_lazy(lazy)
    model = nn.Sequential(nn.Identity(), nn.Sequential(lazy))
    assert lazynn.is_lazy(model)
    row.call(model[1][0], row.example())
    assert not lazynn.is_lazy(lazy)
    assert not lazynn.is_lazy(model)
    for t in (*tensors.values(), *all_tensors(lazy).values()):
        assert not torch.nn.parameter.is_lazy(t)
        assert not lazynn.is_lazy(t)


def test_is_lazy_on_plain_objects() -> None:
    assert not lazynn.is_lazy(torch.ones(2))
    assert not lazynn.is_lazy(nn.Parameter(torch.ones(2)))
    assert not lazynn.is_lazy(nn.Linear(2, 3))
    assert lazynn.is_lazy(nn.UninitializedParameter())  # torch's own placeholder, too
    assert lazynn.is_lazy(lazynn.UninitializedBuffer())


# --- standalone placeholders ------------------------------------------------------------------


def test_parameter_materializes_in_place() -> None:
    p = lazynn.UninitializedParameter()
    ident = id(p)
    p.materialize((2, 3))
    assert id(p) == ident
    assert type(p) is nn.Parameter
    assert p.shape == (2, 3)
    assert p.dtype == torch.get_default_dtype()
    assert p.device == torch.device("cpu")
    assert p.requires_grad
    assert not torch.nn.parameter.is_lazy(p)
    p.data.fill_(1.0)  # real storage
    assert p.sum().item() == 6.0


def test_parameter_materialize_keeps_or_overrides_dtype_and_grad() -> None:
    p = lazynn.UninitializedParameter(requires_grad=False, dtype=torch.float64)
    p.materialize((4,))
    assert (type(p), p.dtype, p.requires_grad, p.shape) == (
        nn.Parameter,
        torch.float64,
        False,
        (4,),
    )
    q = lazynn.UninitializedParameter()
    q.materialize((1, 2), device="cpu", dtype=torch.float16)
    assert (type(q), q.dtype, q.device, q.shape) == (
        nn.Parameter,
        torch.float16,
        torch.device("cpu"),
        (1, 2),
    )


def test_buffer_materializes_into_a_plain_tensor() -> None:
    b = lazynn.UninitializedBuffer(dtype=torch.int64)
    ident = id(b)
    b.materialize((5,))
    assert id(b) == ident
    assert type(b) is torch.Tensor
    assert (b.shape, b.dtype, b.requires_grad) == ((5,), torch.int64, False)
    assert not torch.nn.parameter.is_lazy(b)
    c = lazynn.UninitializedBuffer()
    c.materialize((2, 2), dtype=torch.float64)
    assert type(c) is torch.Tensor
    assert c.dtype == torch.float64


def test_assigned_placeholders_register_as_torch_does() -> None:
    ours, theirs = nn.Module(), nn.Module()
    for module, ns in ((ours, lazynn), (theirs, torch.nn)):
        module.buf = ns.UninitializedBuffer()
        module.hidden = ns.UninitializedBuffer(persistent=False)
        module.weight = ns.UninitializedParameter()
    assert set(ours._buffers) == set(theirs._buffers) == {"buf", "hidden"}
    assert ours._non_persistent_buffers_set == theirs._non_persistent_buffers_set == {"hidden"}
    assert set(ours._parameters) == set(theirs._parameters) == {"weight"}
    assert set(ours.state_dict()) == {"weight", "buf"}
    buf = ours.buf
    buf.materialize((3,))
    assert ours._buffers["buf"] is buf
    assert type(ours.buf) is torch.Tensor
    assert [n for n, _ in ours.named_buffers()] == ["buf", "hidden"]


# --- the build --------------------------------------------------------------------------------


def test_build_fills_placeholders_in_place_and_leaves_plain_torch(row: Row) -> None:
    lazy, eager, _ = build_pair(row, row.simple, row.simple_size)
    fresh = row.lazy(**row.simple)
    names = list(all_tensors(fresh))
    before = lazy_tensors(fresh)
    torch.manual_seed(0)
    row.call(fresh, row.input(row.simple, row.simple_size))
    after = all_tensors(fresh)
    assert list(after) == names
    for name, tensor in after.items():
        if name in before:  # a placeholder: filled in place
            assert tensor is before[name], name
        else:  # a known buffer (num_batches_tracked): the eager value, after the same call
            assert torch.equal(tensor, eager.get_buffer(name)), name
            assert tensor.dtype == eager.get_buffer(name).dtype, name
        expected = nn.Parameter if name in dict(fresh.named_parameters()) else torch.Tensor
        assert type(tensor) is expected, name
        assert not torch.nn.parameter.is_lazy(tensor), name
        assert not any(k.startswith("_lazynn") for k in vars(tensor)), name
    for module in (fresh, lazy):
        assert type(module) is row.eager
        assert not isinstance(module, torch.nn.modules.lazy.LazyModuleMixin)
        assert not module._forward_pre_hooks
        assert not module._forward_pre_hooks_with_kwargs
        assert "_initialize_hook" not in vars(module)
        assert not [k for k in vars(module) if k.startswith("_lazynn")]
        assert vars(module).keys() == vars(eager).keys()
        if row.sized:
            assert row.size(module) == row.simple_size
    for key, value in eager.state_dict().items():
        assert torch.equal(lazy.state_dict()[key], value), key


# --- repr -------------------------------------------------------------------------------------


def unbuilt_repr(row: Row, options: dict[str, Any]) -> str:
    """The eager repr with a sentinel size, every number the size decides shown as '?' (the
    sentinel, and what a layer computes from it: an adaptive softmax's tail sizes), and the
    lazy name. The numbers the size decides are those that differ with another sentinel."""
    sentinels = [977 * row.step(options), 1949 * row.step(options)]
    texts = [repr(row.new_eager(options, sentinel, device="meta")) for sentinel in sentinels]
    # once for a flat layer; a composite one (TransformerEncoderLayer) shows the size in
    # each child it reaches (in_features, LayerNorm's shape...): each of them is unknown
    count = texts[0].count(str(sentinels[0]))
    has_children = bool(row.new_eager(options, sentinels[0], device="meta")._modules)
    assert count == 1 or (count > 1 and has_children), texts[0]
    parts = [re.split(r"(\d+)", text) for text in texts]
    assert len(parts[0]) == len(parts[1]), texts
    text = "".join(a if a == b else "?" for a, b in zip(*parts, strict=True))
    assert text.startswith(row.eager.__name__ + "(")
    return row.lazy.__name__ + text[len(row.eager.__name__) :]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_repr_shows_unknown_sizes_honestly(row: Row, data: st.DataObject) -> None:
    options = data.draw(row.options, label="options")
    size = data.draw(row.sizes(options), label=row.inferred or "channels")
    lazy = row.lazy(**options)
    text = repr(lazy)
    assert "?" in text
    for name in row.inferred_args:
        assert f"{name}=0" not in text
        assert f"{name}=1" not in text
    if row.agnostic:
        # the class is unknown too: the arguments as given, and the rank as '?'
        assert re.fullmatch(rf"{row.lazy.__name__}\((.+, )?rank=\?\)", text), text
    elif re.search(r"\(\d+-\d+\): \d+ x ", text):
        # torch's ModuleList repr folds identical children ("(0-1): 2 x Sequential"): the
        # adaptive softmax's tails, whose sizes differ once known, look alike while '?'
        assert not re.search(r"_features=0\b", text), text
    else:
        assert text == unbuilt_repr(row, options)
    # as an argument: first ('(?'), named ('=?') or positional after another (GroupNorm's
    # '(2, ?')
    assert re.search(r"\(\?|=\?|, \?", repr(nn.Sequential(lazy)))
    x = row.input(options, size)
    with warnings.catch_warnings():
        # padding="same" with an even kernel makes torch warn (once per process); pytest turns
        # warnings into errors, which is not what this test is about.
        warnings.simplefilter("ignore", UserWarning)
        row.call(lazy, x)
    eager = row.new_eager(options, size)
    assert repr(lazy) == repr(eager)
    assert "?" not in repr(lazy)


@pytest.mark.parametrize("lazy", KNOWN_COUNTER[:3], ids=lambda c: c.__name__)
def test_build_resets_the_counter_in_place_and_a_rollback_restores_its_value(
    lazy: type[nn.Module],
) -> None:
    """num_batches_tracked keeps its identity through a build (torch's lazy norms reset it in
    place); a first call that fails after the norm counted puts the count back."""
    rank = {"LazyBatchNorm1d": 2, "LazyBatchNorm2d": 4, "LazyBatchNorm3d": 5}[lazy.__name__]
    norm = lazy()
    counter = norm.num_batches_tracked
    counter.fill_(7)  # whatever it held (to_empty leaves garbage): the build resets it

    x = torch.randn(4, 3, *(2,) * (rank - 2))

    def fails(module: nn.Module, args: Any, output: Any) -> None:
        assert module.num_batches_tracked.item() == 1  # built, reset, counted: then it fails
        raise RuntimeError("after the forward")

    handle = norm.register_forward_hook(fails)
    with pytest.raises(RuntimeError, match="after the forward"):
        norm(x)
    handle.remove()
    assert lazynn.is_lazy(norm)
    assert norm.num_batches_tracked is counter
    assert counter.item() == 7
    norm(x)
    assert norm.num_batches_tracked is counter
    assert counter.item() == 1  # reset to eager's 0 by the build, then counted once


def test_placeholder_storage_is_empty_as_a_meta_tensors() -> None:
    """untyped_storage() answers, as for a meta tensor (safetensors asks each tensor of a
    model for its storage to find shared ones); nothing can be read or written through it."""
    weight = lazynn.LazyLinear(3).weight
    storage = weight.untyped_storage()
    meta = torch.empty(0, device="meta").untyped_storage()
    assert (storage.data_ptr(), storage.nbytes()) == (meta.data_ptr(), meta.nbytes()) == (0, 0)
    with pytest.raises(lazynn.UnbuiltError, match="Attempted to use an uninitialized parameter"):
        weight.contiguous()


def test_parameter_constructor_takes_torchs_arguments_and_the_rebuild_form() -> None:
    """``UninitializedParameter(requires_grad, device, dtype)`` as torch's; ``cls(data,
    **param.__dict__)`` (how accelerate rebuilds a parameter) gives a placeholder like data."""
    p = lazynn.UninitializedParameter(False, "cpu", torch.float64)
    assert (p.requires_grad, p.dtype) == (False, torch.float64)
    again = type(p)(p.to("meta"), **{**p.__dict__, "requires_grad": True, "tag": 1})
    assert isinstance(again, lazynn.UninitializedParameter)
    assert (again.device.type, again.dtype, again.requires_grad, again.tag) == (
        "meta",
        torch.float64,
        True,
        1,
    )
    with pytest.raises(TypeError, match=r"^UninitializedParameter\(\) got an unexpected"):
        lazynn.UninitializedParameter(shape=3)


# --- .data and clones, as torch's; a materialize() of the placeholder's own ---------------


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_data_of_an_unbuilt_placeholder_is_no_parameter_and_its_clone_is_torchs(row: Row) -> None:
    """``p.data`` is a plain tensor in torch: assigned to a module it registers nothing (so
    torchrl's multi-agent models keep torch's parameters and state_dict keys), and its
    ``clone()`` (torchrl's target networks) is torch's empty tensor, not a refusal. Writes on
    it are still kept for the build (``m.bias.data.fill_``)."""
    layer = row.lazy(**row.simple)
    torch_layer_data = nn.UninitializedParameter().data
    for name, p in lazy_tensors(layer).items():
        data = p.data
        assert not isinstance(data, nn.Parameter), name
        holder = nn.Module()
        holder.alias = data
        assert list(holder.state_dict()) == [], name
        assert list(holder.parameters()) == [], name
        for copy in (p.data.clone(), p.detach().clone(), torch.clone(p.data)):
            assert type(copy) is type(torch_layer_data), name
            assert copy.shape == (0,), name
            assert (copy.dtype, copy.device, copy.requires_grad) == (p.dtype, p.device, False)
        with pytest.raises(lazynn.UnbuiltError, match=r"Tensor\.clone"):
            p.clone()  # (the placeholder itself: refused, as torch's)


def test_writes_through_data_are_kept_and_detach_keeps_the_class() -> None:
    torch.manual_seed(0)
    layer = lazynn.LazyLinear(3)
    layer.weight.data.fill_(2.0)
    layer.bias.detach().zero_()
    assert type(layer.weight.detach()) is lazynn.UninitializedParameter  # nn.Parameter(p) needs it
    layer(torch.randn(2, 4))
    assert torch.equal(layer.weight, torch.full((3, 4), 2.0))
    assert torch.equal(layer.bias, torch.zeros(3))


def _batched(base: type) -> type:
    """A placeholder class whose materialize() adds a leading dimension of 3, as tensordict's
    batched placeholders add the agent dimension."""

    class Batched(base):  # type: ignore[misc, valid-type]
        def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
            base.materialize(self, (3, *shape), device=device, dtype=dtype)

    return Batched


@pytest.mark.parametrize("library", [nn, lazynn], ids=["torch", "lazynn"])
def test_a_placeholder_with_its_own_materialize_is_built_through_it(library: Any) -> None:
    """Building goes through the placeholder's own materialize(), then reset_parameters(), as
    torch's lazy modules build: the same shapes, numbers and generator state as torch's."""
    results = {}
    for lib in (nn, lazynn):
        torch.manual_seed(0)
        layer = lib.LazyLinear(5)
        kind = _batched(library.UninitializedParameter)
        layer.weight, layer.bias = kind(), kind()
        weight = layer.weight
        layer.initialize_parameters(torch.ones(2, 4))
        assert layer.weight is weight
        results[lib] = (layer.weight.detach().clone(), layer.bias.detach().clone())
        results[lib] += (torch.get_rng_state(),)
    assert results[lazynn][0].shape == (3, 5, 4)
    assert results[lazynn][1].shape == (3, 5)
    assert all(torch.equal(a, b) for a, b in zip(results[nn], results[lazynn], strict=True))


def test_a_materialize_that_keeps_the_shape_keeps_the_eager_values() -> None:
    """A materialize() hook that shapes as asked (one that logs, say): built through it, the
    layer is the eager layer, as with torch's lazy modules."""
    seen = []

    class Logged(lazynn.UninitializedParameter):
        def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
            seen.append(tuple(shape))
            super().materialize(shape, device=device, dtype=dtype)

    torch.manual_seed(0)
    layer = lazynn.LazyLinear(5)
    layer.weight = Logged()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    torch.manual_seed(0)
    eager = nn.Linear(4, 5)
    assert seen == [(5, 4)]
    assert type(layer) is nn.Linear
    assert torch.equal(layer.weight, eager.weight)
    assert torch.equal(layer.bias, eager.bias)
    assert torch.equal(y, eager(x))


class _Scaled(nn.Module):
    """Its reset_parameters() covers ``weight`` only; ``scale`` is set in ``__init__``; and a
    class without reset_parameters (``_Affine``)."""

    def __init__(self, n: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, device=device, dtype=dtype))
        self.scale = nn.Parameter(torch.full((n,), 3.0, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.scale


class _Affine(nn.Module):
    def __init__(self, n: int, out: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, n, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class _Kept(lazynn.UninitializedParameter):
    """A materialize() hook that keeps the shape it is given (one that logs, say)."""

    def materialize(self, shape: Any, device: Any = None, dtype: Any = None) -> None:
        super().materialize(shape, device=device, dtype=dtype)


@pytest.mark.parametrize("door", ["first call", "build", "meta"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: (lazynn.lazy(_Scaled, n=lazynn.Infer(dim=-1))(), lambda: _Scaled(4)),
        lambda: (lazynn.lazy(_Affine, n=lazynn.Infer(dim=-1))(out=3), lambda: _Affine(4, 3)),
        lambda: (lazynn.LazyMultiheadAttention(2), lambda: nn.MultiheadAttention(4, 2)),
    ],
    ids=["reset-covers-part", "no-reset", "multihead-attention"],
)
def test_a_materialize_hook_that_keeps_the_shape_builds_the_eager_layer_through_every_door(
    make: Any, door: str
) -> None:
    """Every tensor gets the eager value (those reset_parameters() does not cover too; a
    class with none builds), through a first call, build and build on meta + materialize."""
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    layer, eager_of = make()
    name = next(iter(dict(layer.named_parameters())))
    path, _, leaf = name.rpartition(".")
    setattr(layer.get_submodule(path), leaf, _Kept())
    args = (x, x, x) if isinstance(layer, lazynn.LazyMultiheadAttention) else (x,)
    if door == "first call":
        layer(*args)
    elif door == "build":
        layer = lazynn.build(layer, *args)
    else:
        layer = lazynn.materialize(lazynn.build(layer, *args, device="meta"))
    after = torch.get_rng_state()
    torch.manual_seed(0)
    eager = eager_of()
    assert torch.equal(after, torch.get_rng_state())
    assert_same_module(layer, eager)


def test_a_parameter_made_of_an_unbuilt_data_is_a_parameter_once_built() -> None:
    """``nn.Parameter(p.data)`` on an unbuilt p: a placeholder flagged as a parameter, which
    its build makes an ``nn.Parameter`` (not a plain tensor)."""
    encoder, decoder = lazynn.LazyLinear(3), lazynn.LazyLinear(3)
    decoder.weight = nn.Parameter(encoder.weight.data)
    decoder(torch.randn(2, 3))
    assert type(decoder.weight) is nn.Parameter
    assert [n for n, _ in decoder.named_parameters()] == ["weight", "bias"]


# --- the methods torch's placeholders allow, one by one (issue 36) ---------------------------

#: Each method torch's ``UninitializedTensorMixin._allowed_methods`` lists (read from torch's
#: source at run time), called on an unbuilt weight: lazynn answers as torch ("same"), keeps
#: a placeholder of the new dtype where torch returns a plain empty tensor ("placeholder"), or
#: refuses a read of a size torch answers with the empty tensor's ("refused"): the README's
#: table of differences has both rows.
SWEEP: dict[str, tuple[Callable[[torch.Tensor], Any], str]] = {
    "__hash__": (lambda t: isinstance(hash(t), int), "same"),
    "size": (lambda t: tuple(t.size()), "refused"),
    "copy_": (lambda t: t.copy_(torch.ones(3)), "same"),
    "is_complex": (lambda t: t.is_complex(), "same"),
    "is_floating_point": (lambda t: t.is_floating_point(), "same"),
    "half": (lambda t: t.half(), "placeholder"),
    "float": (lambda t: t.float(), "same"),
    "double": (lambda t: t.double(), "placeholder"),
    "char": (lambda t: t.char(), "refused"),
    "short": (lambda t: t.short(), "refused"),
    "int": (lambda t: t.int(), "refused"),
    "long": (lambda t: t.long(), "refused"),
    "cuda": (lambda t: t.cuda(), "same"),
    "cpu": (lambda t: t.cpu(), "same"),
    "to": (lambda t: t.to(torch.float64), "placeholder"),
    "get_device": (lambda t: t.get_device(), "same"),
    "_has_compatible_shallow_copy_type": (
        lambda t: torch._has_compatible_shallow_copy_type(t, torch.empty(0)),
        "same",
    ),
}


def _outcome(call: Callable[[torch.Tensor], Any], tensor: torch.Tensor) -> Any:
    """What ``call(tensor)`` gives, comparably: a tensor's class name and dtype, a value, or
    the torch error type it raised (lazynn's errors are both of torch's)."""
    try:
        out = call(tensor)
    except (RuntimeError, ValueError, AssertionError) as error:
        return ("raised", "ValueError" if isinstance(error, ValueError) else type(error).__name__)
    if isinstance(out, torch.Tensor):
        return (type(out).__name__, out.dtype)
    return out


def test_the_sweep_lists_every_method_torchs_placeholders_allow() -> None:
    allowed = nn.parameter.UninitializedTensorMixin._allowed_methods
    assert {f.__name__ for f in allowed} == set(SWEEP)


@pytest.mark.parametrize("name", list(SWEEP))
def test_each_method_torchs_placeholders_allow(name: str) -> None:
    call, expected = SWEEP[name]
    theirs = _outcome(call, nn.LazyLinear(3).weight)
    ours = _outcome(call, lazynn.LazyLinear(3).weight)
    if expected == "same":
        assert ours == theirs
    elif expected == "placeholder":
        assert theirs[0] == "Tensor"  # (torch's: a plain empty tensor, no longer lazy)
        assert ours == ("UninitializedParameter", theirs[1])
    else:
        assert ours == ("raised", "ValueError")  # (UnbuiltError, naming the layer)
        assert theirs[0] != "raised"


def test_storage_identity_is_answered_as_torchs_data_answers() -> None:
    """``is_set_to`` reads no value (torchrl's target updaters ask it of ``p.data``), and a
    copy of an unbuilt tensor into an empty one copies nothing, as torch's placeholder's
    ``.data``, an empty tensor, copies nothing."""
    for library in (nn, lazynn):
        layer = library.LazyLinear(3)
        weight, bias = layer.weight.data, layer.bias.data
        assert not torch.empty(0).is_set_to(weight)
        assert weight.is_set_to(layer.weight.data)
        assert not weight.is_set_to(bias)
        target = torch.empty(0)
        assert target.copy_(weight) is target
    with pytest.raises(lazynn.UnbuiltError, match=r"Tensor\.copy_"):
        torch.empty(2, 3).copy_(lazynn.LazyLinear(3).weight.data)  # (values it would need)
