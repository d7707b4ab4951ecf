"""training_memory: the meta estimate equals what a real CPU training step holds.

Each model is estimated unbuilt, built on the CPU, and constructed on meta; the reference is
a real CPU step of an eager twin (``lazynn.build(twin, real_example)``): the storages its
forward saves for backward (counted as the estimate counts them: each storage once, its
``untyped_storage().nbytes()``, not the model's own tensors, but here told apart by real data
pointers), its gradients after a real backward, and a real optimizer's state after a real
``step()``.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import lazynn
from lazynn._summary.memory import Memory, training_memory
from paths import EXAMPLES

# (the reference twins are built for real: a mixed model's replay notes are not under test)
pytestmark = pytest.mark.filterwarnings("ignore:lazynn.build:UserWarning")


def _example_models() -> Any:
    name = "lazynn_memory_example_models"
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / "models.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


models = _example_models()


class Tied(nn.Module):
    """Token embedding, a lazy body, a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(lazynn.LazyLinear(16), nn.GELU())
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))  # type: ignore[no-any-return]


def _transformer(dropout: float) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(
        lazynn.LazyLinear(32),
        nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=dropout, batch_first=True),
    )


def _tokens(vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(0))


#: name -> (lazy factory, real example input)
MODELS: dict[str, tuple[Callable[[], nn.Module], torch.Tensor]] = {
    "mlp": (
        lambda: nn.Sequential(lazynn.LazyLinear(32), nn.ReLU(), lazynn.LazyLinear(10)),
        torch.randn(4, 20),
    ),
    "cnn": (
        lambda: nn.Sequential(
            lazynn.LazyConv2d(8, 3),
            lazynn.LazyBatchNorm2d(),
            nn.ReLU(),
            nn.MaxPool2d(2),
            lazynn.LazyConv2d(16, 3, padding=1),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            lazynn.LazyLinear(10),
        ),
        torch.randn(2, 3, 16, 16),
    ),
    # dropout: the math attention kernel on the CPU; no dropout: flash attention
    "transformer_dropout": (_transformer(0.1), torch.randn(2, 10, 12)),
    "transformer_flash": (_transformer(0.0), torch.randn(2, 10, 12)),
    "tied": (Tied, _tokens(50, 2, 7)),
    "example_llama_tiny": (models.LAZY_ONLY["llama_tiny"][0], _tokens(100, 2, 16)),
    "example_cnn": (models.REFERENCE["cnn"].lazy, torch.randn(2, 3, 32, 32)),
}


class Sequence(nn.Module):
    """A recurrent layer (its output sequence only) and a lazy head."""

    def __init__(self, rnn: nn.Module, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = lazynn.LazyLinear(3, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])  # type: ignore[no-any-return]


class Bags(nn.Module):
    """An EmbeddingBag of token ids (each weighted by a trainable weight of its own, for
    ``per_sample_weights``) and a lazy head."""

    def __init__(
        self, mode: str, weighted: bool = False, dtype: torch.dtype | None = None, **bag: Any
    ) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 8, mode=mode, dtype=dtype, **bag)
        self.weight_of = nn.Embedding(50, 1, dtype=dtype) if weighted else None
        self.head = lazynn.LazyLinear(3, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        weights = self.weight_of(tokens).squeeze(-1) if self.weight_of is not None else None
        return self.head(self.bag(tokens, per_sample_weights=weights))  # type: ignore[no-any-return]


def _sequence(
    layer: Callable[[], nn.Module], dtype: torch.dtype | None = None
) -> Callable[[], nn.Module]:
    return lambda: Sequence(layer(), dtype)


#: name -> (lazy factory, real example input): nn.LSTM on a CPU runs oneDNN's kernel (float32,
#: bfloat16) or ATen's cells (oneDNN off, float64, a projection); GRU and RNN ATen's cells
SEQUENCE_MODELS: dict[str, tuple[Callable[[], nn.Module], torch.Tensor]] = {
    "lstm": (_sequence(lambda: lazynn.LazyLSTM(16)), torch.randn(7, 3, 10)),
    "lstm_long": (_sequence(lambda: lazynn.LazyLSTM(64)), torch.randn(50, 8, 32)),
    "lstm_deep_bidirectional_batch_first": (
        _sequence(lambda: lazynn.LazyLSTM(16, 2, bidirectional=True, batch_first=True)),
        torch.randn(3, 7, 10),
    ),
    "lstm_dropout": (_sequence(lambda: lazynn.LazyLSTM(16, 3, dropout=0.5)), torch.randn(7, 3, 10)),
    "lstm_projection": (_sequence(lambda: lazynn.LazyLSTM(16, proj_size=8)), torch.randn(7, 3, 10)),
    "lstm_float64": (
        _sequence(lambda: lazynn.LazyLSTM(16, 2, dtype=torch.float64), torch.float64),
        torch.randn(7, 3, 10, dtype=torch.float64),
    ),
    "lstm_bfloat16": (
        _sequence(
            lambda: lazynn.LazyLSTM(16, 2, bidirectional=True, dtype=torch.bfloat16),
            torch.bfloat16,
        ),
        torch.randn(7, 3, 10, dtype=torch.bfloat16),
    ),
    "gru": (_sequence(lambda: lazynn.LazyGRU(16)), torch.randn(7, 3, 10)),
    "gru_deep_bidirectional_batch_first": (
        _sequence(lambda: lazynn.LazyGRU(16, 2, bidirectional=True, batch_first=True)),
        torch.randn(3, 7, 10),
    ),
    "rnn": (_sequence(lambda: lazynn.LazyRNN(16)), torch.randn(7, 3, 10)),
    "rnn_relu_deep_bidirectional_batch_first": (
        _sequence(
            lambda: lazynn.LazyRNN(16, 2, nonlinearity="relu", bidirectional=True, batch_first=True)
        ),
        torch.randn(3, 7, 10),
    ),
    "bag_sum": (lambda: Bags("sum"), _tokens(50, 4, 6)),
    "bag_mean": (lambda: Bags("mean"), _tokens(50, 4, 6)),
    "bag_max": (lambda: Bags("max"), _tokens(50, 4, 6)),
    "bag_sum_weighted": (lambda: Bags("sum", weighted=True), _tokens(50, 4, 6)),
    # off the sum's fast path (an offset2bag), and on it in bfloat16 (none: the meta kernel's
    # fast path is float32 and float16 only)
    "bag_sum_padding": (lambda: Bags("sum", padding_idx=3), _tokens(50, 4, 6)),
    "bag_sum_float64": (lambda: Bags("sum", dtype=torch.float64), _tokens(50, 4, 6)),
    "bag_sum_bfloat16": (lambda: Bags("sum", True, torch.bfloat16), _tokens(50, 4, 6)),
    "bag_mean_bfloat16": (lambda: Bags("mean", dtype=torch.bfloat16), _tokens(50, 4, 6)),
}

OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("adamw", {}),
    "adam": ("adam", {}),
    "sgd": ("sgd", {}),
    "sgd_momentum": ("sgd", {"momentum": 0.9}),
    "rmsprop": ("rmsprop", {}),
    "adagrad": ("adagrad", {}),
    # their step reads values (.item()) of the state it creates: counted as created
    "asgd": ("asgd", {}),
    "adafactor": ("adafactor", {}),
}

OPTIMIZER_CLASSES = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "asgd": torch.optim.ASGD,
    "adafactor": torch.optim.Adafactor,
}


def _unique(tensors: Iterator[torch.Tensor]) -> list[torch.Tensor]:
    return list({id(t): t for t in tensors}.values())


def _real_step(name: str, optimizer: str, optimizer_kwargs: dict[str, Any]) -> Memory:
    """One real CPU training step of the model's eager twin, measured."""
    factory, example = {**MODELS, **SEQUENCE_MODELS}[name]
    torch.manual_seed(0)
    twin = lazynn.build(factory(), example)
    twin.train()
    own = {t.untyped_storage().data_ptr() for t in [*twin.parameters(), *twin.buffers()]}
    saved: dict[int, torch.Tensor] = {}  # data pointer -> a tensor (kept alive: no reuse)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.setdefault(tensor.untyped_storage().data_ptr(), tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = twin(example)
    activations = sum(t.untyped_storage().nbytes() for p, t in saved.items() if p not in own)
    out.float().square().mean().backward()
    params = _unique(twin.parameters())
    real = OPTIMIZER_CLASSES[optimizer](params, **optimizer_kwargs)
    real.step()
    states = [v for s in real.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return Memory(
        params=sum(t.nbytes for t in _unique(iter([*twin.parameters(), *twin.buffers()]))),
        gradients=sum(p.grad.nbytes for p in params if p.grad is not None),
        optimizer_states=sum(t.nbytes for t in _unique(iter(states))),
        activations=activations,
        optimizer=type(real).__name__,
    )


def _model(name: str, state: str) -> nn.Module:
    factory, example = {**MODELS, **SEQUENCE_MODELS}[name]
    if state == "meta":
        with torch.device("meta"):
            return factory()
    model = factory()
    return lazynn.build(model, example) if state == "built" else model


def _fingerprint(model: nn.Module) -> list[Any]:
    """What must not change: each tensor object, its values, grad and version; modes."""
    found: list[Any] = [repr(model), lazynn.is_lazy(model)]
    for module in model.modules():
        found.append((type(module), module.training))
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is None or lazynn.is_lazy(tensor):
                found.append((name, id(tensor), type(tensor)))
                continue
            value = tensor.detach().clone() if not tensor.is_meta else tensor.shape
            found.append((name, id(tensor), tensor.device, tensor._version, tensor.grad, value))
    return found


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple) and isinstance(y, tuple):
            if not _same(list(x), list(y)):
                return False
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("state", ["unbuilt", "built", "meta"])
@pytest.mark.parametrize("name", MODELS)
def test_params_gradients_and_activations_equal_a_real_step(name: str, state: str) -> None:
    _, example = MODELS[name]
    real = _real_step(name, "adamw", {})
    model = _model(name, state)
    before = _fingerprint(model)
    rng = torch.get_rng_state()
    estimate = training_memory(model, (example,))
    assert estimate.params == real.params
    assert estimate.gradients == real.gradients
    assert estimate.activations == real.activations
    assert estimate.optimizer_states == real.optimizer_states
    assert estimate.optimizer == "AdamW"
    assert _same(_fingerprint(model), before)
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("name", ["mlp", "cnn", "tied", "example_llama_tiny"])
def test_optimizer_states_equal_a_real_optimizers_after_one_step(name: str, optimizer: str) -> None:
    opt_name, opt_kwargs = OPTIMIZERS[optimizer]
    real = _real_step(name, opt_name, opt_kwargs)
    _, example = MODELS[name]
    estimate = training_memory(_model(name, "unbuilt"), (example,), None, opt_name, opt_kwargs)
    assert estimate.optimizer_states == real.optimizer_states
    assert estimate.optimizer == real.optimizer
    if optimizer == "sgd":  # plain SGD keeps nothing, with momentum a buffer per parameter
        assert estimate.optimizer_states == 0
    if optimizer == "sgd_momentum":
        assert estimate.optimizer_states == estimate.gradients


def test_examples_as_shapes_specs_and_keywords_give_the_same_estimate() -> None:
    factory, example = MODELS["mlp"]
    by_tensor = training_memory(factory(), (example,))
    assert training_memory(factory(), (tuple(example.shape),)) == by_tensor
    assert training_memory(factory(), (lazynn.Spec(tuple(example.shape)),)) == by_tensor
    tokens = MODELS["tied"][1]
    spec = lazynn.Spec(tuple(tokens.shape), torch.long)
    assert training_memory(Tied(), (spec,)) == training_memory(Tied(), (tokens,))

    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = factory()

        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)  # type: ignore[no-any-return]

    assert training_memory(Keyword(), (), {"x": tuple(example.shape)}) == by_tensor


def test_a_lone_input_is_taken_and_a_bare_shape_refused() -> None:
    factory, example = MODELS["mlp"]
    assert training_memory(factory(), example) == training_memory(factory(), (example,))  # type: ignore[arg-type]
    with pytest.raises(lazynn.InferenceError, match=r"\(\(4, 20\),\)"):
        training_memory(factory(), (4, 20))


def test_a_tied_weight_counts_once() -> None:
    model = lazynn.build(Tied(), MODELS["tied"][1])
    every = sum(p.nbytes for _, p in model.named_parameters(remove_duplicate=False))
    estimate = training_memory(model, (MODELS["tied"][1],))
    assert estimate.params == every - model.embed.weight.nbytes
    assert estimate.gradients == estimate.params


def test_frozen_parameters_have_no_gradient_nor_state() -> None:
    model = lazynn.build(MODELS["mlp"][0](), MODELS["mlp"][1])
    full = training_memory(model, (MODELS["mlp"][1],))
    model[0].requires_grad_(False)
    frozen = training_memory(model, (MODELS["mlp"][1],))
    first = sum(p.nbytes for p in model[0].parameters())
    assert frozen.params == full.params
    assert frozen.gradients == full.gradients - first
    assert frozen.optimizer_states < full.optimizer_states
    assert frozen.activations < full.activations  # (nothing needs the input's grad path)


def test_nothing_of_the_models_size_is_allocated() -> None:
    # a terabyte of parameters on meta: any real copy would fail
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(500_000, 500_000), lazynn.LazyLinear(4))
    estimate = training_memory(model, ((1, 500_000),))
    linear = (500_000 * 500_000 + 500_000) * 4
    assert estimate.params == linear + (500_000 * 4 + 4) * 4
    assert estimate.total > 4 * linear
    assert lazynn.is_lazy(model)
    assert all(p.is_meta for p in model[0].parameters())


def test_total_and_to_dict() -> None:
    memory = training_memory(MODELS["mlp"][0](), ((4, 20),), optimizer=torch.optim.SGD)
    parts = ("params", "gradients", "optimizer_states", "activations")
    assert memory.total == sum(getattr(memory, p) for p in parts)
    assert memory.to_dict() == {
        **{p: getattr(memory, p) for p in parts},
        "total": memory.total,
        "optimizer": "SGD",
    }


@pytest.mark.parametrize("spelling", ["adamw", "AdamW", "ADAMW", torch.optim.AdamW])
def test_optimizer_names_are_case_insensitive_and_classes_accepted(spelling: Any) -> None:
    memory = training_memory(MODELS["mlp"][0](), ((4, 20),), optimizer=spelling)
    assert memory.optimizer == "AdamW"


def test_an_unknown_optimizer_is_refused_with_the_names() -> None:
    names = [
        n.lower()
        for n, c in vars(torch.optim).items()
        if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c.__name__ == n
    ]
    names.remove("optimizer")
    names = [n for n in names if n not in ("lbfgs", "sparseadam")]  # (refused: no meta step)
    model = MODELS["mlp"][0]()
    with pytest.raises(lazynn.LazynnError, match="'adamx'") as info:
        training_memory(model, ((4, 20),), optimizer="adamx")
    assert all(n in str(info.value) for n in names)
    assert lazynn.is_lazy(model)


@pytest.mark.parametrize(
    ("optimizer", "reason"),
    [
        ("lbfgs", "needs a closure"),
        (torch.optim.LBFGS, "needs a closure"),
        ("SparseAdam", "takes sparse gradients only"),
    ],
)
def test_an_optimizer_that_cannot_step_on_meta_is_refused_with_the_reason(
    optimizer: Any, reason: str
) -> None:
    """Refused before anything runs, with why and the names that work."""
    model = lazynn.build(MODELS["mlp"][0](), MODELS["mlp"][1])
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(lazynn.LazynnError, match=reason) as info:
        training_memory(model, ((4, 20),), optimizer=optimizer)
    assert "adamw, asgd" in str(info.value)
    assert "lbfgs" not in str(info.value).split("expected")[1]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_muon_takes_matrices_only() -> None:
    """Muon refuses a bias in torch's words, with the reason; a model of matrices is fine."""
    model = nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(2))
    with pytest.raises(lazynn.LazynnError, match="Muon only supports 2D") as info:
        training_memory(model, ((4, 20),), optimizer="muon")
    assert "2-D parameters only" in str(info.value)
    matrices = nn.Sequential(lazynn.LazyLinear(8, bias=False), lazynn.LazyLinear(2, bias=False))
    estimate = training_memory(matrices, ((4, 20),), optimizer="muon")
    assert estimate.optimizer_states == estimate.gradients  # a momentum buffer each


def test_a_near_miss_optimizer_name_is_suggested() -> None:
    with pytest.raises(lazynn.LazynnError, match=r"'adamm' \(did you mean 'adam'\?\)"):
        lazynn.summary(MODELS["mlp"][0](), (4, 20), training=True, optimizer="adamm")


def test_torchs_own_lazy_layers_and_lazy_ties() -> None:
    """torch's own lazy layers (whose placeholders cannot be deep-copied) are estimated, and a
    weight tied between lazy layers before the build counts once."""
    torchs = nn.Sequential(nn.LazyLinear(4), nn.LazyBatchNorm1d())
    estimate = training_memory(torchs, ((3, 8),))
    built = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))
    assert estimate.params == sum(t.nbytes for t in built.state_dict().values())
    assert estimate.gradients == sum(p.nbytes for p in built.parameters())
    assert isinstance(torchs[0].weight, nn.UninitializedParameter)  # untouched

    class TiedPair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.proj2 = lazynn.LazyLinear(8), lazynn.LazyLinear(8)
            self.proj2.weight = self.proj.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj2(self.proj(x))  # type: ignore[no-any-return]

    tied = training_memory(TiedPair(), ((2, 8),))
    assert tied.params == tied.gradients == 4 * (64 + 8 + 8)


#: the sequence models nn.LSTM runs with oneDNN's kernel: a workspace whose size oneDNN
#: decides (pages of 4 KiB, padded rows); the estimate is oneDNN 3's, within 5% of it
ONEDNN_LSTMS = (
    "lstm",
    "lstm_long",
    "lstm_deep_bidirectional_batch_first",
    "lstm_dropout",
    "lstm_bfloat16",
)


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")  # (torch's flags())
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "aten"])
@pytest.mark.parametrize("state", ["unbuilt", "built", "meta"])
@pytest.mark.parametrize("name", SEQUENCE_MODELS)
def test_recurrent_layers_and_embedding_bags_saved_activations_equal_a_real_step(
    name: str, state: str, onednn: bool
) -> None:
    """What a CPU's kernels keep for the backward: oneDNN's LSTM its workspace (every step's
    gates and states, 50x the bytes of its outputs for a 50-step LSTM of 64), ATen's cells
    each step's gates and states, EmbeddingBag its offset2bag (one element longer than it is,
    in mode mean and max). With oneDNN on (torch's default) and off."""
    _, example = SEQUENCE_MODELS[name]
    with torch.backends.mkldnn.flags(enabled=onednn):
        real = _real_step(name, "adamw", {})
        estimate = training_memory(_model(name, state), (example,))
    assert estimate.params == real.params
    assert estimate.gradients == real.gradients
    assert estimate.optimizer_states == real.optimizer_states
    if onednn and name in ONEDNN_LSTMS:
        assert estimate.activations == pytest.approx(real.activations, rel=0.05)
    else:
        assert estimate.activations == real.activations


def test_a_symbolic_batch_gives_an_lstms_activations_per_sample() -> None:
    """oneDNN's workspace is laid out on pages, not linear in the batch: per sample, its
    parts alone count (the summary refuses figures that are not linear)."""
    factory, example = SEQUENCE_MODELS["lstm_deep_bidirectional_batch_first"]
    per_sample = lazynn.summary(factory(), lazynn.Spec(("B", 7, 10)), training=True).memory
    assert per_sample is not None
    batches = [training_memory(factory(), ((n, 7, 10),), paged=False).activations for n in (2, 3)]
    assert per_sample.activations == batches[1] - batches[0] > 0
    whole = training_memory(factory(), (example,)).activations  # (a batch of 3: pages)
    assert whole >= 3 * per_sample.activations


def test_with_a_symbolic_batch_only_the_activations_are_labelled_per_sample() -> None:
    """Parameters, gradients and optimizer states do not follow the batch: the table labels
    the activations per sample and the total at B=1, not the whole estimate."""
    net = nn.Sequential(lazynn.LazyLinear(8), nn.ReLU(), lazynn.LazyLinear(2))
    report = lazynn.summary(net, lazynn.Spec(("B", 16)), training=True)
    lines = str(report).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Training memory"))
    block = lines[start : start + 6]
    assert block[0] == "Training memory (AdamW, on meta):"
    assert block[1].startswith("  parameters ")
    assert not block[1].endswith("per sample")
    assert block[4].endswith(" per sample")
    assert block[4].startswith("  activations ")
    assert block[5].endswith(" at B=1")
    fixed = str(lazynn.summary(net, (4, 16), training=True))
    assert "per sample" not in fixed
    assert " at B=1" not in fixed
