"""One init program, every door: the eager model's numbers wherever doors combine.

Each test is a case where a door (build, build on meta then materialize, a checkpoint, a
first call, copies, pickles) combined with another, or with real init code, gave other
numbers, dropped work or failed; each asserts equality with the eager model (every parameter
and buffer, the generator after) or the error it now gives. Real-shaped models through every
door: tests/building/test_real_models.py.
"""

from __future__ import annotations

import copy
import functools
import gc
import io
import math
import pickle
import random
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import lazynn

X = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))


def _through(door: str, factory: Any) -> nn.Module:
    """``factory``'s model built on X through ``door``: ``build``, or ``build`` on meta then
    ``materialize`` on the CPU."""
    if door == "build":
        return lazynn.build(factory, X)
    return lazynn.materialize(lazynn.build(factory, X, device="meta"), "cpu")


def same_state(a: nn.Module, b: nn.Module) -> bool:
    """Every parameter and buffer (non-persistent too) of ``a`` equals ``b``'s, by name."""
    mine = {**dict(a.named_parameters()), **dict(a.named_buffers())}
    theirs = {**dict(b.named_parameters()), **dict(b.named_buffers())}
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


# --- kept initializations, through every door (case 2) ----------------------------------------


def _kept(lazy: bool) -> nn.Sequential:
    first = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
    second = lazynn.LazyLinear(3) if lazy else nn.Linear(4, 3)
    model = nn.Sequential(first, nn.ReLU(), second)
    nn.init.normal_(model[0].weight, std=0.02)
    model[2].bias.data.fill_(0.5)
    return model


@pytest.mark.parametrize("door", ["build", "meta+materialize", "partial assign load"])
def test_kept_initializations_hold_through_every_door(door: str) -> None:
    torch.manual_seed(0)
    eager = _kept(False)
    after = torch.rand(2)
    torch.manual_seed(0)
    model = _kept(True)
    if door == "build":
        lazynn.build(model, X)
    else:
        lazynn.build(model, X, device="meta")
        if door == "partial assign load":
            loaded = {"0.weight": eager[0].weight.detach().clone()}
            model.load_state_dict(loaded, strict=False, assign=True)
        lazynn.materialize(model, "cpu")
    assert same_state(model, eager)
    assert torch.equal(torch.rand(2), after)


class _Interleaved(nn.Module):
    """Work written on a lazy layer in ``__init__`` between its construction and an eager
    layer's: eager code draws it before the eager layer's numbers; the instance form's build
    runs it before re-initializing that layer. A block deep-copied after its work was queued
    (``[deepcopy(block) for ...]``): eager code ran it once, then copied."""

    def __init__(self, how: str, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        if how == "kept init":
            nn.init.normal_(self.a.weight)
        elif lazy:
            lazynn.on_build(self.a, lambda m: nn.init.normal_(m.weight))
        else:
            nn.init.normal_(self.a.weight)
        self.mid = nn.Linear(4, 4)  # (eager, before the next lazy layer)
        block = nn.Sequential(lazynn.LazyLinear(3) if lazy else nn.Linear(4, 3))
        if how == "copies" and lazy:
            lazynn.on_build(block, lambda m: nn.init.uniform_(m[0].weight))
        elif how == "copies":
            nn.init.uniform_(block[0].weight)
        self.copies = nn.ModuleList([copy.deepcopy(block) for _ in range(3)])
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.a(x))
        return self.b(sum(c(h) for c in self.copies))  # type: ignore[no-any-return]


def _built_as_eager(
    make: Callable[[bool], nn.Module], door: str, example: Any = X, silent: bool = False
) -> None:
    """``make(lazy=True)`` built through ``door`` ("build", "meta+materialize", "threads=2")
    under one seed equals ``make(lazy=False)``, and the generator ends where the eager
    construction left it; ``silent``: with no warning (a warning says a build is not exact)."""
    torch.manual_seed(0)
    eager = make(False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = make(True)
    with warnings.catch_warnings():
        if silent:
            warnings.simplefilter("error")
        if door == "threads=2":
            lazynn.build(model, example, threads=2)
        else:
            lazynn.build(model, example, device="meta" if door == "meta+materialize" else None)
    if door == "meta+materialize":
        lazynn.materialize(model, "cpu")
    assert same_state(model, eager)
    assert torch.equal(torch.get_rng_state(), after)


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
@pytest.mark.parametrize("how", ["kept init", "queued", "copies"])
def test_work_written_between_constructions_runs_where_eager_ran_it(how: str, door: str) -> None:
    _built_as_eager(functools.partial(_Interleaved, how), door, silent=True)


class _ZeroResidual(nn.Module):
    """(Found by review.) Blocks whose queued work zero-inits their own BatchNorm, which draws
    nothing at its construction; the root's queued init writes a LayerNorm (the documented
    ``on_build(model, lambda m: m.apply(init))``); a block with a kept init deep-copied
    before an eager layer; an in-place step with a tensor argument."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.stem = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        self.blocks = nn.ModuleList()
        for _ in range(2):
            block = nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4))
            block.append(nn.BatchNorm1d(4))
            self._queue(lazy, block, lambda m: nn.init.zeros_(m[1].weight))
            self.blocks.append(block)
        copied = nn.Sequential(lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4))
        nn.init.normal_(copied[0].weight)
        copied[0].weight.data.mul_(torch.full((4, 1), 2.0))
        self.copies = nn.ModuleList([copy.deepcopy(copied) for _ in range(2)])
        self.norm = nn.LayerNorm(4)
        self._queue(lazy, self, lambda m: m.apply(_half_norms))
        self.head = nn.Linear(4, 2)

    @staticmethod
    def _queue(lazy: bool, module: nn.Module, fn: Any) -> None:
        if lazy:
            lazynn.on_build(module, fn)
        else:
            fn(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        h = sum(c(h) for c in self.copies)
        return self.head(self.norm(h))  # type: ignore[no-any-return]


def _half_norms(module: nn.Module) -> None:
    if isinstance(module, nn.LayerNorm):
        nn.init.constant_(module.weight, 0.5)


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_work_on_layers_that_draw_nothing_is_not_undone_by_their_reinitialization(
    door: str,
) -> None:
    _built_as_eager(_ZeroResidual, door, silent=True)


class _Forked(nn.Module):
    """(Found by review.) An initialization written in ``torch.random.fork_rng()`` after a
    ``manual_seed``, kept and queued: eager code drew it from that seed, and the stream went
    back after it."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        self.b = lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4)
        with torch.random.fork_rng():
            torch.manual_seed(1)
            nn.init.normal_(self.a.weight)
            if lazy:
                lazynn.on_build(self.b, lambda m: nn.init.normal_(m.weight))
            else:
                nn.init.normal_(self.b.weight)
        self.mid = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mid(self.b(self.a(x)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize", "threads=2"])
def test_work_written_under_fork_rng_draws_from_the_state_it_was_written_at(door: str) -> None:
    _built_as_eager(_Forked, door)


class _TorchLazyAfterANorm(nn.Module):
    """(Found by review.) torch's own lazy layer after a LayerNorm, and a kept init written
    after it: the replay moves the LayerNorm (it draws nothing) before the lazy layers at its
    state; torch's layer stays after the lazy layer before it."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        self.norm = nn.LayerNorm(4)
        self.t = nn.LazyLinear(3) if lazy else nn.Linear(4, 3)
        nn.init.normal_(self.a.weight)
        self.mid = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mid(self.t(self.norm(self.a(x))))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_torch_lazy_layers_keep_their_place_among_layers_that_draw_nothing(door: str) -> None:
    _built_as_eager(_TorchLazyAfterANorm, door)


class _Halved(nn.Module):
    """(Found by review.) Work written on a lazy layer, then ``self.half()`` at the end of
    ``__init__``: eager code initialized in float32, then converted."""

    def __init__(self, how: str, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        if how == "queued" and lazy:
            lazynn.on_build(self.a, lambda m: nn.init.normal_(m.weight))
        else:
            nn.init.normal_(self.a.weight)
        self.m = nn.Linear(4, 4)
        self.half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(self.a(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
@pytest.mark.parametrize("how", ["kept init", "queued"])
def test_work_written_before_a_dtype_move_runs_in_the_dtype_it_was_written_in(
    how: str, door: str
) -> None:
    half = lazynn.Spec((2, 5), torch.float16)
    _built_as_eager(functools.partial(_Halved, how), door, example=half)


class _RootQueuedMidway(nn.Module):
    """Work queued on the whole model between a lazy layer and an eager one: eager code ran
    it there, on the model built so far; the model is built only at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4)
        lazynn.on_build(self, lambda m: nn.init.normal_(m.a.weight))
        self.mid = nn.Linear(4, 4)
        self.b = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.mid(self.a(x)))  # type: ignore[no-any-return]


def test_queued_work_that_cannot_run_where_eager_ran_it_warns_naming_it() -> None:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="on_build on the model was written before an eager"):
        lazynn.build(_RootQueuedMidway(), X)


# --- zero_module: writes through p.detach() (case 3) -------------------------------------------


def zero_module(module: nn.Module) -> nn.Module:
    """improved-diffusion's, as Stable Diffusion and ControlNet write it."""
    for p in module.parameters():
        p.detach().zero_()
    return module


@pytest.mark.parametrize("door", ["build", "first call"])
def test_zero_module_writes_through_detach_on_an_unbuilt_layer(door: str) -> None:
    images = torch.randn(2, 3, 8, 8)
    layer = zero_module(lazynn.LazyConv2d(4, 3))
    if door == "build":
        lazynn.build(layer, images)
    else:
        layer(images)
    assert layer.weight.count_nonzero() == 0
    assert layer.bias.count_nonzero() == 0


# --- a meta-built model wrapped, copied, pickled, or built under torch.device (case 4) ----------


class _XavierNet(nn.Module):
    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        nn.init.xavier_uniform_(self.fc.weight)  # (needs the shape: the factory form)
        nn.init.zeros_(self.fc.bias)
        # (steps that name a memory format, which torch.save's pickle protocol cannot keep:
        # Swin's and EVA-02's relative-position tables are made so)
        self.register_buffer("index", torch.arange(4.0).view(2, 2).t().contiguous())
        images = torch.randn(1, 2, 3, 3).contiguous(memory_format=torch.channels_last)
        self.register_buffer("images", images)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


def _saved(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["wrapped", "deepcopy", "pickled", "torch.save", "device ctx"])
def test_a_meta_built_model_keeps_its_init_programs_wherever_it_goes(how: str) -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(_XavierNet(lazy=False))
    torch.manual_seed(0)
    if how == "device ctx":
        with torch.device("meta"):
            built = lazynn.build(_XavierNet, X)
    else:
        built = lazynn.build(_XavierNet, X, device="meta")
    model = {
        "wrapped": lambda m: m,
        "deepcopy": copy.deepcopy,
        "pickled": lambda m: pickle.loads(pickle.dumps(m)),
        "torch.save": _saved,
        "device ctx": lambda m: m,
    }[how](built)
    model = nn.Sequential(model)
    assert all(t.is_meta for t in model.parameters())
    lazynn.materialize(model, "cpu")
    assert same_state(model, eager)
    assert model[0].images.is_contiguous(memory_format=torch.channels_last)


# --- partial writes: never uninitialized memory (case 5) -----------------------------------


class _RowZero(nn.Module):
    """An initializer that writes one row: the others keep what ``__init__`` gave them."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3, 4))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.w[0].normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Assigns(nn.Module):
    """An initializer that replaces its tensor's data."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(3, 4))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.w.data = torch.randn(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("kind", [_RowZero, _Assigns])
def test_an_initializer_writing_part_of_a_tensor_or_replacing_it_gives_the_eager_values(
    kind: type[nn.Module],
) -> None:
    """Replayed after a lazy layer (the instance form), on meta then materialized."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4), kind())
    after = torch.rand(2)
    torch.manual_seed(0)
    model = lazynn.build(nn.Sequential(lazynn.LazyLinear(4), kind()), X, device="meta")
    lazynn.materialize(model, "cpu")
    assert same_state(model, eager)
    assert torch.equal(torch.rand(2), after)


def test_a_meta_made_model_whose_initializer_writes_part_of_a_tensor_is_refused() -> None:
    with torch.device("meta"):
        model = nn.Sequential(_RowZero())
    with pytest.raises(lazynn.LazynnError, match=r"'0\.w'.*written in part"):
        lazynn.materialize(model, "cpu")
    assert model[0].w.is_meta


def test_a_program_that_leaves_part_of_an_empty_tensor_unwritten_is_refused() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(4)
            self.w = nn.Parameter(torch.empty(3, 4))
            with torch.no_grad():
                self.w[0].normal_()  # (rows 1.. are whatever memory holds, in eager too)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    model = lazynn.build(Net, X, device="meta")
    with pytest.raises(lazynn.LazynnError, match=r"only in part.*'w'"):
        lazynn.materialize(model, "cpu")
    assert model.w.is_meta


# --- code in __init__ that moves generators, and work queued there (cases 6, 7) ---------------

_PRIVATE = torch.Generator().manual_seed(7)


class _Sideways(nn.Module):
    """Init code that reseeds, draws on the CPU explicitly, queues work, and draws from
    numpy, Python's random and a private generator."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        torch.manual_seed(5)
        self.b = lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4)
        self.register_buffer("noise", torch.randn(4, device="cpu"))
        self.c = lazynn.LazyLinear(3) if lazy else nn.Linear(4, 3)
        if lazy:
            lazynn.on_build(self.c, lambda m: nn.init.normal_(m.weight))
        else:
            nn.init.normal_(self.c.weight)
        self.d = lazynn.LazyLinear(3) if lazy else nn.Linear(3, 3)
        self.emb = nn.Parameter(torch.from_numpy(np.random.randn(3, 2)).float())
        self.coin = random.random()
        self.g = nn.Parameter(torch.randn(2, generator=_PRIVATE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(self.c(self.b(self.a(x))))  # type: ignore[no-any-return]


def _seeded() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    _PRIVATE.manual_seed(7)


def _states() -> tuple[torch.Tensor, np.ndarray, object, torch.Tensor]:
    numpy_state = np.random.get_state()[1].copy()
    return torch.get_rng_state(), numpy_state, random.getstate(), _PRIVATE.get_state()


def _same_states(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return (
        torch.equal(a[0], b[0])  # type: ignore[arg-type]
        and bool((a[1] == b[1]).all())  # type: ignore[attr-defined]
        and a[2] == b[2]
        and torch.equal(a[3], b[3])  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_init_code_that_moves_generators_and_queues_work_gives_the_eager_program(
    door: str,
) -> None:
    _seeded()
    eager = _Sideways(lazy=False)
    after = _states()
    _seeded()
    model = _through(door, _Sideways)
    assert same_state(model, eager)
    assert model.coin == eager.coin
    assert _same_states(_states(), after)


def test_a_summary_of_a_factory_moves_no_generator() -> None:
    _seeded()
    before = _states()
    lazynn.summary(_Sideways, X)
    assert _same_states(_states(), before)


class _Drawing(nn.Module):
    """A forward that reseeds and draws in ways a meta run does not (on the CPU, through
    torch.distributions, Python's random: LayerDrop)."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(3)
        ones = torch.ones(2, device="cpu")
        torch.binomial(ones, torch.full((2,), 0.5, device="cpu"))
        torch.distributions.Gamma(ones, ones).sample()
        if random.random() < 0.5:  # (LayerDrop)
            x = x * 1.0
        return self.fc(x)  # type: ignore[no-any-return]


def test_a_forward_that_moves_generators_is_built_and_summarized_as_eager() -> None:
    _seeded()
    eager = _Drawing(lazy=False)
    after = _states()
    _seeded()
    model = lazynn.build(_Drawing, X)
    assert same_state(model, eager)
    assert _same_states(_states(), after)
    _seeded()
    before = _states()
    lazynn.summary(_Drawing, X)
    assert _same_states(_states(), before)


# --- kept initializations: any in-place step, moves, pickles, generators (cases 9, 12, 21) -----


def _timm_trunc_normal_(tensor: torch.Tensor, std: float = 0.02) -> torch.Tensor:
    """timm's own ``trunc_normal_`` (``layers/weight_init.py``), as older models carry it."""
    with torch.no_grad():
        low, high = (
            (1.0 + math.erf(-2.0 / 2**0.5)) / 2.0,
            (1.0 + math.erf(2.0 / 2**0.5)) / 2.0,
        )
        tensor.uniform_(2 * low - 1, 2 * high - 1)
        tensor.erfinv_()
        tensor.mul_(std * 2**0.5)
        tensor.add_(0.0)
        tensor.clamp_(min=-2.0, max=2.0)
    return tensor


def _in_place_init(lazy: bool) -> nn.Sequential:
    model = nn.Sequential(
        lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4),
        lazynn.LazyLinear(6) if lazy else nn.Linear(4, 6),
    )
    _timm_trunc_normal_(model[0].weight)
    inv_dt = torch.linspace(1e-3, 0.1, 6)  # (Mamba's dt_proj: a real tensor copied in)
    with torch.no_grad():
        model[1].bias.copy_(inv_dt + torch.log(-torch.expm1(-inv_dt)))
        model[1].weight.div_(2.0)  # (GPT-2's residual rescaling)
        model[1].weight[0] = 1.0
        model[0].bias *= 0.5
    return model


@pytest.mark.parametrize("door", ["build", "meta+materialize", "first call"])
def test_any_in_place_step_on_an_unbuilt_placeholder_is_kept(door: str) -> None:
    torch.manual_seed(0)
    eager = _in_place_init(lazy=False)
    torch.manual_seed(0)
    model = _in_place_init(lazy=True)
    if door == "first call":  # (layer by layer, in call order, as torch's: only what is kept)
        model(X)
        assert torch.equal(model[1].bias, eager[1].bias)
        assert torch.equal(model[1].weight[0], eager[1].weight[0])  # (halved, then set)
        assert model[0].weight.abs().max() <= 2 * 0.02 * 2**0.5  # (truncated)
        return
    if door == "build":
        lazynn.build(model, X)
    else:
        lazynn.materialize(lazynn.build(model, X, device="meta"), "cpu")
    assert same_state(model, eager)


def test_a_kept_initialization_runs_in_the_dtype_the_layer_was_made_in() -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 4))
    nn.init.normal_(eager[0].weight)
    eager.double()
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(4))
    nn.init.normal_(model[0].weight)
    model.double()
    lazynn.build(model, X.double())
    assert same_state(model, eager)
    assert model[0].weight.dtype == torch.float64


def test_a_kept_initialization_from_a_generator_that_drew_since_warns() -> None:
    generator = torch.Generator().manual_seed(1)
    model = nn.Sequential(lazynn.LazyLinear(4))
    nn.init.normal_(model[0].weight, generator=generator)
    torch.randn(3, generator=generator)  # (the eager program drew its numbers before this)
    with pytest.warns(UserWarning, match="drawn since it was written"):
        model(X)


def test_a_set_on_a_placeholder_is_kept() -> None:
    layer = lazynn.LazyLinear(4)
    with torch.no_grad():
        layer.bias.set_(torch.ones(4))
    layer(X)
    assert torch.equal(layer.bias, torch.ones(4))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_kept_initializations_survive_a_pickle_of_an_unbuilt_model(how: str) -> None:
    model = nn.Sequential(lazynn.LazyLinear(4))
    nn.init.constant_(model[0].weight, 0.5)
    copied = pickle.loads(pickle.dumps(model)) if how == "pickle" else _saved(model)
    copied(X)
    assert torch.equal(copied[0].weight, torch.full((4, 5), 0.5))


# --- loaded values win; attributes kept; a second materialize (cases 10, 11, 14) --------------


def _zero_init(module: nn.Module) -> None:
    for p in module.parameters():
        nn.init.zeros_(p)


def _checkpoint() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    source = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    return source, {k: v.detach().clone() for k, v in source.state_dict().items()}


def test_queued_work_runs_before_an_assign_load_of_a_meta_built_model() -> None:
    source, checkpoint = _checkpoint()
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(3))
    lazynn.on_build(model, _zero_init)
    lazynn.build(model, X, device="meta")
    model.load_state_dict(checkpoint, assign=True)
    lazynn.materialize(model, "cpu")
    assert same_state(model, source)  # (the eager program: construct, zero, load)


class _QueuesInInit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = lazynn.LazyLinear(4)
        self.b = lazynn.LazyLinear(3)
        lazynn.on_build(self, _zero_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


def test_queued_work_of_a_factory_runs_before_an_assign_load() -> None:
    source, checkpoint = _checkpoint()
    model = lazynn.build(_QueuesInInit, X, device="meta")
    renamed = {k.replace("0.", "a.").replace("2.", "b."): v for k, v in checkpoint.items()}
    model.load_state_dict(renamed, assign=True)
    lazynn.materialize(model, "cpu")
    assert torch.equal(model.a.weight, source[0].weight)
    assert torch.equal(model.b.bias, source[2].bias)


def test_queued_work_running_after_a_partial_load_keeps_the_loaded_values() -> None:
    source, checkpoint = _checkpoint()
    model = nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), lazynn.LazyLinear(3))
    lazynn.on_build(model, _zero_init)
    partial = {"0.weight": checkpoint["0.weight"], "0.bias": checkpoint["0.bias"]}
    model.load_state_dict(partial, strict=False)
    model(X)  # (builds the rest, then the queue runs: on everything but what was loaded)
    assert torch.equal(model[0].weight, source[0].weight)
    assert model[2].weight.count_nonzero() == 0


class _Tagged(nn.Module):
    """Mamba's ``A_log._no_weight_decay``: a Python attribute on a parameter."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, 4, dtype=torch.float32)))
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # type: ignore[no-any-return]


def test_materialize_keeps_the_python_attributes_set_on_tensors() -> None:
    model = lazynn.materialize(lazynn.build(_Tagged, X, device="meta"), "cpu")
    assert model.A_log._no_weight_decay is True  # type: ignore[attr-defined]
    assert torch.equal(model.A_log, torch.log(torch.arange(1, 4, dtype=torch.float32)))


def test_a_second_materialize_changes_nothing_and_draws_nothing() -> None:
    torch.manual_seed(0)
    model = lazynn.materialize(lazynn.build(_Tagged, X, device="meta"), "cpu")
    state, weight = torch.get_rng_state(), model.fc.weight.detach().clone()
    lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(model.fc.weight, weight)


# --- real init code in the factory form: values read, sizes read, ties, helpers (16-20) -------


class _Depth(nn.Module):
    """timm's stochastic-depth line, and other reads of values made in __init__."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, 3)]
        self.widths = torch.tensor([4, 6]).tolist()
        self.scale = float(torch.randn(()))  # a value drawn from the stream, read
        self.flag = bool(torch.rand(()) < 2)
        self.fc = lazynn.LazyLinear(self.widths[0]) if lazy else nn.Linear(5, 4)
        self.gamma = nn.Parameter(torch.full((4,), self.rates[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.gamma * self.scale  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_init_code_that_reads_values_it_made_is_the_eager_program(door: str) -> None:
    torch.manual_seed(0)
    eager = _Depth(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = _through(door, _Depth)
    assert same_state(model, eager)
    assert (model.rates, model.widths, model.scale, model.flag) == (
        eager.rates,
        eager.widths,
        eager.scale,
        eager.flag,
    )
    assert torch.equal(torch.get_rng_state(), after)
    total = sum(p.numel() for p in eager.parameters())
    assert lazynn.summary(_Depth, X).total_parameters == total


class _TiedHead(nn.Module):
    """nanoGPT's tie, with a lazy head: the embedding takes the head's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(10, 8)
        self.head = lazynn.LazyLinear(10, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.wte(idx))  # type: ignore[no-any-return]


def test_a_summary_of_a_factory_with_a_tied_lazy_head_counts_the_tie_once() -> None:
    tokens = lazynn.Spec((2, 3), torch.long)
    built = lazynn.build(_TiedHead, tokens)
    assert built.wte.weight is built.head.weight
    report = lazynn.summary(_TiedHead, tokens)
    assert report.total_parameters == 80 == sum(p.numel() for p in built.parameters())


class _ReadsUnbuilt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = lazynn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.proj.weight.t()


@pytest.mark.parametrize("form", ["factory", "instance", "summary"])
def test_a_forward_reading_a_layer_it_never_called_names_the_layer(form: str) -> None:
    calls = {
        "factory": lambda: lazynn.build(_ReadsUnbuilt, X),
        "instance": lambda: lazynn.build(_ReadsUnbuilt(), X),
        "summary": lambda: lazynn.summary(_ReadsUnbuilt, X),
    }
    before = torch.get_rng_state()
    with pytest.raises(lazynn.InferenceError) as raised:
        calls[form]()
    text = str(raised.value)
    assert text.startswith("LazyLinear at 'proj': ")
    assert "reading the tensors of 'proj' without calling it" in text
    fix = text.split("Fix: ", 1)[1]
    assert "call 'proj' in the forward" in fix
    assert "lazynn.build" not in fix  # (not the call that just failed)
    assert torch.equal(torch.get_rng_state(), before)


class _SizeRead(nn.Module):
    """An eager layer sized from a lazy layer's inferred size, and a parameter from it."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc1 = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
        self.fc2 = nn.Linear(self.fc1.in_features, 8)
        self.fc3 = lazynn.LazyLinear(2) if lazy else nn.Linear(8, 2)
        self.mix = nn.Parameter(torch.randn(self.fc3.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.fc1(x).sum()
        return self.fc3(self.fc2(x) * self.mix) + first  # type: ignore[no-any-return]


class _SizeReadLate(_SizeRead):
    """The same, its forward calling the layer sized from 'fc1' before 'fc1'."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.fc2(x) * self.mix) + self.fc1(x).sum()  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_an_eager_layer_sized_from_a_lazy_layers_size_is_the_eager_model(door: str) -> None:
    torch.manual_seed(0)
    eager = _SizeRead(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = _through(door, _SizeRead)
    assert same_state(model, eager)
    assert torch.equal(torch.get_rng_state(), after)
    total = sum(p.numel() for p in eager.parameters())
    assert lazynn.summary(_SizeRead, X).total_parameters == total


class _SizeFeeds(nn.Module):
    """An eager layer sized from a lazy layer's size, feeding a later lazy layer."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.fc1 = lazynn.LazyLinear(8) if lazy else nn.Linear(5, 8)
        self.proj = nn.Linear(8, self.fc1.in_features)
        self.fc3 = lazynn.LazyLinear(2) if lazy else nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.proj(self.fc1(x)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_a_lazy_layer_fed_by_a_layer_sized_from_a_lazy_size_learns_the_real_size(
    door: str,
) -> None:
    torch.manual_seed(0)
    eager = _SizeFeeds(lazy=False)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    model = _through(door, _SizeFeeds)
    assert same_state(model, eager)
    assert torch.equal(torch.get_rng_state(), after)
    report = lazynn.summary(_SizeFeeds, X)
    assert report.total_parameters == sum(p.numel() for p in eager.parameters())


def test_a_layer_sized_from_a_lazy_layer_the_forward_calls_later_is_explained() -> None:
    with pytest.raises(lazynn.InferenceError) as raised:
        lazynn.build(_SizeReadLate, X)
    text = str(raised.value)
    assert text.startswith("Linear at 'fc2': ")
    assert "'fc1' (in_features=1)" in text
    assert "call it before the layers sized from it" in text


def _norm(channels: int, lazy: bool) -> nn.Module:
    """A norm-layer helper that makes its lazy class each time it is called."""
    if not lazy:
        return nn.GroupNorm(2, channels)
    return lazynn.lazy(nn.GroupNorm, num_channels=lazynn.Infer(dim=1, probe="num_groups"))(2)


class _Helpers(nn.Module):
    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.conv = lazynn.LazyConv1d(4, 1) if lazy else nn.Conv1d(3, 4, 1)
        self.norms = nn.ModuleList([_norm(4, lazy) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for norm in self.norms:
            x = norm(x)
        return x


def test_lazy_classes_made_by_a_helper_on_each_call_are_one_declaration() -> None:
    x = torch.randn(2, 3, 5)
    torch.manual_seed(0)
    eager = _Helpers(lazy=False)
    torch.manual_seed(0)
    model = lazynn.build(_Helpers, x)
    assert same_state(model, eager)
    assert all(type(n) is nn.GroupNorm for n in model.norms)


def test_a_factory_that_constructs_other_eager_layers_each_call_is_refused() -> None:
    calls = [0]

    class Differs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            calls[0] += 1
            self.fc = lazynn.LazyLinear(4)
            self.out = nn.Linear(4 if calls[0] % 2 else 5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.fc(x))  # type: ignore[no-any-return]

    before = torch.get_rng_state()
    with pytest.raises(lazynn.LazynnError) as raised:
        lazynn.build(Differs, X)
    text = str(raised.value)
    assert text.startswith("lazynn.build(factory) at 'out': ")
    assert "'weight': (2, 4)" in text
    assert "'weight': (2, 5)" in text
    assert "construct the same model each time" in text
    assert torch.equal(torch.get_rng_state(), before)


class _Classifier(nn.Module):
    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_a_lazy_layer_passed_in_to_a_factory_is_built_with_a_warning(door: str) -> None:
    backbone = nn.Sequential(lazynn.LazyLinear(6), nn.ReLU())
    factory = functools.partial(_Classifier, backbone=backbone)
    doors = {
        "build": lambda: lazynn.build(factory, X),
        "meta+materialize": lambda: lazynn.materialize(lazynn.build(factory, X, device="meta")),
    }
    with pytest.warns(UserWarning, match=r"'backbone\.0' .* made outside the factory"):
        model = doors[door]()
    assert not lazynn.is_lazy(model)
    assert type(model.backbone[0]) is nn.Linear
    assert model.backbone[0].weight.shape == (6, 5)
    assert model.backbone[0].weight.device.type == "cpu"
    assert model(X).shape == (2, 3)


# --- state: another thread's draws during a summary (case 13) ---------------------------------


def test_a_summary_does_not_rewind_what_another_thread_draws_meanwhile() -> None:
    """Forced interleaving: the factory's construction waits while another thread draws; the
    summary puts no generator back, so that draw stays drawn."""
    entered, drawn = threading.Event(), threading.Event()

    class Waits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(3)
            if not entered.is_set():  # (the first construction only)
                entered.set()
                assert drawn.wait(10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # type: ignore[no-any-return]

    def draw() -> None:
        assert entered.wait(10)
        torch.rand(5)
        drawn.set()

    torch.manual_seed(0)
    other = threading.Thread(target=draw)
    other.start()
    lazynn.summary(Waits, X)
    other.join(10)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    torch.rand(5)  # (the other thread's draw, alone)
    assert torch.equal(after, torch.get_rng_state())


def test_init_code_reseeding_with_the_seed_already_set_is_a_reseed() -> None:
    """``torch.manual_seed(0)`` under seed 0 (the fresh state again) restarts the stream."""

    class Again(nn.Module):
        def __init__(self, lazy: bool = True) -> None:
            super().__init__()
            self.a = lazynn.LazyLinear(4) if lazy else nn.Linear(5, 4)
            torch.manual_seed(0)
            self.b = lazynn.LazyLinear(4) if lazy else nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))  # type: ignore[no-any-return]

    torch.manual_seed(0)
    eager = Again(lazy=False)
    after = torch.get_rng_state()
    for device in (None, "meta"):
        torch.manual_seed(0)
        model = lazynn.build(Again, X, device=device)
        if device == "meta":
            lazynn.materialize(model, "cpu")
        assert same_state(model, eager)
        assert torch.equal(torch.get_rng_state(), after)


# --- transformations that need the weight's values (case 17) ----------------------------------


class _Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        conv = lazynn.LazyConv1d(4, 3)
        # (the instance form's port, which works in the factory form too; the factory form
        # also takes weight_norm(conv) here: tests/building/test_transformations_in_init.py)
        self.conv = conv
        lazynn.on_build(conv, nn.utils.weight_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize", "meta, assign load"])
def test_weight_norm_queued_at_the_build_gives_the_eager_model(door: str) -> None:
    x = torch.randn(2, 3, 10)
    torch.manual_seed(0)
    eager = nn.Sequential(nn.utils.weight_norm(nn.Conv1d(3, 4, 3)))
    after = torch.get_rng_state()
    torch.manual_seed(0)
    factory = _Normed
    if door == "build":
        model = lazynn.build(factory, x)
    else:
        model = lazynn.build(factory, x, device="meta")
        assert sorted(model.conv.state_dict()) == ["bias", "weight_g", "weight_v"]
        if door == "meta, assign load":
            model.conv.load_state_dict(eager[0].state_dict(), assign=True)
        lazynn.materialize(model, "cpu")
    assert torch.equal(torch.get_rng_state(), after)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), eager.parameters(), strict=True)
    )


class _OneGenerator(nn.Module):
    """(Found by review.) One private generator through ``trunc_normal_(generator=g)`` and an
    aten fill: the dispatcher hands each op a new Python object for it."""

    def __init__(self, lazy: bool = True) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.empty(400, 16))
        nn.init.trunc_normal_(self.a, std=1.0, a=-0.6, b=0.6, generator=_PRIVATE)
        self.b = nn.Parameter(torch.empty(20).uniform_(generator=_PRIVATE))
        self.head = lazynn.LazyLinear(7) if lazy else nn.Linear(5, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize("door", ["build", "meta+materialize"])
def test_one_private_generator_is_one_generator_of_the_program(door: str) -> None:
    _seeded()
    eager = _OneGenerator(lazy=False)
    after = _PRIVATE.get_state()
    _seeded()
    if door == "build":
        model = _through(door, _OneGenerator)
    else:
        model = lazynn.build(_OneGenerator, X, device="meta")
        gc.collect()  # (the tape keeps the user's generator, not the dispatcher's stand-in)
        lazynn.materialize(model, "cpu")
    assert same_state(model, eager)
    assert torch.equal(_PRIVATE.get_state(), after)


# --- tensors replaced since the meta build: loaded, or refused (issue 37) ----------------------


def _meta_built() -> nn.Module:
    torch.manual_seed(0)
    return lazynn.build(
        lambda: nn.Sequential(lazynn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 3)), X, device="meta"
    )


@pytest.mark.parametrize("then", ["nothing", "pickled"])
def test_to_empty_then_materialize_is_refused_naming_the_tensors(then: str) -> None:
    """``to_empty`` leaves uninitialized memory where the programs would have given values
    (torchtitan's trainer step): refused, never returned silently; the model unchanged."""
    model = _meta_built()
    model.to_empty(device="cpu")
    if then == "pickled":
        model = pickle.loads(pickle.dumps(model))
    held = [id(t) for t in model.parameters()]
    with pytest.raises(lazynn.LazynnError) as info:
        lazynn.materialize(model)
    text = str(info.value)
    assert "module.to_empty(), which leaves uninitialized memory" in text
    assert "'0.weight', '0.bias', '2.weight', '2.bias'" in text
    assert "Fix: materialize before to_empty" in text
    assert [id(t) for t in model.parameters()] == held


@pytest.mark.parametrize("how", ["in place after to_empty", "assign", "assign after pickle"])
def test_tensors_a_checkpoint_loaded_since_the_meta_build_are_kept(how: str) -> None:
    """A checkpoint loaded into them vouches for their values (loaded values win); a tensor
    tied to a loaded one too. The programs are then spent: the module is plain torch.nn."""
    _, checkpoint = _checkpoint()
    model = _meta_built()
    if how == "in place after to_empty":
        model.to_empty(device="cpu")
        model.load_state_dict(checkpoint)
    else:
        if how == "assign after pickle":
            model = pickle.loads(pickle.dumps(model))
        model.load_state_dict(checkpoint, assign=True)
    lazynn.materialize(model)
    for mine, theirs in zip(model.state_dict().values(), checkpoint.values(), strict=True):
        assert torch.equal(mine, theirs)
    assert all(not m._load_state_dict_pre_hooks for m in model.modules())
    assert all(not any(k.startswith("_lazynn") for k in vars(m)) for m in model.modules())
