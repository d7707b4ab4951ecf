"""lazynn with the real packages around it: safetensors, accelerate, Lightning, torchinfo.

They come with the ``integrations`` extra (``pip install -e ".[integrations]"``, part of
``dev``). Without it these tests skip; CI sets ``LAZYNN_REQUIRE_INTEGRATIONS=1`` so that a
missing package fails instead.

Each test compares against what plain torch.nn gives: the eager twin, constructed under the
same seed.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

import lazynn


def need(name: str) -> ModuleType:
    """The package ``name``; skip without it, unless CI requires it."""
    if os.environ.get("LAZYNN_REQUIRE_INTEGRATIONS") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def lazy_mlp() -> nn.Sequential:
    return nn.Sequential(
        lazynn.LazyLinear(8),
        nn.ReLU(),
        nn.Linear(8, 6),
        lazynn.LazyBatchNorm1d(),
        lazynn.LazyLinear(2),
    )


def eager_mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 2)
    )


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    ours, theirs = a.state_dict(), b.state_dict()
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert not lazynn.is_lazy(ours[key]), key
        assert ours[key].shape == value.shape, key
        assert torch.equal(ours[key], value), key


EXAMPLE = torch.randn(4, 5, generator=torch.Generator().manual_seed(9))


# --- safetensors ------------------------------------------------------------------------------


def test_safetensors_file_loads_into_unbuilt_and_built_models(tmp_path: Path) -> None:
    st = need("safetensors.torch")
    torch.manual_seed(0)
    source = eager_mlp()
    st.save_file(source.state_dict(), tmp_path / "weights.safetensors")
    loaded = st.load_file(tmp_path / "weights.safetensors")
    unbuilt = lazy_mlp()
    unbuilt.load_state_dict(loaded)
    assert not lazynn.is_lazy(unbuilt)
    assert_same_state(unbuilt, source)
    built = lazy_mlp()
    built(EXAMPLE)
    built.load_state_dict(loaded)
    assert_same_state(built, source)


def test_safetensors_model_roundtrip_into_unbuilt_and_built_models(tmp_path: Path) -> None:
    st = need("safetensors.torch")
    torch.manual_seed(0)
    source = lazy_mlp()
    lazynn.build(source, EXAMPLE)
    st.save_model(source, str(tmp_path / "model.safetensors"))
    for built_first in (False, True):
        target = lazy_mlp()
        if built_first:
            target(EXAMPLE)
        state = torch.get_rng_state()
        missing, unexpected = st.load_model(target, str(tmp_path / "model.safetensors"))
        assert (list(missing), list(unexpected)) == ([], [])
        assert_same_state(target, source)
        if not built_first:  # a checkpoint builds an unbuilt model without drawing
            assert torch.equal(torch.get_rng_state(), state)


def test_safetensors_save_model_of_an_unbuilt_model_is_refused_with_the_recipe(
    tmp_path: Path,
) -> None:
    st = need("safetensors.torch")
    with pytest.raises(
        lazynn.UnbuiltError, match=r"saving the state_dict of an unbuilt model"
    ) as e:
        st.save_model(lazy_mlp(), str(tmp_path / "model.safetensors"))
    assert "lazynn.build(model, example)" in str(e.value)
    assert not (tmp_path / "model.safetensors").exists()


# --- accelerate -------------------------------------------------------------------------------


def test_accelerate_init_empty_weights_places_lazy_layers_as_eager_ones() -> None:
    """Parameters where accelerate sends them (meta), buffers not, for lazy and eager alike;
    then build and materialize give the eager twin's numbers."""
    accelerate = need("accelerate")
    torch.manual_seed(0)
    with accelerate.init_empty_weights():
        model = lazy_mlp()
        eager_under = eager_mlp()
    for name, tensor in model.named_parameters():
        assert tensor.is_meta, name
    for name, tensor in model.named_buffers():
        assert not tensor.is_meta, name
    placements = {k: v.device for k, v in eager_under.state_dict().items()}
    lazynn.build(model, EXAMPLE)
    assert {k: v.device for k, v in model.state_dict().items()} == placements
    lazynn.materialize(model, "cpu")
    torch.manual_seed(0)
    assert_same_state(model, eager_mlp())


def test_accelerate_init_on_device_sends_lazy_parameters_there() -> None:
    accelerate = need("accelerate")
    with accelerate.init_on_device(torch.device("meta"), include_buffers=True):
        model = lazy_mlp()
    assert all(t.is_meta for t in model.state_dict().values())


def test_accelerate_load_checkpoint_and_dispatch_after_build_on_meta(tmp_path: Path) -> None:
    accelerate = need("accelerate")
    st = need("safetensors.torch")
    torch.manual_seed(0)
    source = eager_mlp()
    st.save_model(source, str(tmp_path / "model.safetensors"))
    with accelerate.init_empty_weights():
        model = lazy_mlp()
    lazynn.build(model, EXAMPLE, device="meta")
    model = accelerate.load_checkpoint_and_dispatch(
        model, str(tmp_path / "model.safetensors"), device_map={"": "cpu"}
    )
    assert_same_state(model, source)
    assert torch.equal(model.eval()(EXAMPLE), source.eval()(EXAMPLE))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, backward: Any) -> list[float]:
    data = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(3):
        x, y = torch.randn(8, 5, generator=data), torch.randn(8, 2, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_accelerate_prepare_trains_an_unbuilt_model_and_its_state_reloads(tmp_path: Path) -> None:
    accelerate = need("accelerate")
    torch.manual_seed(0)
    model = lazy_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # before the first call
    accelerator = accelerate.Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = _train(model, optimizer, accelerator.backward)
    torch.manual_seed(0)
    plain = lazy_mlp()  # the same model trained without accelerate: the same losses
    plain_optimizer = torch.optim.Adam(plain.parameters(), lr=1e-2)
    assert _train(plain, plain_optimizer, lambda loss: loss.backward()) == losses
    assert_same_state(model, plain)
    accelerator.save_state(str(tmp_path / "state"))

    fresh = lazy_mlp()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    other = accelerate.Accelerator(cpu=True)
    fresh, fresh_optimizer = other.prepare(fresh, fresh_optimizer)
    other.load_state(str(tmp_path / "state"))
    assert_same_state(fresh, model)
    ours, theirs = fresh_optimizer.state_dict()["state"], optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for key in theirs:
        for name, value in theirs[key].items():
            assert torch.equal(ours[key][name], value), (key, name)
    assert _train(fresh, fresh_optimizer, other.backward) == _train(
        model, optimizer, accelerator.backward
    )


# --- Lightning --------------------------------------------------------------------------------


def _lightning_module(lightning: ModuleType) -> type[Any]:
    class Net(lightning.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self, hidden: int = 8, example: bool = False) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(
                lazynn.LazyLinear(hidden), nn.ReLU(), lazynn.LazyBatchNorm1d(), lazynn.LazyLinear(2)
            )
            if example:
                self.example_input_array = torch.zeros(4, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-2)  # before the first forward

    return Net


def _trainer(lightning: ModuleType, root: Path) -> Any:
    return lightning.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


@pytest.mark.slow
def test_lightning_fit_checkpoint_and_load_into_an_unbuilt_module(tmp_path: Path) -> None:
    lightning = need("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    net = _lightning_module(lightning)
    data = TensorDataset(torch.randn(64, 5), torch.randn(64, 2))
    torch.manual_seed(0)
    model = net()
    before = [p for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own notices (workers, deprecations)
        trainer = _trainer(lightning, tmp_path)
        trainer.fit(model, DataLoader(data, batch_size=16))
    assert not lazynn.is_lazy(model)
    assert [p for p in model.parameters()] == before  # the optimizer trained these objects
    assert trainer.global_step == 8
    path = tmp_path / "final.ckpt"
    trainer.save_checkpoint(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = net.load_from_checkpoint(str(path))
    assert not lazynn.is_lazy(loaded)
    assert_same_state(loaded, model)


def test_lightning_model_summary_counts_with_example_input_array() -> None:
    lightning = need("lightning")
    from lightning.pytorch.utilities.model_summary import ModelSummary

    net = _lightning_module(lightning)
    with_example = net(example=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted = ModelSummary(with_example, max_depth=-1)
        total = counted.total_parameters
    expected = lazynn.summary(net(), (4, 5)).total_parameters
    assert total == expected == 5 * 8 + 8 + 8 + 8 + 8 * 2 + 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "may be inaccurate ... set example_input_array"
        assert ModelSummary(net(), max_depth=-1).total_parameters == 0  # documented


# --- torchinfo --------------------------------------------------------------------------------


def _cnn() -> nn.Sequential:
    return nn.Sequential(
        lazynn.LazyConv2d(4, 3),
        nn.ReLU(),
        lazynn.LazyBatchNorm2d(),
        nn.Flatten(),
        lazynn.LazyLinear(3),
    )


@pytest.mark.parametrize("built_first", [False, True], ids=["unbuilt", "built"])
def test_torchinfo_counts_equal_lazynn_summary(built_first: bool) -> None:
    torchinfo = need("torchinfo")
    model = _cnn()
    if built_first:
        lazynn.build(model, (2, 3, 8, 8))
    ours = lazynn.summary(_cnn(), (2, 3, 8, 8))
    theirs = torchinfo.summary(model, input_size=(2, 3, 8, 8), verbose=0)
    assert theirs.total_params == ours.total_parameters
    assert theirs.trainable_params == ours.trainable_parameters
    assert not lazynn.is_lazy(model)
    names = [layer.class_name for layer in theirs.summary_list]
    # (unbuilt, torchinfo's pre-hook runs after the build hook, as with torch's lazy modules)
    expected = ["Conv2d", "BatchNorm2d", "Linear"]
    assert [n for n in names if n.startswith(("Lazy", "Conv", "Batch", "Linear"))] == expected


class _Tied(nn.Module):
    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.proj = lazynn.LazyLinear(8) if lazy else nn.Linear(8, 8)
        self.proj2 = lazynn.LazyLinear(8) if lazy else nn.Linear(8, 8)
        self.proj2.weight = self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj2(self.proj(x))  # type: ignore[no-any-return]


def test_safetensors_tied_lazy_weights_load_with_strict_false(tmp_path: Path) -> None:
    """safetensors saves one name of a tied weight, and finds ties by storage pointers, which
    an unbuilt model does not have: with strict=False the unbuilt model builds, tie and all,
    and reports the other name missing, as load_state_dict of that file does (documented)."""
    st = need("safetensors.torch")
    source = _Tied(lazy=False)
    st.save_model(source, str(tmp_path / "tied.safetensors"))
    target = _Tied(lazy=True)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"proj2.weight\""):
        st.load_model(target, str(tmp_path / "tied.safetensors"))
    assert not lazynn.is_lazy(target)  # (safetensors loads first, then checks the names)
    target = _Tied(lazy=True)
    missing, _ = st.load_model(target, str(tmp_path / "tied.safetensors"), strict=False)
    assert set(missing) == {"proj2.weight"}
    assert target.proj.weight is target.proj2.weight
    assert_same_state(target, source)


def test_accelerate_init_empty_weights_takes_a_tie_between_placeholders() -> None:
    """accelerate rebuilds a parameter assigned under init_empty_weights as
    ``type(p)(p.to(meta), **p.__dict__)``: a placeholder takes that form (as for eager
    parameters, the rebuilt one is a new object: re-tie after, as transformers does)."""
    accelerate = need("accelerate")
    with accelerate.init_empty_weights():
        model = _Tied(lazy=True)
    assert isinstance(model.proj2.weight, lazynn.UninitializedParameter)
    assert model.proj2.weight.device.type == "meta"
    assert model.proj2.weight._lazynn_owner == model.proj.weight._lazynn_owner
    lazynn.build(model, (2, 8))
    assert {p.device.type for p in model.parameters()} == {"meta"}
