"""A first call either builds the whole layer or leaves it exactly as it was.

Covers the review fixes around the first call:

* a real forward that fails *after* the build (what the meta check cannot see: a batch of
  one for BatchNorm in training, a transposed convolution's output size or output padding,
  a custom torch-style layer's own forward) is rolled back, CPU RNG included
  (``LazyModuleMixin.__call__``);
* an input on another device, a ``torch.func`` transform as the first call and an inferred
  size of 0 are refused before anything is built (``_lazynn_check_dtype``,
  ``_refuse_under_functorch``, ``_lazynn_read_sizes``);
* ``initialize_parameters(x)`` called directly builds completely (``_infer_parameters``);
* a layer declared on meta and moved with ``to_empty`` builds where it now is
  (``_lazynn_build``);
* placeholders answer ``.type()``, ``state_dict(keep_vars=True)`` does not mark live
  placeholders, and an unbuilt checkpoint loaded into a built layer names its entry
  (``_module/placeholder.py``, ``_save_to_state_dict``);
* ``torch.compile(dynamic=True)`` builds a nested model, and errors raised under
  ``torch.compile`` name the user's path, not ``_orig_mod`` (``module_path``).
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy
import pytest
import torch
from torch import nn

import lazynn
from compare import assert_same_module
from lazynn._module.lifecycle import is_unbuilt
from paths import TESTS
from registry import (
    PARAMETER_ROWS,
    ROWS,
    TENSOR_ROWS,
    Row,
    assert_known_initial,
    known_tensors,
    lazy_tensors,
    same_value,
)

# --- helpers ----------------------------------------------------------------------------------


def tensors_of(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


class Before:
    """What a rolled-back first call must leave as it was: class, attributes, placeholders."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.cls = type(module)
        self.keys = set(vars(module))
        self.tensors = tensors_of(module)
        self.lazy = set(lazy_tensors(module))
        #: the real buffers (num_batches_tracked), by value
        self.known = {name: t.clone() for name, t in known_tensors(module).items()}
        self.hooks = list(module._forward_pre_hooks)
        self.rng = torch.get_rng_state()

    def assert_unbuilt_again(self, rng: bool = True) -> None:
        module = self.module
        assert type(module) is self.cls
        assert lazynn.is_lazy(module)
        assert is_unbuilt(module)  # the build hook is attached again
        assert set(vars(module)) == self.keys
        assert list(module._forward_pre_hooks) == self.hooks
        after = tensors_of(module)
        assert [n for n, _ in after] == [n for n, _ in self.tensors]
        assert set(lazy_tensors(module)) == self.lazy
        for (name, t), (_, original) in zip(after, self.tensors, strict=True):
            assert t is original, name  # the same Python objects...
            if name in self.lazy:
                assert lazynn.is_lazy(t), name  # ...still placeholders
            else:  # ...or real buffers (num_batches_tracked) with the same value
                assert not lazynn.is_lazy(t), name
                assert same_value(t, self.known[name]), name
        if rng:
            assert torch.equal(torch.get_rng_state(), self.rng)


def eager_twin(row: Row, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return row.new_eager(row.simple, row.simple_size)


# --- 1. a forward that fails after the build is rolled back -----------------------------------


class Scale(nn.Module):
    """y = x * weight (random init); refuses a batch of one in its own forward."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features
        self.weight = nn.Parameter(torch.empty(num_features))
        nn.init.normal_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 2:
            raise ValueError(f"Scale needs a batch of at least 2, received {x.shape[0]}")
        return x * self.weight


class LazyScale(lazynn.LazyModuleMixin, Scale):
    """Torch-style lazy layer (docs/custom-layers.md): its initialize_parameters succeeds
    for a batch of one (and draws random numbers), then Scale.forward fails."""

    cls_to_become = Scale

    def __init__(self) -> None:
        super().__init__(0)
        self.num_features = lazynn.UNKNOWN  # type: ignore[assignment]
        self.weight = lazynn.UninitializedParameter()

    def initialize_parameters(self, x: torch.Tensor) -> None:  # type: ignore[override]
        self.num_features = x.shape[-1]
        with torch.no_grad():
            self.weight.materialize((self.num_features,))
            nn.init.normal_(self.weight)


@dataclass(frozen=True)
class Failing:
    """A first call the meta check lets through, whose real forward fails after the build."""

    id: str
    make: Callable[[], nn.Module]
    bad: tuple[int, ...]
    error: type[Exception]
    match: str
    #: a good input and the eager twin for it; None when no input suits the layer
    good: tuple[int, ...] | None
    eager: Callable[[], nn.Module] | None


FAILING = [
    Failing(
        "batchnorm-batch-of-one",
        lambda: lazynn.LazyBatchNorm1d(momentum=None),
        (1, 4),
        ValueError,
        "more than 1 value per channel",
        (3, 4),
        lambda: nn.BatchNorm1d(4, momentum=None),
    ),
    Failing(
        "conv-transpose-output-too-small",
        lambda: lazynn.LazyConvTranspose3d(1, 2, dilation=2, padding=2),
        (1, 2, 3, 4),
        RuntimeError,
        "too small",
        (2, 1, 4, 4, 4),
        lambda: nn.ConvTranspose3d(1, 1, 2, dilation=2, padding=2),
    ),
    # output_padding=1 needs stride or dilation > 1: no input suits this layer (eager
    # nn.ConvTranspose2d(4, 3, 3, output_padding=1) constructs too, and fails in forward).
    Failing(
        "conv-transpose-output-padding",
        lambda: lazynn.LazyConvTranspose2d(3, 3, output_padding=1),
        (1, 4, 5, 5),
        RuntimeError,
        "output padding must be smaller",
        None,
        None,
    ),
    Failing(
        "custom-torch-style-layer",
        LazyScale,
        (1, 5),
        ValueError,
        "at least 2",
        (3, 5),
        lambda: Scale(5),
    ),
]


@pytest.mark.parametrize("case", FAILING, ids=lambda c: c.id)
def test_forward_failing_after_build_is_rolled_back(case: Failing) -> None:
    layer = case.make().train()
    bad = torch.randn(case.bad)
    torch.manual_seed(0)
    before = Before(layer)
    with pytest.raises(case.error, match=case.match):
        layer(bad)
    before.assert_unbuilt_again()  # RNG included: the build's draws are undone

    if case.good is None:
        # A retry fails the same way and is rolled back again.
        with pytest.raises(case.error, match=case.match):
            layer(bad)
        before.assert_unbuilt_again()
        return
    # Retry without re-seeding: the RNG is where the seed left it, so the layer gets the
    # numbers the eager twin gets under that seed.
    x = torch.randn(case.good, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    assert case.eager is not None
    torch.manual_seed(0)
    eager = case.eager().train()
    assert torch.equal(y, eager(x))
    assert_same_module(layer, eager)


def test_forward_failure_rolls_back_the_rng_draws_of_the_build() -> None:
    """The check above is not vacuous: this layer's build does draw random numbers."""
    torch.manual_seed(0)
    layer = lazynn.LazyConvTranspose3d(1, 2, dilation=2, padding=2)
    before = torch.get_rng_state()
    layer(torch.randn(2, 1, 4, 4, 4, generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(torch.get_rng_state(), before)


class _Drawing(nn.Module):
    """A layer whose forward draws from Python's and numpy's generators (a LayerDrop coin,
    an augmentation), then fails."""

    def __init__(self, features: int, device: object = None, dtype: object = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        random.random()
        numpy.random.rand()
        raise RuntimeError("a later step fails")


_LazyDrawing = lazynn.lazy(_Drawing, features=lazynn.Infer(dim=-1))


@pytest.mark.parametrize("door", ["first call", "build"])
def test_a_failure_puts_back_pythons_and_numpys_generators(door: str) -> None:
    """Every random generator as it was (torch's was already): the retry draws what the
    first attempt would have."""
    model = _LazyDrawing()
    python, numpy_state = random.getstate(), numpy.random.get_state()[1].copy()
    run: Callable[[torch.Tensor], object] = (
        model if door == "first call" else lambda x: lazynn.build(model, x)
    )
    with pytest.raises(RuntimeError, match="a later step fails"):
        run(torch.ones(2, 5))
    assert lazynn.is_lazy(model)
    assert random.getstate() == python
    assert numpy.array_equal(numpy.random.get_state()[1], numpy_state)


def test_a_hook_that_draws_on_a_torch_layer_is_put_back_too() -> None:
    """A torch.nn layer's own forward draws from neither; a hook the user put on it (or a
    global one) may, and the first call's rollback then puts them back."""

    def coin(module: nn.Module, args: tuple[object, ...], out: torch.Tensor) -> None:
        random.random()
        numpy.random.rand()
        raise RuntimeError("a hook fails")

    layer = lazynn.LazyLinear(3)
    layer.register_forward_hook(coin)
    python, numpy_state = random.getstate(), numpy.random.get_state()[1].copy()
    with pytest.raises(RuntimeError, match="a hook fails"):
        layer(torch.ones(2, 5))
    assert random.getstate() == python
    assert numpy.array_equal(numpy.random.get_state()[1], numpy_state)
    plain = lazynn.LazyLinear(3)
    handle = nn.modules.module.register_module_forward_hook(coin)
    try:
        with pytest.raises(RuntimeError, match="a hook fails"):
            plain(torch.ones(2, 5))
    finally:
        handle.remove()
    assert random.getstate() == python
    assert numpy.array_equal(numpy.random.get_state()[1], numpy_state)


# --- 2. the same failure inside a nested model ------------------------------------------------


def test_nested_model_forward_failure() -> None:
    one = torch.randn(1, 5)
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyBatchNorm1d(momentum=None))
    norm_before = Before(model[1])
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(one)
    # The layer whose forward failed is rolled back: class, attributes, placeholders. Its
    # RNG check is skipped: the call's RNG is put back to where it was when the norm was
    # called (after the Linear's draws), not to where it was before model(x).
    norm_before.assert_unbuilt_again(rng=False)
    # The LazyLinear before it built and ran fine. Rollback is per lazy layer, and an
    # nn.Sequential is no lazy layer, so today it stays built (an nn.Linear, in_features=5),
    # with its random draws consumed. Whatever the design, it must be coherent: either
    # fully built or fully unbuilt, never half.
    first = model[0]
    if lazynn.is_lazy(first):
        assert type(first) is lazynn.LazyLinear
        assert is_unbuilt(first)
        assert all(lazynn.is_lazy(t) for t in lazy_tensors(first).values())
        assert_known_initial(first)
    else:
        assert type(first) is nn.Linear
        assert first.in_features == 5
        assert not first._forward_pre_hooks
    # Either way, a retry without re-seeding builds the model its eager twin is under the
    # seed set before the failed call: today the Linear's weights came from that seed; a
    # design that rolled the Linear back would have to put the RNG back with it, as the
    # rollback of a single layer does.
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    y = model(x)
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4, momentum=None))
    assert torch.equal(y, eager(x))
    for lazy_layer, eager_layer in zip(model, eager, strict=True):
        assert_same_module(lazy_layer, eager_layer)


# --- 3. an input on another device -----------------------------------------------------------


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize(("layer_device", "input_device"), [("cpu", "meta"), ("meta", "cpu")])
def test_input_on_another_device_is_refused_before_the_build(
    row: Row, layer_device: str, input_device: str
) -> None:
    """(A layer without tensors has no device of its own: the pools and ChannelDropout.)"""
    x = row.example().to(input_device)
    layer = row.lazy(**row.simple, device=layer_device)
    before = Before(layer)
    with pytest.raises(lazynn.InferenceError) as caught:
        row.call(layer, x)
    text = str(caught.value)
    assert text.startswith(row.lazy.__name__)
    assert f"an input on {layer_device} (the layer's device)" in text
    assert f"received an input on {input_device}" in text
    assert "Fix: move the input (x.to(device)) or the layer (layer.to(device))" in text
    before.assert_unbuilt_again()


def test_device_error_names_the_path() -> None:
    model = nn.Sequential(nn.Identity(), nn.Sequential(lazynn.LazyLinear(3)))
    with pytest.raises(lazynn.InferenceError, match=r"^LazyLinear at '1\.0': .*on cpu.*on meta"):
        model(torch.empty(2, 5, device="meta"))
    assert type(model[1][0]) is lazynn.LazyLinear


# --- 4. torch.func transforms as the first call -----------------------------------------------

# Run in a child process: a crash there (torch's own lazy modules crash the interpreter when
# built under a transform) fails this test instead of killing pytest.
_FUNC_CHILD = textwrap.dedent(
    """
    import sys
    import torch
    import lazynn
    from lazynn._module.lifecycle import is_unbuilt
    from registry import ROWS, UNBATCHED, known_tensors, lazy_tensors

    kind = sys.argv[1]
    for row in ROWS:
        x = row.example()
        layer = row.lazy(**row.simple)
        placeholders = [*layer.parameters(), *layer.buffers()]
        lazy = set(lazy_tensors(layer))
        known = {name: t.clone() for name, t in known_tensors(layer).items()}
        rng = torch.get_rng_state()
        if kind == "grad":
            call = lambda: torch.func.grad(lambda x: row.call(layer, x).sum())(x)
        else:
            call = lambda: torch.func.jacrev(lambda x: row.call(layer, x))(x)
        try:
            call()
        except lazynn.InferenceError as error:
            text = str(error)
            assert text.startswith(row.lazy.__name__), text
            assert "torch.func" in text, text
            assert "Fix: build the model first" in text, text
        else:
            raise AssertionError(f"{row.id}: {kind} as the first call was not refused")
        assert type(layer) is row.lazy, row.id
        assert is_unbuilt(layer) and lazynn.is_lazy(layer), row.id
        after = [*layer.parameters(), *layer.buffers()]
        assert all(a is b for a, b in zip(after, placeholders, strict=True)), row.id
        assert set(lazy_tensors(layer)) == lazy, row.id
        assert all(lazynn.is_lazy(t) for t in lazy_tensors(layer).values()), row.id
        for name, t in known_tensors(layer).items():  # num_batches_tracked: real, unchanged
            assert not lazynn.is_lazy(t), (row.id, name)
            assert torch.equal(t, known[name]), (row.id, name)
        assert torch.equal(torch.get_rng_state(), rng), row.id
        # A plain call then builds it, as the eager twin under the same seed.
        torch.manual_seed(0)
        row.call(layer, x)
        torch.manual_seed(0)
        eager = row.new_eager(row.simple, row.simple_size)
        row.call(eager, x)
        assert type(layer) is type(eager), row.id
        for key, value in eager.state_dict().items():
            assert torch.equal(layer.state_dict()[key], value), (row.id, key)
        # ...and the transform works on the built layer as on the eager twin (in eval mode:
        # a grad transform refuses the running statistics' in-place update, as for the
        # eager layer). Where torch cannot transform the eager layer (a data-dependent
        # forward), the built layer fails alike.
        layer.eval()
        eager.eval()
        if kind == "grad":
            transform = lambda m: torch.func.grad(lambda x: row.call(m, x).sum())(x)
        elif row.lazy in UNBATCHED or row.lazy is lazynn.LazyLinear:
            transform = lambda m: torch.func.vmap(lambda x: row.call(m, x))(x)
        else:
            continue
        try:
            transform(eager)
        except Exception as error:
            failure = type(error)
        else:
            failure = None
        try:
            transform(layer)
        except Exception as error:
            assert type(error) is failure, (row.id, error)
        else:
            assert failure is None, (row.id, failure)
    print("ALL-OK")
    """
)


@pytest.mark.slow  # a child process per transform, every row
@pytest.mark.parametrize("transform", ["grad", "jacrev"])
def test_func_transform_as_first_call_is_refused(transform: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FUNC_CHILD, transform],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        },
    )
    assert result.returncode >= 0, f"the child crashed (signal {-result.returncode})"
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ALL-OK" in result.stdout


def _outcome(module: nn.Module, call: Callable[[], Any]) -> tuple[Any, type[BaseException] | None]:
    try:
        return call(), None
    except Exception as error:  # (compared with the eager layer's)
        return None, type(error)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_first_call_under_vmap_builds_as_the_eager_layer_constructed_there(row: Row) -> None:
    """torch.vmap(randomness='same') as the first call (torchrl builds one network per agent
    so): the layer builds as torch's lazy modules do, to the eager layer's numbers and
    outputs; where the eager layer's forward fails under vmap (running statistics updated in
    place), the first call fails and the layer stays unbuilt, the generator unmoved."""
    x = row.example()
    stacked = torch.stack([x, x])
    torch.manual_seed(0)
    layer = row.lazy(**row.simple)
    rng = torch.get_rng_state()
    out, failed = _outcome(
        layer, lambda: torch.vmap(lambda xi: row.call(layer, xi), randomness="same")(stacked)
    )
    after = torch.get_rng_state()
    torch.manual_seed(0)
    eager = row.new_eager(row.simple, row.simple_size)
    expected, eager_failed = _outcome(
        eager, lambda: torch.vmap(lambda xi: row.call(eager, xi), randomness="same")(stacked)
    )
    if eager_failed is not None:
        assert failed is not None, row.id
        assert is_unbuilt(layer), row.id
        assert type(layer) is row.lazy, row.id
        assert torch.equal(after, rng), row.id
        return
    assert failed is None, row.id
    assert type(layer) is type(eager), row.id
    assert_same_module(layer, eager)
    leaves = torch.utils._pytree.tree_leaves
    assert all(torch.equal(a, b) for a, b in zip(leaves(out), leaves(expected), strict=True))


def test_a_first_call_under_vmap_that_refuses_draws_says_how_to_allow_them() -> None:
    """vmap's default randomness='error' refuses the initialization's draws: the error (a
    RuntimeError, as torch's) names the layer and the fix; the layer stays unbuilt."""
    layer = lazynn.LazyLinear(3)
    x = torch.randn(2, 4)
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match=r"^LazyLinear: .*randomness='same'") as caught:
        torch.vmap(layer)(x)
    assert isinstance(caught.value, lazynn.InferenceError)
    assert "randomness error mode" in str(caught.value)  # (torch's words)
    assert lazynn.is_lazy(layer)
    assert torch.equal(torch.get_rng_state(), rng)
    # a layer whose initialization draws nothing builds there
    norm = lazynn.LazyLayerNorm()
    torch.vmap(norm)(torch.randn(2, 3, 4))
    assert type(norm) is nn.LayerNorm
    assert norm.normalized_shape == (4,)


# --- 5. initialize_parameters called directly -------------------------------------------------


def test_initialize_parameters_builds_completely(row: Row) -> None:
    x = row.example()
    layer = row.lazy(**row.simple)
    names = [name for name, _ in tensors_of(layer)]
    placeholders = lazy_tensors(layer)
    torch.manual_seed(0)
    layer.initialize_parameters(*row.args(layer, x))
    eager = eager_twin(row)
    assert_same_module(layer, eager)  # eager class, no pre-hook, no _lazynn_ attributes
    built = dict(tensors_of(layer))
    assert list(built) == names
    # the placeholders are filled in place (a known buffer takes eager's value: compared above)
    assert all(built[name] is t for name, t in placeholders.items())
    layer.eval()
    eager.eval()
    assert torch.equal(row.call(layer, x), row.call(eager, x))


def test_initialize_parameters_again_after_the_build(row: Row) -> None:
    """What a second call does: the layer is now exactly the eager class, which has no
    initialize_parameters (as torch's own layers after their first forward), so the call
    raises AttributeError; nothing changes. A bound method kept from before the build
    raises AttributeError too (about `_infer_parameters`), and changes nothing either."""
    x = row.example()
    layer = row.lazy(**row.simple)
    stale = layer.initialize_parameters
    torch.manual_seed(0)
    layer.initialize_parameters(*row.args(layer, x))
    bigger = row.input(row.simple, 2 * row.simple_size)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    rng = torch.get_rng_state()
    with pytest.raises(AttributeError, match="initialize_parameters"):
        layer.initialize_parameters(*row.args(layer, bigger))
    with pytest.raises(AttributeError):
        stale(*row.args(layer, bigger))
    assert type(layer) is row.eager
    if row.sized:
        assert row.size(layer) == row.simple_size
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in layer.state_dict().items():
        assert torch.equal(value, state[key]), key


# --- 6. an inferred size of 0 ----------------------------------------------------------------


Call = Callable[[nn.Module, torch.Tensor], Any]


def _zero_cases() -> Iterator[tuple[str, Callable[[], nn.Module], tuple[int, ...], Call]]:
    def plain(m: nn.Module, x: torch.Tensor) -> Any:
        return m(x)

    yield "LazyLinear-(2, 0)", lambda: lazynn.LazyLinear(3), (2, 0), plain
    yield "LazyConv2d-(1, 0, 5, 5)", lambda: lazynn.LazyConv2d(3, 3), (1, 0, 5, 5), plain
    for row in ROWS:
        if row.sized:  # (the pools and ChannelDropout infer no size)
            yield (
                f"{row.id}-registry",
                lambda row=row: row.lazy(**row.simple),  # type: ignore[misc]
                row.shape(row.simple, 0, True),
                row.call,
            )


@pytest.mark.parametrize(
    ("make", "shape", "call"), [c[1:] for c in _zero_cases()], ids=[c[0] for c in _zero_cases()]
)
def test_inferred_size_of_zero_is_refused(
    make: Callable[[], nn.Module], shape: tuple[int, ...], call: Call
) -> None:
    layer = make()
    before = Before(layer)
    name = type(layer).__name__
    with pytest.raises(lazynn.InferenceError, match=rf"^{name}: expected a positive \w+ ") as e:
        call(layer, torch.randn(shape))
    assert f"received shape {tuple(shape)}" in str(e.value)
    assert "=0" in str(e.value) or "=(0," in str(e.value)  # an int size, or a tuple one
    assert "Fix: call the layer with a non-empty input" in str(e.value)
    before.assert_unbuilt_again()


# --- 7. declared on meta, moved with to_empty ------------------------------------------------


def _meta_by_argument() -> nn.Module:
    return lazynn.LazyLinear(3, device="meta")


def _meta_by_context() -> nn.Module:
    with torch.device("meta"):
        return lazynn.LazyLinear(3)


@pytest.mark.parametrize(
    "make", [_meta_by_argument, _meta_by_context], ids=["device-argument", "device-context"]
)
def test_declared_on_meta_then_to_empty_builds_on_cpu(make: Callable[[], nn.Module]) -> None:
    layer = make()
    assert layer.weight.is_meta
    layer = layer.to_empty(device="cpu")
    assert lazynn.is_lazy(layer)
    assert not layer.weight.is_meta
    x = torch.randn(2, 5)
    torch.manual_seed(7)  # the seed is set before the first call...
    y = layer(x)
    torch.manual_seed(7)  # ...so the eager twin is nn.Linear made on CPU under that seed
    eager = nn.Linear(5, 3)
    assert all(t.device.type == "cpu" for _, t in tensors_of(layer))
    assert_same_module(layer, eager)
    assert torch.equal(y, eager(x))


# --- 8. placeholders: type(), keep_vars, unbuilt checkpoints ----------------------------------


@pytest.mark.parametrize("row", PARAMETER_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_placeholder_type_without_argument(row: Row, dtype: torch.dtype | None) -> None:
    layer = row.lazy(**row.simple)
    if dtype is not None:
        layer = layer.to(dtype)
    placeholders = lazy_tensors(layer)
    assert placeholders
    for name, t in tensors_of(layer):
        assert lazynn.is_lazy(t) is (name in placeholders), name
        expected = torch.empty(0, dtype=t.dtype).type()
        assert t.type() == expected, name
        assert isinstance(t.type(), str)
    for name, t in known_tensors(layer).items():  # num_batches_tracked: real, integer
        assert t.type() == "torch.LongTensor", name
    if dtype is not None:
        parameters = dict(layer.named_parameters())  # 'weight'; 'weight_ih'... for cells
        assert parameters
        for name, p in parameters.items():
            assert p.type() == "torch.DoubleTensor", name


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_state_dict_keep_vars_does_not_mark_live_placeholders(row: Row) -> None:
    layer = row.lazy(**row.simple)
    live = dict(tensors_of(layer))
    placeholders = lazy_tensors(layer)
    kept = layer.state_dict(keep_vars=True)
    detached = layer.state_dict()
    assert set(kept) == set(detached) == set(live)
    for key, value in kept.items():
        assert value is live[key], key
        assert "_lazynn_checkpoint" not in vars(value), key
        if key not in placeholders:  # a real buffer (num_batches_tracked): it has a shape
            assert value.shape == (), key
            continue
        with pytest.raises(lazynn.UnbuiltError) as caught:
            _ = value.shape
        assert str(caught.value).startswith(f"the '{key}' of {row.lazy.__name__}: ")
    # The detached copies are the ones marked as checkpoint entries.
    for key, value in detached.items():
        assert value is not live[key], key
        assert "_lazynn_checkpoint" not in vars(live[key]), key
        if key not in placeholders:  # a plain detached tensor, with the live one's value
            assert type(value) is torch.Tensor, key
            assert "_lazynn_checkpoint" not in vars(value), key
            assert torch.equal(value, live[key]), key
            continue
        with pytest.raises(lazynn.UnbuiltError, match=rf"^checkpoint entry '{key}'"):
            _ = value.shape


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_unbuilt_checkpoint_through_torch_save_into_a_built_layer(row: Row) -> None:
    buffer = io.BytesIO()
    torch.save(row.lazy(**row.simple).state_dict(), buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)  # weights_only=True, the default
    built = row.lazy(**row.simple)
    row.call(built, row.example())
    state = {k: v.clone() for k, v in built.state_dict().items()}
    with pytest.raises(lazynn.UnbuiltError) as caught:
        built.load_state_dict(checkpoint)
    text = str(caught.value)
    assert text.startswith("checkpoint entry '")
    assert f"(saved from an unbuilt {row.lazy.__name__})" in text
    assert "build the source model" in text
    for key, value in built.state_dict().items():
        assert torch.equal(value, state[key]), key  # nothing was loaded


# --- 9. torch.compile -------------------------------------------------------------------------


@pytest.fixture
def dynamo_reset() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _net(lazy: bool) -> nn.Module:
    if lazy:
        return nn.Sequential(
            nn.Sequential(lazynn.LazyConv2d(4, 3), lazynn.LazyBatchNorm2d(), nn.ReLU()),
            nn.Flatten(),
            lazynn.LazyLinear(5),
        )
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
    )


@pytest.mark.compile
@pytest.mark.usefixtures("dynamo_reset")
def test_compile_dynamic_builds_an_unbuilt_nested_model() -> None:
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(0)
    model = _net(lazy=True)
    compiled = torch.compile(model, dynamic=True)
    y = compiled(x)
    torch.manual_seed(0)
    eager = _net(lazy=False)
    y_eager = eager(x)
    assert not lazynn.is_lazy(model)
    assert [type(m) for m in model.modules()] == [type(m) for m in eager.modules()]
    assert not any(m._forward_pre_hooks for m in model.modules())
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        assert type(p) is nn.Parameter, name
        assert torch.equal(p, q), name
    torch.testing.assert_close(y, y_eager)
    # Another batch size: the dynamic graph serves it.
    x3 = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(compiled(x3), eager(x3))


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


@pytest.mark.compile
@pytest.mark.usefixtures("dynamo_reset")
def test_error_under_compile_names_the_path_without_orig_mod() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(5, 5), lazynn.LazyConv2d(4, 3)))
    with pytest.raises(Exception) as caught:  # noqa: PT011 (dynamo may wrap it)
        torch.compile(model)(torch.randn(2, 5))
    chain = _chain(caught.value)
    inference = [e for e in chain if isinstance(e, lazynn.InferenceError)]
    assert inference, [type(e).__name__ for e in chain]
    assert str(inference[0]).startswith("LazyConv2d at '0.1': ")
    assert all("_orig_mod" not in str(e) for e in chain)
    assert type(model[0][1]) is lazynn.LazyConv2d  # refused before the build
    assert lazynn.is_lazy(model[0][1])


@pytest.mark.xfail(
    strict=True,
    reason="known limitation (README): under torch.compile dynamo builds the layer itself "
    "(_infer_parameters on fake inputs) and then traces; a failure only the real forward "
    "sees is not rolled back. Build first with lazynn.build(model, example).",
)
@pytest.mark.compile
@pytest.mark.usefixtures("dynamo_reset")
def test_forward_failure_under_compile_is_rolled_back() -> None:
    """Beyond the listed cases: item 1's guarantee for a compiled first call."""
    layer = lazynn.LazyBatchNorm1d(momentum=None)
    before = Before(layer)
    with pytest.raises(Exception) as caught:  # noqa: PT011 (dynamo may wrap it)
        torch.compile(layer, backend="eager")(torch.randn(1, 4))
    assert "more than 1 value per channel" in str(caught.value)
    before.assert_unbuilt_again()
