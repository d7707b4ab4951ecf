"""What torch's own lazy-module tests check, re-expressed against lazynn.

Each test names the behaviour that pytorch's ``test/nn/test_lazy_modules.py`` (and the
``test_lazy_module*`` tests of ``test/dynamo/test_modules.py``) checks of ``torch.nn.Lazy*``,
and checks it of ``lazynn.Lazy*``: code written against torch's lazy modules keeps working
when it imports lazynn's. The deliberate differences (README, "Differences from
torch.nn.Lazy*") are tested as such, here: ``empty_like`` of a placeholder, the InstanceNorm
defaults.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazynn
from compare import assert_same_module
from lazynn import UninitializedBuffer, UninitializedParameter
from registry import ROWS, Row


class Custom(lazynn.LazyModuleMixin, nn.Module):
    """A module of the user's own with lazynn's mixin, as torch's tests make with theirs."""


def with_param() -> Custom:
    module = Custom()
    module.register_parameter("test_param", UninitializedParameter())
    return module


def with_buffer() -> Custom:
    module = Custom()
    module.test_buffer = UninitializedBuffer()
    return module


HOLDERS = {"parameter": with_param, "buffer": with_buffer}


# --- the mixin, its placeholders and checkpoints ---------------------------------------------


@pytest.mark.parametrize("kind", HOLDERS)
def test_placeholders_in_state_dicts_as_torch(kind: str) -> None:
    name = "test_param" if kind == "parameter" else "test_buffer"
    make = HOLDERS[kind]
    module = make()
    assert module.has_uninitialized_params()
    state = module.state_dict()
    placeholder = UninitializedParameter if kind == "parameter" else UninitializedBuffer
    assert isinstance(state[name], placeholder)
    # torch's phrase, in a RuntimeError: a placeholder loaded into a real tensor
    built = Custom()
    if kind == "parameter":
        built.register_parameter(name, nn.Parameter(torch.ones(5, 5)))
    else:
        built.register_buffer(name, torch.ones(5, 5))
    with pytest.raises(RuntimeError, match="shape of an uninitialized"):
        built.load_state_dict(state)
    # a real tensor loaded into a placeholder: taken
    module.load_state_dict(built.state_dict())
    assert torch.equal(getattr(module, name), torch.ones(5, 5))
    # a placeholder loaded into a placeholder: still unbuilt
    module, other = make(), make()
    module.load_state_dict(other.state_dict())
    module.load_state_dict(other.state_dict())
    assert module.has_uninitialized_params()


@pytest.mark.parametrize("kind", HOLDERS)
def test_jit_script_of_an_unbuilt_module_asks_for_a_forward_pass(kind: str) -> None:
    with pytest.raises(RuntimeError, match="run a forward pass") as error:
        torch.jit.script(HOLDERS[kind]())
    assert "lazynn.build" in str(error.value)


def test_jit_script_of_an_unbuilt_model_names_the_layer_and_the_build() -> None:
    model = nn.Sequential(nn.ReLU(), lazynn.LazyLinear(3))
    with pytest.raises(RuntimeError, match="run a forward pass") as error:
        torch.jit.script(model)
    assert "LazyLinear at '1'" in str(error.value)
    assert "lazynn.build" in str(error.value)


@pytest.mark.parametrize("kind", HOLDERS)
def test_share_memory_of_an_unbuilt_module_is_refused_in_torchs_words(kind: str) -> None:
    with pytest.raises(RuntimeError, match="share memory on an uninitialized"):
        HOLDERS[kind]().share_memory()


def test_materialize_takes_an_int_and_the_moved_dtype() -> None:
    module = with_param()
    module.test_param.materialize(10)
    assert module.test_param.shape == (10,)
    assert module.test_param.dtype == torch.get_default_dtype()
    module = with_param()
    module.half()
    module.test_param.materialize(10)
    assert module.test_param.dtype == torch.float16
    module = with_param()
    module.test_param.materialize((2, 3), dtype=torch.float64)
    assert module.test_param.shape == (2, 3)
    assert module.test_param.dtype == torch.float64


OPTIMIZERS = [
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.ASGD,
    torch.optim.SGD,
    torch.optim.Rprop,
    torch.optim.RMSprop,
    torch.optim.LBFGS,
    torch.optim.NAdam,
    torch.optim.RAdam,
]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda c: c.__name__)
def test_an_optimizer_made_before_materialize_trains_the_materialized_parameter(
    optimizer: type[torch.optim.Optimizer],
) -> None:
    module = with_param()
    optim = optimizer(module.parameters(), lr=0.1)  # type: ignore[call-arg]
    assert isinstance(optim.param_groups[0]["params"][0], UninitializedParameter)
    module.test_param.materialize(10)
    held = optim.param_groups[0]["params"][0]
    assert type(held) is nn.Parameter
    with torch.no_grad():
        module.test_param.fill_(1.0)
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    if isinstance(optim, torch.optim.LBFGS):
        optim.step(lambda: torch.tensor(1.0))
    else:
        optim.step()
    assert not torch.equal(module.test_param, torch.ones(10))


def test_adagrad_refuses_a_placeholder_as_torch() -> None:
    with pytest.raises(ValueError, match="uninitialized parameter"):
        torch.optim.Adagrad(with_param().parameters())


@pytest.mark.parametrize(
    "reparametrize", [nn.utils.weight_norm, nn.utils.spectral_norm], ids=lambda f: f.__name__
)
def test_weight_and_spectral_norm_refuse_an_unbuilt_layer(
    reparametrize: Callable[..., Any],
) -> None:
    with pytest.raises(ValueError, match=r"have uninitialized parameters\."):
        reparametrize(lazynn.LazyLinear(7))


def test_operations_on_a_placeholder_are_refused_in_torchs_words() -> None:
    param = UninitializedParameter()
    with pytest.raises(ValueError, match="uninitialized parameter"):
        torch.add(param, param)
    with pytest.raises(ValueError, match="uninitialized parameter"):
        param + param
    with pytest.raises(RuntimeError, match="shape of an uninitialized"):
        param.shape  # noqa: B018
    with pytest.raises(ValueError, match="Attempted to use an uninitialized parameter"):
        param.sum()


def test_empty_like_of_a_placeholder_is_a_placeholder_a_deliberate_difference() -> None:
    # torch raises; lazynn gives a placeholder, so that Module.to_empty keeps a model lazy
    # (README, "Differences from torch.nn.Lazy*").
    param = UninitializedParameter()
    assert isinstance(torch.empty_like(param), UninitializedParameter)


# --- hooks and chains -------------------------------------------------------------------------


class Identity(lazynn.LazyModuleMixin, nn.Module):
    def initialize_parameters(self, input: torch.Tensor) -> None:
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input


def test_a_users_forward_pre_hook_and_forward_hook_run_on_the_first_call() -> None:
    module = Identity()
    module.register_forward_pre_hook(lambda m, args: args[0] + 1)
    assert torch.equal(module(torch.zeros(2, 2)), torch.ones(2, 2))
    module = Identity()
    module.register_forward_hook(lambda m, args, out: args[0] + 1)
    assert torch.equal(module(torch.zeros(2, 2)), torch.ones(2, 2))


def test_chained_layers_build_from_one_input() -> None:
    net = nn.Sequential(lazynn.LazyLinear(15), lazynn.LazyLinear(10))
    net(torch.ones(5, 10))
    assert net[0].weight.shape == (15, 10)
    assert net[0].bias.shape == (15,)
    assert net[1].weight.shape == (10, 15)
    assert net[1].bias.shape == (10,)


# --- linear and convolutions ------------------------------------------------------------------

#: (eager class, lazy class, functional, input shape, weight shape, forward kwargs)
CONVS = [
    (nn.Linear, lazynn.LazyLinear, F.linear, (5, 5), (10, 5), {}),
    (nn.Conv1d, lazynn.LazyConv1d, F.conv1d, (192, 16, 50), (32, 16, 2), {}),
    (nn.Conv2d, lazynn.LazyConv2d, F.conv2d, (192, 16, 8, 6), (32, 16, 2, 2), {}),
    (nn.Conv3d, lazynn.LazyConv3d, F.conv3d, (192, 16, 8, 7, 6), (32, 16, 2, 2, 2), {}),
    (
        nn.ConvTranspose1d,
        lazynn.LazyConvTranspose1d,
        F.conv_transpose1d,
        (192, 16, 50),
        (16, 32, 2),
        {"output_size": (51,)},
    ),
    (
        nn.ConvTranspose2d,
        lazynn.LazyConvTranspose2d,
        F.conv_transpose2d,
        (192, 16, 8, 6),
        (16, 32, 2, 2),
        {"output_size": (9, 7)},
    ),
    (
        nn.ConvTranspose3d,
        lazynn.LazyConvTranspose3d,
        F.conv_transpose3d,
        (192, 16, 8, 7, 6),
        (16, 32, 2, 2, 2),
        {"output_size": (9, 8, 7)},
    ),
]
CONV_IDS = [row[1].__name__ for row in CONVS]


def _lazy(lazy_cls: type[nn.Module]) -> nn.Module:
    return lazy_cls(10) if lazy_cls is lazynn.LazyLinear else lazy_cls(32, 2)


def _eager(cls: type[nn.Module], in_size: int) -> nn.Module:
    return cls(in_size, 10) if cls is nn.Linear else cls(in_size, 32, 2)


@pytest.mark.parametrize("kwargs", [False, True], ids=["plain", "forward-kwargs"])
@pytest.mark.parametrize(("cls", "lazy_cls", "func", "shape", "weight", "fkw"), CONVS, ids=CONV_IDS)
def test_a_first_call_builds_the_eager_class(
    cls: type[nn.Module],
    lazy_cls: type[nn.Module],
    func: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    weight: tuple[int, ...],
    fkw: dict[str, Any],
    kwargs: bool,
) -> None:
    if kwargs and not fkw:
        pytest.skip("no forward keyword arguments")
    module = _lazy(lazy_cls)
    assert isinstance(module.weight, nn.UninitializedParameter)
    assert isinstance(module.bias, nn.UninitializedParameter)
    x = torch.ones(*shape)
    out = module(x, **(fkw if kwargs else {}))
    assert isinstance(module, cls)
    assert not isinstance(module, lazy_cls)
    assert module.weight.shape == weight
    assert module.bias.shape == (
        weight[0] if cls in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d) else weight[1],
    )
    assert (module.weight != 0).any()
    assert (out != 0).any()
    assert torch.equal(func(x, module.weight, module.bias), module(x))


@pytest.mark.parametrize(("cls", "lazy_cls", "func", "shape", "weight", "fkw"), CONVS, ids=CONV_IDS)
def test_pickles_unbuilt_and_built(
    cls: type[nn.Module],
    lazy_cls: type[nn.Module],
    func: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    weight: tuple[int, ...],
    fkw: dict[str, Any],
) -> None:
    module = pickle.loads(pickle.dumps(_lazy(lazy_cls)))
    assert isinstance(module, lazy_cls)
    assert isinstance(module.weight, UninitializedParameter)
    assert isinstance(module.bias, UninitializedParameter)
    module(torch.ones(*shape))
    module = pickle.loads(pickle.dumps(module))
    assert isinstance(module, cls)
    assert not isinstance(module, lazy_cls)
    assert module.weight.shape == weight
    assert not isinstance(module.weight, nn.UninitializedParameter)
    assert not isinstance(module.bias, nn.UninitializedParameter)


@pytest.mark.parametrize(("cls", "lazy_cls", "func", "shape", "weight", "fkw"), CONVS, ids=CONV_IDS)
def test_checkpoints_both_ways_and_a_forward_after(
    cls: type[nn.Module],
    lazy_cls: type[nn.Module],
    func: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    weight: tuple[int, ...],
    fkw: dict[str, Any],
) -> None:
    eager, lazy = _eager(cls, shape[1] if cls is not nn.Linear else shape[-1]), _lazy(lazy_cls)
    lazy.load_state_dict(eager.state_dict())
    assert isinstance(lazy, cls)
    assert not isinstance(lazy, lazy_cls)
    assert lazy.weight.shape == weight
    size = "in_features" if cls is nn.Linear else "in_channels"
    assert getattr(lazy, size) == getattr(eager, size)
    x = torch.randn(*shape)
    assert torch.equal(lazy(x), eager(x))
    assert getattr(lazy, size) == getattr(eager, size)
    with pytest.raises(RuntimeError, match="shape of an uninitialized"):
        eager.load_state_dict(_lazy(lazy_cls).state_dict())


# --- norms ------------------------------------------------------------------------------------

NORMS = [
    (nn.BatchNorm1d, lazynn.LazyBatchNorm1d, (16, 3, 6)),
    (nn.BatchNorm1d, lazynn.LazyBatchNorm1d, (16, 6)),
    (nn.BatchNorm2d, lazynn.LazyBatchNorm2d, (16, 3, 6, 7)),
    (nn.BatchNorm3d, lazynn.LazyBatchNorm3d, (16, 3, 6, 7, 8)),
    (nn.InstanceNorm1d, lazynn.LazyInstanceNorm1d, (16, 3, 6)),
    (nn.InstanceNorm2d, lazynn.LazyInstanceNorm2d, (16, 3, 6, 7)),
    (nn.InstanceNorm3d, lazynn.LazyInstanceNorm3d, (16, 3, 6, 7, 8)),
]
NORM_IDS = [f"{row[1].__name__}-{len(row[2])}d" for row in NORMS]
FLAGS = [(a, t) for a in (False, True) for t in (False, True)]


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


@pytest.mark.parametrize(("affine", "track"), FLAGS)
@pytest.mark.parametrize(("cls", "lazy_cls", "shape"), NORMS, ids=NORM_IDS)
def test_a_norm_builds_what_its_eager_class_holds(
    cls: type[nn.Module],
    lazy_cls: type[nn.Module],
    shape: tuple[int, ...],
    affine: bool,
    track: bool,
) -> None:
    lazy = lazy_cls(affine=affine, track_running_stats=track)
    if affine:
        assert isinstance(lazy.weight, nn.UninitializedParameter)
        assert isinstance(lazy.bias, nn.UninitializedParameter)
    if track:
        assert isinstance(lazy.running_mean, nn.UninitializedBuffer)
        assert isinstance(lazy.running_var, nn.UninitializedBuffer)
    x = torch.ones(*shape)
    out = lazy(x)
    assert isinstance(lazy, cls)
    assert not isinstance(lazy, lazy_cls)
    eager = cls(shape[1], affine=affine, track_running_stats=track)
    torch.testing.assert_close(out, eager(x))
    theirs = dict(_tensors(eager))
    ours = dict(_tensors(lazy))
    assert list(ours) == list(theirs)
    for name, tensor in theirs.items():
        assert ours[name].shape == tensor.shape, name
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize(("affine", "track"), FLAGS)
@pytest.mark.parametrize(("cls", "lazy_cls", "shape"), NORMS, ids=NORM_IDS)
def test_a_norm_pickles_unbuilt_and_built(
    cls: type[nn.Module],
    lazy_cls: type[nn.Module],
    shape: tuple[int, ...],
    affine: bool,
    track: bool,
) -> None:
    module = pickle.loads(pickle.dumps(lazy_cls(affine=affine, track_running_stats=track)))
    assert isinstance(module, lazy_cls)
    if affine:
        assert isinstance(module.weight, UninitializedParameter)
    if track:
        assert isinstance(module.running_mean, UninitializedBuffer)
    module(torch.ones(*shape))
    module = pickle.loads(pickle.dumps(module))
    assert isinstance(module, cls)
    assert not isinstance(module, lazy_cls)
    assert not any(isinstance(t, nn.UninitializedParameter) for _, t in _tensors(module))
    assert not any(isinstance(t, nn.UninitializedBuffer) for _, t in _tensors(module))


def test_num_batches_tracked_is_a_real_tensor_before_the_build_as_torch() -> None:
    for lazy_cls in (lazynn.LazyBatchNorm1d, lazynn.LazyBatchNorm2d, lazynn.LazyBatchNorm3d):
        lazy, theirs = lazy_cls(), getattr(nn, lazy_cls.__name__)()
        assert type(lazy.num_batches_tracked) is torch.Tensor
        assert torch.equal(lazy.num_batches_tracked, theirs.num_batches_tracked)
        assert lazy.num_batches_tracked.dtype == torch.long


BATCHNORMS = [
    (nn.BatchNorm1d, lazynn.LazyBatchNorm1d),
    (nn.BatchNorm2d, lazynn.LazyBatchNorm2d),
    (nn.BatchNorm3d, lazynn.LazyBatchNorm3d),
]


@pytest.mark.parametrize(("cls", "lazy_cls"), BATCHNORMS, ids=lambda c: c.__name__)
def test_a_batchnorm_checkpoint_both_ways(cls: type[nn.Module], lazy_cls: type[nn.Module]) -> None:
    lazy = lazy_cls(affine=True, track_running_stats=True)
    lazy.load_state_dict(cls(10).state_dict())
    assert isinstance(lazy, cls)
    assert lazy.num_features == 10
    for name in ("weight", "bias", "running_mean", "running_var"):
        assert getattr(lazy, name).shape == (10,)
    with pytest.raises(RuntimeError, match="shape of an uninitialized"):
        cls(10).load_state_dict(lazy_cls().state_dict())


def test_a_batchnorm_checkpoint_then_an_eval_forward() -> None:
    module = nn.BatchNorm2d(16).eval()
    lazy = lazynn.LazyBatchNorm2d()
    lazy.load_state_dict(module.state_dict())
    lazy.eval()
    assert isinstance(lazy, nn.BatchNorm2d)
    assert lazy.num_features == 16
    x = torch.randn(2, 16, 4, 4)
    torch.testing.assert_close(lazy(x), module(x))


INSTANCENORMS = [
    (nn.InstanceNorm1d, lazynn.LazyInstanceNorm1d),
    (nn.InstanceNorm2d, lazynn.LazyInstanceNorm2d),
    (nn.InstanceNorm3d, lazynn.LazyInstanceNorm3d),
]


@pytest.mark.parametrize(("affine", "track"), FLAGS)
@pytest.mark.parametrize(("cls", "lazy_cls"), INSTANCENORMS, ids=lambda c: c.__name__)
def test_an_instancenorm_checkpoint(
    cls: type[nn.Module], lazy_cls: type[nn.Module], affine: bool, track: bool
) -> None:
    lazy = lazy_cls(affine=affine, track_running_stats=track)
    lazy.load_state_dict(cls(10, affine=affine, track_running_stats=track).state_dict())
    assert isinstance(lazy, cls)
    if affine or track:
        assert lazy.num_features == 10
    if affine:
        assert lazy.weight.shape == (10,)
    if track:
        assert lazy.running_mean.shape == (10,)
    with pytest.raises(RuntimeError, match="shape of an uninitialized"):
        cls(10, affine=True, track_running_stats=True).load_state_dict(
            lazy_cls(affine=True, track_running_stats=True).state_dict()
        )


@pytest.mark.parametrize(
    ("cls", "lazy_cls", "shape"),
    [(c, lc, s) for c, lc, s in NORMS if c.__name__.startswith("Batch") and len(s) > 2],
    ids=lambda c: getattr(c, "__name__", ""),
)
def test_a_norm_takes_its_input_by_keyword(
    cls: type[nn.Module], lazy_cls: type[nn.Module], shape: tuple[int, ...]
) -> None:
    inputs = {"input": torch.ones(*shape)}
    torch.testing.assert_close(lazy_cls()(**inputs), cls(shape[1])(**inputs))


# --- torch.compile and fx ---------------------------------------------------------------------
# (torch's test/dynamo/test_modules.py checks these of its lazy modules: a lazy module built
# inside a compiled frame, with a graph break in initialize_parameters, under fullgraph and
# when made inside the compiled function; a compiled model run before any eager call; list
# inputs; a lazy submodule made in initialize_parameters; a mixin without cls_to_become.)


@pytest.fixture
def dynamo() -> Iterator[Any]:
    import torch._dynamo

    torch._dynamo.reset()
    yield torch._dynamo
    torch._dynamo.reset()


class Materialized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_parameter("param", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class LazyToMaterialized(lazynn.LazyModuleMixin, Materialized):
    cls_to_become = Materialized

    def __init__(self) -> None:
        super().__init__()
        self.param = UninitializedParameter()

    def initialize_parameters(self, x: torch.Tensor) -> None:
        torch._dynamo.graph_break()  # not inlined: dynamo runs the build itself
        self.param.materialize(x.shape)


@pytest.mark.compile
def test_a_custom_lazy_module_builds_in_a_fullgraph_frame_and_made_inside_one(dynamo: Any) -> None:
    shape = (16, 3, 6, 7, 8)
    module = LazyToMaterialized()
    dynamo.optimize("eager", nopython=True)(lambda: module(torch.ones(*shape)))()
    assert isinstance(module, Materialized)
    assert module.param.shape == shape
    made: list[nn.Module] = []

    def inside() -> None:
        made.append(LazyToMaterialized())
        made[0](torch.ones(*shape))

    dynamo.optimize("eager")(inside)()
    assert isinstance(made[0], Materialized)
    assert made[0].param.shape == shape


@pytest.mark.compile
def test_a_compiled_norm_builds_once_and_never_recompiles(dynamo: Any) -> None:
    from torch._dynamo.testing import CompileCounter

    shape = (16, 3, 6, 7, 8)
    module = lazynn.LazyBatchNorm3d(affine=False, track_running_stats=False)
    counter = CompileCounter()
    fn = dynamo.optimize(counter, nopython=True)(lambda: module(torch.ones(*shape)))
    fn()
    out = fn()
    torch.testing.assert_close(out, module(torch.ones(*shape)))
    assert isinstance(module, nn.BatchNorm3d)
    assert counter.frame_count == 1


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = lazynn.LazyLinear(10), lazynn.LazyLinear(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))


@pytest.mark.compile
def test_a_compiled_model_first_then_eager_then_another_shape(dynamo: Any) -> None:
    model = MLP()
    x = torch.rand(10, 10)
    compiled = dynamo.optimize("eager", nopython=True)(model)
    torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(RuntimeError):  # the layers are built for 10 features
        compiled(torch.rand(20, 20))


class ListInput(lazynn.LazyModuleMixin, nn.Module):
    def initialize_parameters(self, input: list[torch.Tensor]) -> None:
        with torch.no_grad():
            self._param = nn.Parameter(torch.empty(input[0].shape).fill_(0.5))

    def forward(self, input: list[torch.Tensor]) -> torch.Tensor:
        x = input[0] * 0
        for item in input:
            x = x + item
        return x


class WithLazyChild(lazynn.LazyModuleMixin, nn.Module):
    def initialize_parameters(self, input: list[torch.Tensor]) -> None:
        with torch.no_grad():
            self.layer = ListInput()

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return self.layer(x)  # type: ignore[no-any-return]


class NoClassToBecome(lazynn.LazyModuleMixin, nn.Module):
    cls_to_become = None

    def impl(self, x: torch.Tensor) -> torch.Tensor:
        return x.cos() + self._val

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x.sin())

    def initialize_parameters(self, input: torch.Tensor) -> None:
        self._val = nn.Parameter(torch.ones(2, 2))


@pytest.mark.compile
@pytest.mark.parametrize(
    ("make", "inputs"),
    [
        (ListInput, lambda: ([torch.rand(5, 5)] * 3,)),
        (WithLazyChild, lambda: ([torch.rand(5, 5)] * 3,)),
        (NoClassToBecome, lambda: (torch.rand(2, 2),)),
    ],
    ids=["list-input", "lazy-child-made-in-build", "no-cls-to-become"],
)
def test_custom_lazy_modules_compile_fullgraph(
    dynamo: Any, make: Callable[[], nn.Module], inputs: Callable[[], tuple[Any, ...]]
) -> None:
    module = make()
    args = inputs()
    out = dynamo.optimize("eager", nopython=True)(module)(*args)
    torch.testing.assert_close(out, module(*args))


@pytest.mark.compile
@pytest.mark.parametrize("nested_graph_breaks", [False, True])
def test_a_layer_made_inside_a_compiled_function_as_torchs(
    dynamo: Any, nested_graph_breaks: bool
) -> None:
    with dynamo.config.patch(nested_graph_breaks=nested_graph_breaks):
        torch.manual_seed(0)
        out = torch.compile(lambda x: lazynn.LazyLinear(3)(x), backend="eager")(torch.ones(2, 4))
    torch.manual_seed(0)
    assert torch.equal(out, nn.Linear(4, 3)(torch.ones(2, 4)))


class OwnHook(nn.Module):
    """A user's module (no mixin) that builds its lazynn placeholder in its own pre-hook."""

    def __init__(self) -> None:
        super().__init__()
        self.w = UninitializedParameter()
        self.register_forward_pre_hook(self._build)

    def _build(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if isinstance(self.w, nn.UninitializedParameter):
            self.w.materialize(args[0].shape[-1])
            with torch.no_grad():
                self.w.fill_(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


@pytest.mark.compile
def test_a_users_module_holding_placeholders_compiles_nested_with_a_graph_break(
    dynamo: Any,
) -> None:
    model = nn.Sequential(OwnHook(), nn.ReLU())
    out = torch.compile(model, backend="eager")(torch.ones(2, 4))
    assert torch.equal(out, torch.full((2, 4), 2.0))
    assert type(model[0].w) is nn.Parameter


def test_fx_traces_an_unbuilt_layer_as_a_leaf_and_the_graph_builds_it() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(lazynn.LazyLinear(3), nn.ReLU(), nn.Sequential(lazynn.LazyLinear(2)))
    graph = torch.fx.symbolic_trace(model)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_module"]
    assert targets == ["0", "1", "2.0"]
    assert lazynn.is_lazy(model)
    x = torch.ones(2, 4)
    out = graph(x)
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 2)))
    assert torch.equal(out, eager(x))
    assert type(model[0]) is nn.Linear
    assert torch.equal(graph(x), model(x))


class _Calls(nn.Module):
    """A user's model around one layer, called as its registry row calls it."""

    def __init__(self, row: Row, layer: nn.Module) -> None:
        super().__init__()
        self.row, self.layer = row, layer

    def forward(self, x: torch.Tensor) -> Any:
        return self.layer(*self.row.args(self.layer, x))  # (row.out outside: test code)


@pytest.mark.compile
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["nested", "bare"])
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_every_layer_compiles_unbuilt_nested_and_bare(dynamo: Any, row: Row, how: str) -> None:
    x = row.example()
    torch.manual_seed(0)
    layer = row.lazy(**row.simple).eval()
    if how == "nested":
        nested = torch.compile(_Calls(row, layer), backend="eager")
        run = lambda x: row.out(nested(x))  # noqa: E731
    else:
        compiled = torch.compile(layer, backend="eager")
        run = lambda x: row.out(compiled(*row.args(layer, x)))  # noqa: E731
    # (a rank-agnostic layer nested: its class is its first input's, and dynamo fixes the
    # class it traces before the build: a graph break, and its first call runs uncompiled;
    # with fullgraph=True it is refused: tests/ecosystem/test_compile.py)
    out = run(x)
    torch.manual_seed(0)
    eager = row.new_eager(row.simple, row.simple_size).eval()
    assert not lazynn.is_lazy(layer)
    assert torch.equal(out, row.call(eager, x))
    layer.__dict__.pop("_is_torch_compile", None)  # (torch.compile marks any module it wraps)
    layer.__dict__.pop("_compile_kwargs", None)  # (and Lightning, once imported, its kwargs)
    assert_same_module(layer, eager)


def test_dynamo_learns_of_the_placeholders_when_it_is_first_imported() -> None:
    # torch internals: dynamo's setting for tensor subclasses it must not trace, and the
    # registration made on dynamo's first import (lazynn never imports it itself).
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys, torch, lazynn
        assert "torch._dynamo" not in sys.modules
        import torch._dynamo
        subclasses = torch._dynamo.config.nontraceable_tensor_subclasses
        assert lazynn.UninitializedParameter in subclasses
        assert lazynn.UninitializedBuffer in subclasses
        assert not [f for f in sys.meta_path if type(f).__module__.startswith("lazynn")]
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
