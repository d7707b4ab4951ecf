"""Concurrent first calls: one materialization, no crash, every caller gets the right output.

Spec (item 7 of the issue): threads that make the first call at once (released together by a
``threading.Barrier``) build the layer exactly once; all of them get outputs equal to each
other and to the eager twin's under the same seed, and the parameters are the original
placeholder objects.

"Exactly once" is checked two ways: the eager class's ``reset_parameters`` runs once on real
(non-meta) tensors, and the global RNG advances exactly as much as constructing the eager twin
does (a second materialization would draw more random numbers).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from registry import ROWS, has_parameters, lazy_tensors

TRIALS = 200
THREADS = 4


def race(fn: Callable[[Any], Any], inputs: list[Any]) -> list[Any]:
    """Run ``fn(inputs[i])`` in one thread each, all released at once; results or exceptions."""
    barrier = threading.Barrier(len(inputs), timeout=30)
    results: list[Any] = [None] * len(inputs)

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(inputs[i])
        except BaseException as error:  # reported by the test, in the main thread
            results[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread is stuck (deadlock in the build?)"
    return results


def tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


#: (class, method) that initializes a layer's parameters at its construction, for eager
#: classes whose own ``reset_parameters`` is not it (the count is compared with the eager
#: construction's): a transformer layer initializes in __init__, through its
#: MultiheadAttentions' ``_reset_parameters`` (one for an encoder layer, two for a decoder
#: layer); the losses through their nn.Linear projections (AdaptiveLogSoftmaxWithLoss's
#: reset_parameters is not called at construction)
INIT_METHODS: dict[type[nn.Module], tuple[type[nn.Module], str]] = {
    nn.TransformerEncoderLayer: (nn.MultiheadAttention, "_reset_parameters"),
    nn.TransformerDecoderLayer: (nn.MultiheadAttention, "_reset_parameters"),
    nn.MultiheadAttention: (nn.MultiheadAttention, "_reset_parameters"),
    nn.Transformer: (nn.Transformer, "_reset_parameters"),
    nn.AdaptiveLogSoftmaxWithLoss: (nn.Linear, "reset_parameters"),
    nn.LinearCrossEntropyLoss: (nn.Linear, "reset_parameters"),
}


def count_real_inits(monkeypatch: pytest.MonkeyPatch, eager: type[nn.Module]) -> list[int]:
    """Count ``eager.reset_parameters`` calls (or INIT_METHODS') on real tensors (meta
    constructions don't count). A class with neither (a pool) initializes nothing: none."""
    cls, method = INIT_METHODS.get(eager, (eager, "reset_parameters"))
    calls: list[int] = []
    if not hasattr(cls, method):
        return calls
    original = getattr(cls, method)

    def counting(self: nn.Module) -> None:
        if not any(t.is_meta for t in tensors_of(self).values()):
            calls.append(1)
        original(self)

    monkeypatch.setattr(cls, method, counting)
    return calls


def assert_built_plain(module: nn.Module, eager_cls: type[nn.Module]) -> None:
    assert type(module) is eager_cls
    assert not module._forward_pre_hooks
    assert not [k for k in vars(module) if k.startswith("_lazynn")]


def test_concurrent_first_call_every_layer() -> None:
    """200 trials x 4 threads, cycling through every row of the registry."""
    for trial in range(max(TRIALS, 2 * len(ROWS))):
        row = ROWS[trial % len(ROWS)]
        x = row.example()
        with pytest.MonkeyPatch.context() as mp:
            inits = count_real_inits(mp, row.eager)
            torch.manual_seed(trial)
            eager = row.new_eager(row.simple, row.simple_size).eval()
            rng_after_eager = torch.get_rng_state()
            eager_inits = len(inits)
            inits.clear()
            expected = row.call(eager, x)

            torch.manual_seed(trial)
            lazy = row.lazy(**row.simple).eval()
            names = list(tensors_of(lazy))
            before = lazy_tensors(lazy)
            results = race(functools.partial(row.call, lazy), [x] * THREADS)
            rng_after_lazy = torch.get_rng_state()

        where = f"trial {trial}, {row.id}"
        for r in results:
            assert isinstance(r, torch.Tensor), f"{where}: {r!r}"
            assert torch.equal(r, expected), where
        assert eager_inits >= 1 or not has_parameters(row), where
        assert len(inits) == eager_inits, f"{where}: {len(inits)} materializations"
        assert torch.equal(rng_after_lazy, rng_after_eager), f"{where}: RNG drawn more than once"
        after = tensors_of(lazy)
        assert list(after) == names, where
        assert all(after[k] is before[k] for k in before), f"{where}: placeholders replaced"
        assert_built_plain(lazy, row.eager)
        for key, value in eager.state_dict().items():
            assert torch.equal(lazy.state_dict()[key], value), f"{where}: {key}"


def lazy_model() -> nn.Module:
    return nn.Sequential(
        lazynn.LazyConv2d(4, 3),
        nn.ReLU(),
        lazynn.LazyBatchNorm2d(),
        nn.Flatten(),
        lazynn.LazyLinear(3),
    ).eval()


def eager_model() -> nn.Module:
    """The eager twin of ``lazy_model()`` built on a (2, 2, 6, 6) input."""
    return nn.Sequential(
        nn.Conv2d(2, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    ).eval()


def test_concurrent_first_call_nested_model() -> None:
    """Several lazy layers in one model, each raced by every thread in turn."""
    x = torch.randn(2, 2, 6, 6)
    for trial in range(50):
        torch.manual_seed(trial)
        lazy = lazy_model()
        placeholders = lazy_tensors(lazy)
        assert set(tensors_of(lazy)) - set(placeholders) == {"2.num_batches_tracked"}
        results = race(lazy, [x] * THREADS)
        torch.manual_seed(trial)
        eager = eager_model()
        expected = eager(x)
        for r in results:
            assert isinstance(r, torch.Tensor), f"trial {trial}: {r!r}"
            assert torch.equal(r, expected), f"trial {trial}"
        assert all(tensors_of(lazy)[k] is t for k, t in placeholders.items())
        assert not lazynn.is_lazy(lazy)
        for i in (0, 2, 4):
            assert_built_plain(lazy[i], type(eager[i]))


def test_concurrent_good_and_bad_first_inputs() -> None:
    """Half the threads pass a wrong-rank input: they fail cleanly, the others build once."""
    good, bad = torch.randn(2, 5), torch.tensor(1.0)  # nn.Linear needs rank >= 1
    for trial in range(50):
        torch.manual_seed(trial)
        eager = nn.Linear(5, 3)
        rng_after_eager = torch.get_rng_state()
        torch.manual_seed(trial)
        lazy = lazynn.LazyLinear(3)
        inputs = [good, bad] * (THREADS // 2)
        results = race(lazy, inputs)
        assert torch.equal(torch.get_rng_state(), rng_after_eager), f"trial {trial}"
        for x, r in zip(inputs, results, strict=True):
            if x is good:
                assert isinstance(r, torch.Tensor), f"trial {trial}: {r!r}"
                assert torch.equal(r, eager(good)), f"trial {trial}"
            elif isinstance(r, lazynn.InferenceError):  # it came first: refused by lazynn
                assert "LazyLinear" in str(r)
            else:  # the layer was already built: refused by nn.Linear itself
                assert isinstance(r, RuntimeError), r
                assert not isinstance(r, lazynn.LazynnError), r
        assert_built_plain(lazy, nn.Linear)
        assert torch.equal(lazy.weight, eager.weight)
        assert torch.equal(lazy.bias, eager.bias)
