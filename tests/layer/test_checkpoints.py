"""state_dict and load_state_dict: unbuilt or built source, into unbuilt or built target.

* unbuilt -> unbuilt: loads, nothing to copy, the target stays unbuilt.
* built -> unbuilt: builds the target (class swap, inferred size, values of the source).
* unbuilt -> built: lazynn.UnbuiltError telling to build the source; the target is untouched.
* built -> built: as torch.
* a checkpoint whose sizes contradict the layer's arguments: lazynn.CheckpointError naming
  the expected and received shapes; the target is left exactly as it was.
* an unbuilt state_dict survives torch.save / torch.load(weights_only=True).
"""

from __future__ import annotations

import inspect
import io
import re
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from lazynn._errors import shape_str
from registry import ROWS, TENSOR_ROWS, Row, assert_known_initial, build_pair, lazy_tensors

NORM_ROWS = [r for r in ROWS if "Norm" in r.lazy.__name__]
#: rows a built checkpoint builds (it has tensors, and they tell everything the layer infers)
BUILDING_ROWS = [r for r in TENSOR_ROWS if r.checkpoint_builds]
#: rows whose built checkpoint cannot tell the class to become (a rank-agnostic norm)
RANKLESS_ROWS = [r for r in TENSOR_ROWS if not r.checkpoint_builds]


def without_tensors(row: Row) -> dict[str, Any]:
    """The row's simple options with affine=False and track_running_stats=False, for the
    layers that take them (GroupNorm takes no track_running_stats: it keeps no statistics)."""
    names = inspect.signature(row.lazy).parameters
    options = {
        **row.simple,
        "affine": False,
        "track_running_stats": False,
        "elementwise_affine": False,
    }
    return {k: v for k, v in options.items() if k in names}


def built(row: Row, seed: int, size: int | None = None) -> nn.Module:
    """A lazy layer built by a train-mode call (so norm running stats are not the initial)."""
    size = row.simple_size if size is None else size
    x = row.input(row.simple, size)
    torch.manual_seed(seed)
    layer = row.lazy(**row.simple)
    row.call(layer, x)
    return layer


def snapshot(module: nn.Module) -> dict[str, Any]:
    """Everything a failed load must leave as it was."""
    return {
        "class": type(module),
        "vars": dict(vars(module)),
        "tensors": dict(module.state_dict(keep_vars=True)),
        "meta": {
            k: (type(t), t.dtype, t.device, t.requires_grad)
            for k, t in module.state_dict(keep_vars=True).items()
        },
        "values": {
            k: t.detach().clone() for k, t in module.state_dict().items() if not lazynn.is_lazy(t)
        },
        "hooks": dict(module._forward_pre_hooks),
    }


def assert_unchanged(module: nn.Module, before: dict[str, Any]) -> None:
    after = snapshot(module)
    assert after["class"] is before["class"]
    assert after["vars"].keys() == before["vars"].keys()
    for key, value in before["vars"].items():
        assert after["vars"][key] is value or after["vars"][key] == value, key
    assert after["tensors"].keys() == before["tensors"].keys()
    for key, tensor in before["tensors"].items():
        assert after["tensors"][key] is tensor, key
    assert after["meta"] == before["meta"]
    assert after["values"].keys() == before["values"].keys()
    for key, value in before["values"].items():
        assert torch.equal(after["values"][key], value), key
    assert after["hooks"] == before["hooks"]


def assert_same_state(module: nn.Module, source: nn.Module) -> None:
    ours, theirs = module.state_dict(), source.state_dict()
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), key
        assert ours[key].dtype == value.dtype, key
        assert torch.equal(ours[key], value), key


# --- unbuilt -> unbuilt -------------------------------------------------------------------
def test_unbuilt_into_unbuilt(row: Row) -> None:
    source = row.lazy(**row.simple)
    target = row.lazy(**row.simple)
    before = snapshot(target)
    result = target.load_state_dict(source.state_dict())
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert lazynn.is_lazy(target)
    assert_unchanged(target, before)
    row.call(target, row.example())  # and it still builds on its first call
    assert type(target) is row.eager


# --- built -> unbuilt ---------------------------------------------------------------------
@pytest.mark.parametrize("row", BUILDING_ROWS, ids=lambda r: r.id)
def test_built_into_unbuilt_builds_the_target(row: Row) -> None:
    source = built(row, seed=1)
    target = row.lazy(**row.simple)
    placeholders = list(target.parameters())
    result = target.load_state_dict(source.state_dict())  # strict=True
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert type(target) is row.eager
    assert not lazynn.is_lazy(target)
    assert row.size(target) == row.simple_size
    assert not target._forward_pre_hooks
    assert repr(target) == repr(source)
    assert vars(target).keys() == vars(source).keys()
    assert_same_state(target, source)
    for p in target.parameters():
        assert type(p) is nn.Parameter
    # built in place: an optimizer made before the load holds the loaded parameters
    assert all(a is b for a, b in zip(placeholders, target.parameters(), strict=True))
    x = row.example()
    assert torch.equal(row.call(target, x), row.call(source, x))


@pytest.mark.parametrize("row", RANKLESS_ROWS, ids=lambda r: r.id)
def test_built_checkpoint_of_unknown_rank_is_refused(row: Row) -> None:
    """A rank-agnostic norm's tensors are the same in every rank: its checkpoint cannot say
    which class to become. A clear CheckpointError, the target left as it was; it then
    builds on its first call, and loads the checkpoint as torch."""
    source = built(row, seed=1)
    target = row.lazy(**row.simple)
    before = snapshot(target)
    with pytest.raises(lazynn.CheckpointError) as info:
        target.load_state_dict(source.state_dict())
    text = str(info.value)
    assert text.startswith(row.lazy.__name__)
    assert "expected a checkpoint that tells this layer's rank" in text
    assert "Fix: build the model first" in text
    assert_unchanged(target, before)
    row.call(target, row.example())
    target.load_state_dict(source.state_dict())
    assert type(target) is row.eager
    assert_same_state(target, source)


@pytest.mark.parametrize("row", BUILDING_ROWS, ids=lambda r: r.id)
def test_built_into_unbuilt_keeps_the_target_dtype(row: Row) -> None:
    """As torch: loading copies values into the target's own dtype."""
    source = built(row, seed=1)
    target = row.lazy(**row.simple, dtype=torch.float64)
    target.load_state_dict(source.state_dict())
    eager = row.new_eager(row.simple, row.simple_size, dtype=torch.float64)
    eager.load_state_dict(source.state_dict())
    assert type(target) is row.eager
    ours = target.state_dict()
    for key, value in eager.state_dict().items():
        assert ours[key].dtype == value.dtype, key
        assert torch.equal(ours[key], value), key


@pytest.mark.parametrize("row", NORM_ROWS, ids=lambda r: r.id)
def test_built_without_tensors_into_unbuilt_stays_unbuilt(row: Row) -> None:
    """With affine=False and track_running_stats=False (InstanceNorm's defaults) a norm has
    no parameter and no buffer: its state_dict is empty, so a checkpoint has nothing from
    which to build. The target stays unbuilt, and builds on its first call."""
    options = without_tensors(row)
    source = row.lazy(**options)
    row.call(source, row.input(options, 3))
    assert source.state_dict() == {}
    target = row.lazy(**options)
    result = target.load_state_dict(source.state_dict())
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert type(target) is row.lazy
    assert lazynn.is_lazy(target)
    assert row.size(target) is lazynn.UNKNOWN
    x = row.input(options, 5)
    row.call(target, x)
    assert type(target) is row.eager
    assert row.size(target) == 5


# --- unbuilt -> built ---------------------------------------------------------------------
@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
@pytest.mark.parametrize("strict", [True, False])
def test_unbuilt_into_built_is_refused(row: Row, strict: bool) -> None:
    source = row.lazy(**row.simple)
    target = built(row, seed=1)
    before = snapshot(target)
    with pytest.raises(lazynn.UnbuiltError, match=r"(?i)build") as info:
        target.load_state_dict(source.state_dict(), strict=strict)
    assert isinstance(info.value, RuntimeError)
    text = str(info.value)
    assert row.lazy.__name__ in text
    first = next(iter(source.state_dict()))  # 'weight'; 'weight_ih' for the cells...
    assert f"'{first}'" in text  # the first entry the target cannot take
    assert "Fix:" in text
    assert_unchanged(target, before)


def test_unbuilt_into_built_names_the_path() -> None:
    """In a model, the error says which layer of the source is unbuilt (its path)."""
    source = nn.Sequential(nn.ReLU(), nn.Sequential(lazynn.LazyConv2d(4, 3)))
    target = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Conv2d(2, 4, 3)))
    weight = target[1][0].weight.detach().clone()
    with pytest.raises(lazynn.UnbuiltError, match="build") as info:
        target.load_state_dict(source.state_dict())
    text = str(info.value)
    assert "LazyConv2d" in text
    assert "'1.0'" in text or "'1.0.weight'" in text
    assert torch.equal(target[1][0].weight, weight)


# --- built -> built -----------------------------------------------------------------------
def test_built_into_built_as_torch(row: Row) -> None:
    source = built(row, seed=1)
    target = built(row, seed=2)
    params = list(target.parameters())
    eager_source = row.new_eager(row.simple, row.simple_size)
    eager_source.load_state_dict(source.state_dict())
    eager_target = row.new_eager(row.simple, row.simple_size)
    expected = eager_target.load_state_dict(eager_source.state_dict())
    result = target.load_state_dict(source.state_dict())
    assert result == expected
    assert type(target) is row.eager
    assert_same_state(target, source)
    assert all(a is b for a, b in zip(params, target.parameters(), strict=True))


# --- contradicting checkpoints --------------------------------------------------------------
def _contradicting(row: Row) -> tuple[dict[str, torch.Tensor], str, str, torch.Size]:
    """A built state_dict whose last non-scalar entry has one more row than the layer's
    arguments allow (the other entries agree with one another); and a regex of the
    expected shape.

    A layer with a single non-scalar entry (PReLU: weight of shape (C,)) reads its size
    from that entry alone, so one more row is just another size, not a contradiction: that
    entry gets an extra dimension instead, which no size allows. The layer then knows the
    rank it expects but not the size, so the expected shape may show it as '?'."""
    state = built(row, seed=1).state_dict()
    keys = [k for k, v in state.items() if v.dim() > 0]
    key = keys[-1]
    expected = state[key].shape
    if len(keys) > 1:
        received = torch.Size((expected[0] + 1, *expected[1:]))
        pattern = re.escape(shape_str(expected))
    else:
        received = torch.Size((*expected, 2))
        dims = [rf"(?:{d}|\?)" for d in expected]
        pattern = r"\(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + r"\)"
    state[key] = torch.zeros(received, dtype=state[key].dtype)
    return state, key, pattern, received


@pytest.mark.parametrize("row", BUILDING_ROWS, ids=lambda r: r.id)
def test_contradicting_checkpoint_is_refused(row: Row) -> None:
    state, key, expected, received = _contradicting(row)
    target = row.lazy(**row.simple)
    before = snapshot(target)
    with pytest.raises(lazynn.CheckpointError) as info:
        target.load_state_dict(state)
    assert isinstance(info.value, lazynn.LazynnError)
    text = str(info.value)
    assert row.lazy.__name__ in text
    assert f"'{key}'" in text
    assert re.search(expected, text.split("received")[0]), text
    assert shape_str(received) in text.split("received")[1]
    assert "Fix:" in text
    assert_unchanged(target, before)
    assert row.size(target) is lazynn.UNKNOWN
    placeholders = lazy_tensors(target)
    assert set(placeholders) == set(lazy_tensors(row.lazy(**row.simple)))
    assert all(lazynn.is_lazy(t) for t in placeholders.values())
    assert_known_initial(target)  # (num_batches_tracked: still 0, nothing was loaded)
    row.call(target, row.example())  # still builds on its first call
    assert type(target) is row.eager


@pytest.mark.parametrize(
    ("lazy", "eager", "expected", "received"),
    [
        (lambda: lazynn.LazyLinear(3), lambda: nn.Linear(4, 5), "(3, 4)", "(5, 4)"),
        (lambda: lazynn.LazyConv1d(4, 3), lambda: nn.Conv1d(2, 6, 3), "(4, 2, 3)", "(6, 2, 3)"),
        (
            lambda: lazynn.LazyConv2d(4, 3),
            lambda: nn.Conv2d(2, 4, 5),
            "(4, 2, 3, 3)",
            "(4, 2, 5, 5)",
        ),
        (
            lambda: lazynn.LazyConvTranspose2d(4, 3),
            lambda: nn.ConvTranspose2d(2, 4, 2),
            "(2, 4, 3, 3)",
            "(2, 4, 2, 2)",
        ),
    ],
    ids=["out_features", "out_channels", "kernel_size", "transpose-kernel_size"],
)
def test_checkpoint_contradicting_arguments(
    lazy: Any, eager: Any, expected: str, received: str
) -> None:
    target = lazy()
    before = snapshot(target)
    with pytest.raises(lazynn.CheckpointError, match=r"expected .*received") as info:
        target.load_state_dict(eager().state_dict())
    text = str(info.value)
    assert type(target).__name__ in text
    assert expected in text.split("received")[0]
    assert received in text.split("received")[1]
    assert "'weight'" in text
    assert_unchanged(target, before)


def test_contradicting_checkpoint_in_a_model_names_the_path() -> None:
    target = nn.Sequential(nn.Sequential(nn.ReLU(), lazynn.LazyLinear(3)))
    before = snapshot(target[0][1])
    source = nn.Sequential(nn.Sequential(nn.ReLU(), nn.Linear(4, 5)))
    with pytest.raises(lazynn.CheckpointError, match=r"LazyLinear at '0\.1'") as info:
        target.load_state_dict(source.state_dict())
    assert "'0.1.weight'" in str(info.value)
    assert_unchanged(target[0][1], before)


# --- torch.save / torch.load ---------------------------------------------------------------
@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda r: r.id)
def test_unbuilt_state_dict_survives_torch_save(row: Row) -> None:
    source = row.lazy(**row.simple, dtype=torch.float64)
    state = source.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # the default: weights_only=True
    assert list(loaded) == list(state)
    placeholders = lazy_tensors(source)
    assert placeholders
    for key, value in loaded.items():
        assert lazynn.is_lazy(value) is (key in placeholders), key
        assert type(value) is type(state[key]), key
        assert value.dtype == state[key].dtype, key
        if key not in placeholders:  # a real buffer (num_batches_tracked): its value too
            assert type(value) is torch.Tensor, key
            assert torch.equal(value, state[key]), key
    if "num_batches_tracked" in loaded:
        assert loaded["num_batches_tracked"].dtype == torch.int64
    parameters = [name for name, _ in source.named_parameters()]
    assert parameters
    for name in parameters:  # 'weight' for most layers, 'weight_ih'... for the cells
        assert loaded[name].dtype == torch.float64, name
    target = row.lazy(**row.simple, dtype=torch.float64)
    result = target.load_state_dict(loaded)
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert lazynn.is_lazy(target)
    assert type(target) is row.lazy
    assert all(lazynn.is_lazy(t) for t in lazy_tensors(target).values())
    assert_known_initial(target)
    row.call(target, row.example().double())
    assert type(target) is row.eager
    for name, p in target.named_parameters():
        assert p.dtype == torch.float64, name


@pytest.mark.parametrize("row", BUILDING_ROWS, ids=lambda r: r.id)
def test_built_state_dict_through_torch_save_builds_a_fresh_layer(row: Row) -> None:
    source = built(row, seed=1)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = row.lazy(**row.simple)
    target.load_state_dict(torch.load(buffer))
    assert type(target) is row.eager
    assert_same_state(target, source)


# --- a whole model --------------------------------------------------------------------------
def model() -> nn.Sequential:
    return nn.Sequential(
        lazynn.LazyConv2d(4, 3),
        lazynn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.Flatten(),
        lazynn.LazyLinear(5),
    )


def test_whole_model_built_into_unbuilt_twin() -> None:
    x = torch.randn(3, 2, 6, 6)
    torch.manual_seed(1)
    source = model()
    source(x)  # train mode: the norm's running stats move
    torch.manual_seed(2)
    target = model()
    result = target.load_state_dict(source.state_dict())
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert not lazynn.is_lazy(target)
    assert [type(m) for m in target] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Flatten, nn.Linear]
    assert (target[0].in_channels, target[1].num_features, target[4].in_features) == (2, 4, 64)
    assert_same_state(target, source)
    assert torch.equal(target.eval()(x), source.eval()(x))
    assert torch.equal(target.train()(x), source.train()(x))


@pytest.mark.parametrize("row", BUILDING_ROWS, ids=lambda r: r.id)
def test_build_pair_round_trip(row: Row) -> None:
    """A lazy-built layer's checkpoint loads into its eager twin, and the other way round."""
    lazy, eager, x = build_pair(row, row.simple, row.simple_size, seed=4)
    fresh = row.lazy(**row.simple)
    fresh.load_state_dict(eager.state_dict())
    assert type(fresh) is row.eager
    assert_same_state(fresh, lazy)
    assert torch.equal(row.call(fresh.eval(), x), row.call(eager.eval(), x))


# --- checkpoints written by older code --------------------------------------------------------


def _versioned(state: dict[str, torch.Tensor], version: int) -> OrderedDict[str, torch.Tensor]:
    """A state_dict as older code saved it: its modules' version in the metadata."""
    old = OrderedDict(state)
    old._metadata = OrderedDict({"": {"version": version}})  # type: ignore[attr-defined]
    return old


def test_a_batchnorm_checkpoint_without_num_batches_tracked_gives_zero() -> None:
    """torchvision's published ResNet weights predate num_batches_tracked."""
    source = nn.BatchNorm2d(3)
    state = {k: v for k, v in source.state_dict().items() if k != "num_batches_tracked"}
    targets = [nn.BatchNorm2d(3), nn.LazyBatchNorm2d(), lazynn.LazyBatchNorm2d()]
    for target in targets:  # (the eager class and torch's lazy one give 0: lazynn's too)
        target.load_state_dict(_versioned(state, 1))
        assert target.num_batches_tracked.item() == 0, type(target)


class MLPBlock(nn.Sequential):
    """torchvision's MLPBlock: its old checkpoints name the layers linear_1 and linear_2, and
    its _load_from_state_dict renames them."""

    _version = 2

    def __init__(self, in_dim: int, mlp_dim: int) -> None:
        super().__init__(
            nn.Linear(in_dim, mlp_dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp_dim, in_dim)
        )

    def _load_from_state_dict(
        self, state_dict: Any, prefix: str, local_metadata: Any, *args: Any
    ) -> None:
        version = local_metadata.get("version", None)
        if version is None or version < 2:
            for i in range(2):
                for kind in ("weight", "bias"):
                    old_key = f"{prefix}linear_{i + 1}.{kind}"
                    if old_key in state_dict:
                        state_dict[f"{prefix}{3 * i}.{kind}"] = state_dict.pop(old_key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def test_a_lazy_class_whose_load_renames_old_keys_takes_an_old_checkpoint() -> None:
    source = MLPBlock(4, 8)
    renamed = {"0.": "linear_1.", "3.": "linear_2."}
    old = {renamed[k[:2]] + k[2:]: v for k, v in source.state_dict().items()}
    eager = MLPBlock(4, 8)
    eager.load_state_dict(_versioned(old, 1))
    lazy = lazynn.lazy(MLPBlock, in_dim=lazynn.Infer(dim=-1))(8)
    lazy.load_state_dict(_versioned(old, 1))
    assert type(lazy) is MLPBlock
    for a, b in zip(lazy.state_dict().values(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b)


class _TiedHead(nn.Module):
    """T5's shape: an embedding and a head tied to it, saved the Hugging Face way (one name of
    the tie: the head's key is absent), with dropout after the load."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.shared = nn.Embedding(10, 8)
        self.fc = lazynn.LazyLinear(8) if lazy else nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.lm_head = lazynn.LazyLinear(10, bias=False) if lazy else nn.Linear(8, 10, bias=False)
        self.lm_head.weight = self.shared.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.drop(self.fc(self.shared(ids))))  # type: ignore[no-any-return]


def test_a_checkpoint_with_one_name_of_a_tie_builds_the_tied_layer_from_its_partner() -> None:
    """The head's only tensor is the embedding's: the load builds it from it, drawing
    nothing, so its first forward draws only what eager's does (dropout)."""
    eager = _TiedHead(lazy=False)
    saved = {k: v for k, v in eager.state_dict().items() if k != "lm_head.weight"}
    model = _TiedHead()
    before = torch.get_rng_state()
    model.load_state_dict(saved, strict=False)
    assert torch.equal(torch.get_rng_state(), before)
    assert not lazynn.is_lazy(model)
    assert model.lm_head.weight is model.shared.weight
    ids = torch.randint(0, 10, (2, 5))
    torch.manual_seed(5)
    expected = eager(ids)
    torch.manual_seed(5)
    assert torch.equal(model(ids), expected)
