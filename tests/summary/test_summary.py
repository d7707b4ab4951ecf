"""lazynn.summary(): the table of a model's layers, shapes and parameter counts, computed on meta.

Golden files keep the renderings of a few small models (tests/golden/<name>.txt, .md, .json
and .dot, models in tests/golden_models.py). After an intended change of the rendering,
regenerate them with

    LAZYNN_REGEN_GOLDEN=1 python -m pytest tests/summary/test_summary.py -k golden

and read the diff before committing: the numbers are checked by hand in
``test_lazy_cnn_numbers_by_hand``, the rest against the built model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

import lazynn
from golden_models import CASES, IMAGE, TiedLM, TwoInputs, lazy_cnn, real_inputs
from lazynn._module.tensors import is_placeholder
from lazynn._module.tensors import raw as _raw
from paths import GOLDEN
from registry import Row, assert_known_initial, known_tensors, lazy_tensors

REGEN = os.environ.get("LAZYNN_REGEN_GOLDEN") == "1"

Shapes = tuple[tuple[tuple[int, ...], torch.dtype], ...]


# --- helpers --------------------------------------------------------------------------------


class Fingerprint:
    """Everything summary() must leave alone in a model (and the process's torch state)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.lazy = lazynn.is_lazy(model)
        self.modules = [
            (p, m, type(m), m.training, dict(vars(m))) for p, m in model.named_modules()
        ]
        self.containers = [
            (p, name, value, dict(value) if isinstance(value, dict) else set(value))
            for p, m in model.named_modules()
            for name, value in vars(m).items()
            if isinstance(value, (dict, set))
        ]
        self.tensors = [
            (p, name, t)
            for p, m in model.named_modules()
            for name, t in (*m._parameters.items(), *m._buffers.items())
        ]
        self.placeholders = [
            (
                t,
                type(t),
                _raw(t).dtype,
                _raw(t).device,
                _raw(t).shape,
                t.requires_grad,
                dict(t.__dict__),
            )
            for _, _, t in self.tensors
            if t is not None and is_placeholder(t)
        ]
        self.values = [
            (t, t.detach().clone(), t.requires_grad, t.device)
            for _, _, t in self.tensors
            if t is not None and not is_placeholder(t)
        ]
        self.rng = torch.get_rng_state()
        self.grad = torch.is_grad_enabled()
        self.dtype = torch.get_default_dtype()

    def assert_unchanged(self) -> None:
        after = Fingerprint(self.model)
        assert after.lazy == self.lazy
        assert torch.equal(after.rng, self.rng), "the RNG state moved"
        assert after.grad == self.grad
        assert after.dtype == self.dtype
        assert len(after.modules) == len(self.modules)
        for (path, m, cls, training, attrs), (path2, m2, cls2, training2, attrs2) in zip(
            self.modules, after.modules, strict=True
        ):
            assert (path2, cls2, training2) == (path, cls, training), path
            assert m2 is m, path
            assert attrs2.keys() == attrs.keys(), path
            for key, value in attrs.items():
                assert attrs2[key] is value, f"{path}.{key} replaced"
        for path, name, container, content in self.containers:
            if isinstance(container, dict):  # parameters, buffers, modules, every hook dict
                assert list(container) == list(content), f"{path}.{name} changed"
                assert all(container[k] is v for k, v in content.items()), f"{path}.{name}"
            else:
                assert container == content, f"{path}.{name} changed"
        assert [(p, n) for p, n, _ in after.tensors] == [(p, n) for p, n, _ in self.tensors]
        for (_, name, t), (_, _, t2) in zip(self.tensors, after.tensors, strict=True):
            assert t2 is t, f"{name} replaced"
        for t, cls, dtype, device, shape, grad, attrs in self.placeholders:
            assert type(t) is cls
            assert is_placeholder(t)
            raw = _raw(t)
            assert (raw.dtype, raw.device, raw.shape) == (dtype, device, shape)
            assert t.requires_grad == grad
            assert t.__dict__ == attrs
        for t, value, grad, device in self.values:
            assert t.device == device
            assert t.requires_grad == grad
            assert torch.equal(t.detach(), value)


def built_counts(model: nn.Module) -> dict[str, int]:
    params = list(model.parameters())  # each tensor once, as Summary counts
    return {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
    }


def summary_counts(s: lazynn.Summary) -> dict[str, int]:
    return {
        "total": s.total_parameters,
        "trainable": s.trainable_parameters,
        "parameter_bytes": s.parameter_bytes,
        "buffer_bytes": s.buffer_bytes,
    }


def first_call_shapes(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """Run ``model`` for real and record each module's first input and output shapes."""
    seen: dict[str, tuple[Shapes, Shapes]] = {}

    def shapes(value: Any) -> Shapes:
        return tuple(
            (tuple(t.shape), t.dtype) for t in tree_leaves(value) if isinstance(t, torch.Tensor)
        )

    handles = []
    for path, module in model.named_modules():

        def hook(m: nn.Module, a: Any, k: Any, out: Any, path: str = path) -> None:
            seen.setdefault(path, (shapes((a, k)), shapes(out)))

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


# --- extra models for the totals ------------------------------------------------------------


def frozen_mixed() -> nn.Module:
    """A frozen unbuilt lazy layer, a trainable lazy one, a frozen eager one, torch's lazy BN."""
    model = nn.Sequential(
        lazynn.LazyLinear(6),
        nn.ReLU(),
        lazynn.LazyLinear(5),
        nn.Linear(5, 4),
        nn.LazyBatchNorm1d(),
        nn.LazyLinear(3),
    )
    model[0].requires_grad_(False)
    model[3].requires_grad_(False)
    return model


def double_cnn() -> nn.Module:
    return lazy_cnn().double()


TOTALS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    **{name: (case.factory, case.examples) for name, case in CASES.items() if name != "symbolic"},
    "frozen_mixed": (frozen_mixed, ((3, 7),)),
    "double_cnn": (double_cnn, (lazynn.Spec(IMAGE, torch.float64),)),
}


# A tied decoder is "changed after construction": build() keeps it, with a warning (reported).
KEPT_TIED = pytest.mark.filterwarnings("ignore:lazynn.build kept the values:UserWarning")

# --- golden files ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "dot"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, fmt: str) -> None:
    case = CASES[name]
    text = lazynn.summary(case.factory(), *case.examples).render(format=fmt)
    path = (
        GOLDEN / f"{name}.{ {'table': 'txt', 'markdown': 'md', 'json': 'json', 'dot': 'dot'}[fmt] }"
    )
    if REGEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text + "\n")
        pytest.skip(f"regenerated {path}")
    assert text + "\n" == path.read_text()


def test_lazy_cnn_numbers_by_hand() -> None:
    """The golden lazy_cnn, worked out by hand (2 x 3 x 8 x 8 images, float32)."""
    s = lazynn.summary(lazy_cnn(), IMAGE)
    conv = 8 * 3 * 3 * 3 + 8  # 224
    bn = 8 + 8  # weight, bias; buffers: running_mean, running_var (8 floats), an int64 counter
    linear = 10 * (8 * 4 * 4) + 10  # 1290, after MaxPool2d(2): 8 x 4 x 4
    assert s.total_parameters == conv + bn + linear == 1530
    assert s.trainable_parameters == 1530
    assert s.parameter_bytes == 4 * 1530 == 6120
    assert s.buffer_bytes == 4 * 16 + 8 == 72
    text = s.render(columns=("input", "output", "params", "param_bytes", "buffer_bytes"))
    lines = text.splitlines()
    assert lines[0] == "Sequential: input [2, 3, 8, 8] -> output [2, 10]"
    assert "Total params:         1,530" in lines
    assert "Non-trainable params: 0" in lines
    assert "Parameter memory:     5.98 KiB" in lines  # 6120 / 1024 = 5.977
    assert "Buffer memory:        72 B" in lines
    assert "Total memory:         6.05 KiB" in lines  # 6192 / 1024 = 6.047
    (bn_line,) = [line for line in lines if "BatchNorm2d" in line]
    assert bn_line.split()[-5:] == ["16", "64", "B", "72", "B"]  # 16 floats; 8 + 8 floats, int64
    (fc_line,) = [line for line in lines if "classifier" in line]
    assert "(LazyLinear -> Linear)" in fc_line
    assert "[2, 128]" in fc_line
    assert fc_line.split()[-4:] == ["1,290", "5.04", "KiB", "--"]
    # FLOPs: a multiply-add counts 2 (FlopCounterMode's convention)
    conv_flops = 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)  # batch 2, 8 channels of 8 x 8, 27 taps
    assert s.total_flops == conv_flops + 2 * 2 * 128 * 10


# --- totals equal the built model -----------------------------------------------------------


@KEPT_TIED
@pytest.mark.parametrize("name", sorted(TOTALS))
def test_totals_equal_built_model(name: str) -> None:
    factory, examples = TOTALS[name]
    s = lazynn.summary(factory(), *examples)
    built = lazynn.build(factory(), *examples)
    assert not lazynn.is_lazy(built)
    assert summary_counts(s) == built_counts(built)
    assert s.non_trainable_parameters == s.total_parameters - s.trainable_parameters
    after = lazynn.summary(built, *examples)
    assert summary_counts(after) == summary_counts(s)
    # The same rows before and after the build, but for the lazy class they came from.
    assert [dataclasses.replace(r, lazy_type=None) for r in s.rows] == list(after.rows)
    assert all(r.lazy_type is None for r in after.rows)


@KEPT_TIED
@pytest.mark.parametrize("name", sorted(TOTALS))
def test_rows_equal_built_modules(name: str) -> None:
    factory, examples = TOTALS[name]
    model = factory()
    s = lazynn.summary(model, *examples)
    built = lazynn.build(factory(), *examples)
    modules = dict(built.named_modules())
    assert [r.path for r in s.rows] == list(modules)
    calls = first_call_shapes(built, real_inputs(examples))
    seen: set[int] = set()
    for row in s.rows:
        module = modules[row.path]
        own = dict(module.named_parameters(recurse=False))
        assert row.type == type(module).__name__, row.path
        assert row.parameters == tuple((n, tuple(p.shape)) for n, p in own.items()), row.path
        counted = [p for p in own.values() if id(p) not in seen]
        assert row.num_parameters == sum(p.numel() for p in counted), row.path
        assert row.trainable_parameters == sum(p.numel() for p in counted if p.requires_grad)
        tensors = [*own.values(), *module.buffers(recurse=False)]
        fresh = [t for t in tensors if id(t) not in seen]  # a tied tensor counts where first seen
        seen.update(id(t) for t in tensors)
        assert row.nbytes == sum(t.numel() * t.element_size() for t in fresh), row.path
        assert (row.inputs, row.outputs) == calls[row.path], row.path
    assert (s.inputs, s.outputs) == calls[""]


def test_tied_weights_counted_once() -> None:
    s = lazynn.summary(TiedLM(), lazynn.Spec((2, 6), torch.long))
    rows = {r.path: r for r in s.rows}
    assert rows["embed"].parameters == rows["decoder"].parameters == (("weight", (20, 8)),)
    assert rows["embed"].num_parameters == 160
    assert rows["decoder"].num_parameters == 0  # counted once, at the embedding: rows add up
    assert rows["decoder"].tied == (("weight", "embed.weight"),)
    assert s.total_parameters == 160 + (8 * 8 + 8)  # the embedding once, and hidden
    assert s.total_parameters == sum(r.num_parameters for r in s.rows)
    assert s.parameter_bytes == 4 * s.total_parameters
    table = str(s).splitlines()
    (decoder,) = [line for line in table if "decoder (" in line]
    assert decoder.split()[-2] == "--*"
    assert "* decoder.weight is embed.weight: counted once, there" in table


def test_frozen_layers_are_non_trainable() -> None:
    s = lazynn.summary(frozen_mixed(), (3, 7))
    rows = {r.path: r for r in s.rows}
    assert (rows["0"].num_parameters, rows["0"].trainable_parameters) == (6 * 7 + 6, 0)
    assert (rows["2"].num_parameters, rows["2"].trainable_parameters) == (5 * 6 + 5, 35)
    assert (rows["3"].num_parameters, rows["3"].trainable_parameters) == (4 * 5 + 4, 0)
    assert rows["4"].lazy_type == "LazyBatchNorm1d"
    assert rows["4"].type == "BatchNorm1d"
    assert s.non_trainable_parameters == 48 + 24
    assert s.buffer_bytes == 4 * 4 * 2 + 8  # BatchNorm1d(4): running stats and the counter
    assert f"Non-trainable params: {s.non_trainable_parameters}" in str(s).splitlines()


def test_each_lazy_layer(row: Row) -> None:
    """Every registry layer: summary on meta equals the first real call."""
    layer = row.lazy(**row.simple)
    x = row.example()
    fingerprint = Fingerprint(layer)
    if not row.rehearsable:  # its shapes depend on values: refused with the fix
        with pytest.raises(lazynn.InferenceError, match=r"needs values.*model\(example\)"):
            lazynn.summary(layer, *row.args(layer, x))
        fingerprint.assert_unchanged()
        return
    s = lazynn.summary(layer, *row.args(layer, x))
    fingerprint.assert_unchanged()
    row.call(layer, x)
    assert (s.rows[0].type, s.rows[0].lazy_type) == (row.eager.__name__, row.lazy.__name__)
    assert summary_counts(s) == built_counts(layer)
    # a row lists its module's own parameters: the whole layer's for a flat one, and one
    # row per child for a composite one (TransformerEncoderLayer: self_attn, linear1...)
    modules = dict(layer.named_modules())
    assert [r.path for r in s.rows] == list(modules)
    for r in s.rows:
        own = modules[r.path].named_parameters(recurse=False)
        assert r.parameters == tuple((n, tuple(p.shape)) for n, p in own), r.path


# --- summary changes nothing ----------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_unbuilt_model_unchanged(train: bool) -> None:
    model = lazy_cnn().train(train)
    fingerprint = Fingerprint(model)
    first = lazynn.summary(model, IMAGE)
    fingerprint.assert_unchanged()
    assert lazynn.is_lazy(model)
    assert all(lazynn.is_lazy(p) for p in model.parameters())
    placeholders = lazy_tensors(model)
    assert {name for name, _ in model.named_buffers()} - set(placeholders) == set(
        known_tensors(model)
    )
    assert all(lazynn.is_lazy(t) for t in placeholders.values())
    assert_known_initial(model)  # num_batches_tracked: real, still 0 in train mode too
    assert all(m.training == train for m in model.modules())
    assert lazynn.summary(model, IMAGE) == first  # again: the same, nothing was left behind


def test_built_model_unchanged_in_train_mode() -> None:
    model = lazynn.build(lazy_cnn(), IMAGE).train()
    bn = model.features[1]
    with torch.no_grad():
        bn.running_mean.fill_(0.5)
    handle = model.classifier.register_forward_hook(lambda m, a, out: None)
    fingerprint = Fingerprint(model)
    s = lazynn.summary(model, IMAGE)
    fingerprint.assert_unchanged()
    assert torch.equal(bn.running_mean, torch.full((8,), 0.5))
    assert torch.equal(bn.running_var, torch.ones(8))
    assert bn.num_batches_tracked.item() == 0
    assert list(model.classifier._forward_hooks) == [handle.id]
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert s.total_parameters == built_counts(model)["total"]


def test_same_weights_with_or_without_summary() -> None:
    """summary() neither draws random numbers nor disturbs what the build replays."""
    torch.manual_seed(3)
    plain = lazynn.build(lazy_cnn(), IMAGE)
    torch.manual_seed(3)
    summarized = lazy_cnn()
    lazynn.summary(summarized, IMAGE)
    lazynn.build(summarized, IMAGE)
    for (key, a), (_, b) in zip(
        plain.state_dict().items(), summarized.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), key


def test_allocates_nothing() -> None:
    """A layer of 10^12 parameters (4 TB) is summarized without allocating it."""
    model = nn.Sequential(lazynn.LazyLinear(10**6))
    s = lazynn.summary(model, (1, 10**6))
    assert s.total_parameters == 10**12 + 10**6
    assert s.parameter_bytes == 4 * s.total_parameters
    assert "Total params:         1,000,001,000,000" in str(s).splitlines()
    assert lazynn.is_lazy(model)


def test_example_tensors_are_not_touched() -> None:
    x = torch.randn(*IMAGE)
    copy = x.clone()
    s = lazynn.summary(lazy_cnn(), x)
    assert torch.equal(x, copy)
    assert s.inputs == ((IMAGE, torch.float32),)


# --- row data -------------------------------------------------------------------------------


def test_row_data_of_lazy_cnn() -> None:
    s = lazynn.summary(lazy_cnn(), IMAGE)
    assert s.model_type == "Sequential"
    assert [(r.path, r.depth) for r in s.rows] == [
        ("", 0),
        ("features", 1),
        ("features.0", 2),
        ("features.1", 2),
        ("features.2", 2),
        ("features.3", 2),
        ("flatten", 1),
        ("classifier", 1),
    ]
    assert [(r.type, r.lazy_type) for r in s.rows] == [
        ("Sequential", None),
        ("Sequential", None),
        ("Conv2d", "LazyConv2d"),
        ("BatchNorm2d", "LazyBatchNorm2d"),
        ("ReLU", None),
        ("MaxPool2d", None),
        ("Flatten", None),
        ("Linear", "LazyLinear"),
    ]
    conv = s.rows[2]
    f32 = torch.float32
    assert conv.inputs == (((2, 3, 8, 8), f32),)
    assert conv.outputs == (((2, 8, 8, 8), f32),)
    assert conv.parameters == (("weight", (8, 3, 3, 3)), ("bias", (8,)))
    assert (conv.num_parameters, conv.trainable_parameters, conv.nbytes) == (224, 224, 896)
    assert s.rows[6].outputs == (((2, 128), f32),)
    assert (s.rows[6].parameters, s.rows[6].num_parameters, s.rows[6].nbytes) == ((), 0, 0)
    assert s.inputs == (((2, 3, 8, 8), f32),)
    assert s.outputs == (((2, 10), f32),)


def test_row_data_of_several_inputs() -> None:
    s = lazynn.summary(TwoInputs(), (2, 5), torch.zeros(2, 3), lazynn.Spec((2, 7), torch.long))
    rows = {r.path: r for r in s.rows}
    f32 = torch.float32
    assert s.inputs == (((2, 5), f32), ((2, 3), f32), ((2, 7), torch.int64))
    assert rows["fuse"].inputs == (((2, 8), f32),)
    assert rows["fuse"].parameters == (("weight", (16, 8)), ("bias", (16,)))
    assert rows["embed"].inputs == (((2, 7), torch.int64),)
    assert rows["embed"].outputs == (((2, 7, 8), f32),)
    assert rows["head"].inputs == (((2, 24), f32),)
    assert s.outputs == (((2, 4), f32),)
    text = str(s)
    assert text.splitlines()[0] == "TwoInputs: input [2, 5], [2, 3], [2, 7] int64 -> output [2, 4]"


def test_keyword_example_inputs() -> None:
    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(3)

        def forward(self, x: torch.Tensor, *, y: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.cat([x, y], dim=-1))

    s = lazynn.summary(Keyword(), (2, 5), y=(2, 4))
    assert s.rows[1].inputs == (((2, 9), torch.float32),)
    assert s.total_parameters == 3 * 9 + 3


def test_module_registered_under_two_names() -> None:
    """A module held under two attribute names is one row, with the shapes of its call."""

    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = lazynn.LazyLinear(6)
            self.alias = self.block
            self.out = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.alias(x))

    s = lazynn.summary(Aliased(), (2, 5))
    rows = {r.path: r for r in s.rows}
    assert list(rows) == ["", "block", "out"]
    assert rows["block"].inputs == (((2, 5), torch.float32),)
    assert rows["block"].outputs == (((2, 6), torch.float32),)


def test_unreached_lazy_layer() -> None:
    """A lazy layer the examples never reach is listed as not called, and not counted."""

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = lazynn.LazyLinear(3)
            self.spare = lazynn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = Branchy()
    fingerprint = Fingerprint(model)
    s = lazynn.summary(model, (2, 5))
    fingerprint.assert_unchanged()
    rows = {r.path: r for r in s.rows}
    assert s.unreached == ("spare",)
    assert (rows["spare"].type, rows["spare"].lazy_type) == ("LazyLinear", "LazyLinear")
    assert rows["spare"].inputs == rows["spare"].outputs == rows["spare"].parameters == ()
    assert rows["used"].num_parameters == s.total_parameters == 18
    lines = str(s).splitlines()
    assert any("spare (LazyLinear, not called: sizes unknown)" in line for line in lines)
    assert "Not called by the examples, so not counted: 'spare'" in lines


# --- rendering ------------------------------------------------------------------------------


def test_summary_is_frozen_and_rendered_by_render() -> None:
    s = lazynn.summary(lazy_cnn(), IMAGE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.total_parameters = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rows[0].path = "x"  # type: ignore[misc]
    assert s.render() == str(s)


def test_render_of_hand_made_summary() -> None:
    """render() is a pure function of the data: units, separators, dtypes, indentation."""
    f32, f16 = torch.float32, torch.float16
    row = lazynn.SummaryRow
    rows = (
        row("", 0, "Net", None, (((1, 4), f32),), (((1, 2), f16),), (), 0, 0, 0, 0, flops=2_500),
        row("body", 1, "Body", None, (((1, 4), f32),), (((1, 2), f16),), (), 0, 0, 0, 0),
        row(
            "body.fc",
            2,
            "Linear",
            "LazyLinear",
            (((1, 4), f32),),
            (((1, 2), f16),),
            (("weight", (2, 4)),),
            1_234_567,
            1_000_000,
            3 * 1024 * 1024,
            1023,
            calls=3,
            flops=2_500,
        ),
    )
    s = lazynn.Summary(
        "Net",
        rows,
        1_234_567,
        1_000_000,
        3 * 1024 * 1024,
        1023,
        (((1, 4), f32),),
        (((1, 2), f16),),
        total_flops=2_500,
    )
    lines = s.render(depth=2).splitlines()
    assert lines[0] == "Net: input [1, 4] -> output [1, 2] float16"
    rule = lines[1]
    assert set(rule) == {"="}
    assert lines[3] == lines[-1] == rule
    assert lines[2].split() == [
        "Module",
        "(type)",
        "Input",
        "shape",
        "Output",
        "shape",
        "Params",
        "FLOPs",
    ]
    assert lines[4].split() == ["Net", "[1,", "4]", "[1,", "2]", "float16", "--", "2.5K"]
    assert lines[6].startswith("    fc (LazyLinear -> Linear) [3 calls]  ")
    assert lines[6].endswith("1,234,567   2.5K")
    assert all(len(line) <= len(rule) for line in lines)
    assert lines[8:15] == [
        "Total params:         1,234,567",
        "Trainable params:     1,000,000",
        "Non-trainable params: 234,567",
        "Total FLOPs:          2,500 (2.5K, train mode)",
        "Parameter memory:     3.00 MiB",
        "Buffer memory:        1023 B",
        "Total memory:         3.00 MiB",
    ]
    # depth 1: the body's row counts what it hides
    shallow = s.render(depth=1).splitlines()
    (body,) = [line for line in shallow if line.startswith("  body (Body)")]
    assert body.split()[-2:] == ["1,234,567", "--"]
    assert "Depth 1 of 2 shown" in " ".join(shallow)
    wide = s.render(depth=2, columns=("param_shapes", "param_bytes", "buffer_bytes", "calls"))
    fc = wide.splitlines()[6]
    assert fc.split()[-8:] == ["weight", "[2,", "4]", "3.00", "MiB", "1023", "B", "3"]


# --- failures -------------------------------------------------------------------------------


def test_failure_in_a_lazy_layer_names_it_and_changes_nothing() -> None:
    model = nn.Sequential(
        nn.Sequential(lazynn.LazyConv2d(4, 5)), nn.Flatten(), lazynn.LazyLinear(2)
    )
    fingerprint = Fingerprint(model)
    with pytest.raises(lazynn.InferenceError, match=r"LazyConv2d at '0\.0'.*\(2, 3, 2, 2\)"):
        lazynn.summary(model, (2, 3, 2, 2))
    fingerprint.assert_unchanged()
    s = lazynn.summary(model, (2, 3, 6, 6))  # a good example still works
    assert s.total_parameters == 4 * 3 * 25 + 4 + 2 * 16 + 2


def test_failure_in_an_eager_layer_names_it_and_changes_nothing() -> None:
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), nn.Linear(3, 2))
    fingerprint = Fingerprint(model)
    with pytest.raises(lazynn.InferenceError, match=r"Linear at '2'.*\(2, 4\) float32") as info:
        lazynn.summary(model, (2, 5))
    assert "LazyLinear" not in str(info.value)
    fingerprint.assert_unchanged()


def test_failure_in_a_built_model() -> None:
    model = lazynn.build(lazy_cnn(), IMAGE)
    fingerprint = Fingerprint(model)
    with pytest.raises(
        lazynn.InferenceError, match=r"Conv2d at 'features\.0'.*\(2, 4, 8, 8\) float32"
    ):
        lazynn.summary(model, (2, 4, 8, 8))
    fingerprint.assert_unchanged()


def test_failure_after_a_caught_error_names_the_module_that_raised() -> None:
    """A child's error the forward caught is not the one reported."""

    class Fallback(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.narrow = nn.Linear(3, 3)
            self.fc = lazynn.LazyLinear(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with contextlib.suppress(RuntimeError):  # inputs of other widths skip it
                x = self.narrow(x)
            return self.fc(x) @ torch.ones(7, 2)

    model = Fallback()
    with pytest.raises(lazynn.InferenceError, match=r"^Fallback \(root\)") as info:
        lazynn.summary(model, (2, 5))
    assert "'narrow'" not in str(info.value)
    assert lazynn.is_lazy(model)
