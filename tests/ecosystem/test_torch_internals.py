"""The torch private APIs and internals lazynn relies on: each test fails if torch changes one.

* ``torch._C.DisableTorchFunctionSubclass`` (placeholders read their raw data under it);
* ``torch.Tensor._make_subclass`` (placeholders are made with it);
* dynamo's lazy-module protocol (``is_lazy_module``, ``_initialize_hook``,
  ``_infer_parameters``, ``cls_to_become``);
* torch's ``LazyModuleMixin``: lazynn overrides every method, so the mechanism is its own;
* ``nn.Module()``'s instance attributes (copied over at the build) and the forward pre-hook
  dicts (used by ``LazyModuleMixin.__copy__``);
* ``torch.serialization.add_safe_globals`` (unbuilt checkpoints load with weights_only);
* ``sys._getframe`` (``module_path`` names a nested layer's path in errors);
* ``torch.utils._device.DeviceContext`` (the rehearsal's device mode subclasses it);
* ``torch._C._autograd._top_saved_tensors_default_hooks`` and how ``torch.utils.checkpoint``
  runs its forward (a build walks the stack for a checkpoint only where one can be running).
"""

from __future__ import annotations

import copy
import inspect
import io
import pathlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
import torch._dynamo.utils
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin as TorchLazyModuleMixin
from torch.utils.hooks import RemovableHandle

import lazynn
from lazynn._layer.base import LazyLayer
from lazynn._layer.construct import MODULE_KEYS as _MODULE_KEYS
from lazynn._module.lifecycle import is_unbuilt
from lazynn._module.tensors import raw as _raw
from lazynn._nn.agnostic import _RankAgnostic
from registry import Row

# --- torch._C.DisableTorchFunctionSubclass ----------------------------------------------------


class _Recording(torch.Tensor):
    calls: ClassVar[list[Callable[..., Any]]] = []

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_disable_torch_function_subclass_is_a_context_manager() -> None:
    t = torch.Tensor._make_subclass(_Recording, torch.arange(3.0), False)
    _Recording.calls.clear()
    assert type(t + 1) is _Recording
    assert _Recording.calls  # the override runs normally
    _Recording.calls.clear()
    assert torch._C._is_torch_function_enabled()
    with torch._C.DisableTorchFunctionSubclass():
        assert not torch._C._is_torch_function_enabled()
        added = t + 1
        data = t.data
    assert torch._C._is_torch_function_enabled()  # restored on exit
    assert not _Recording.calls  # the override was skipped inside
    assert type(added) is torch.Tensor
    assert type(data) is torch.Tensor
    assert torch.equal(added, torch.arange(1.0, 4.0))


def test_disable_torch_function_subclass_reads_a_placeholders_raw_data() -> None:
    p = lazynn.UninitializedParameter(dtype=torch.float64)
    with pytest.raises(lazynn.UnbuiltError):
        p.data.add(1)  # outside the context, the placeholder refuses data access
    raw = _raw(p)
    assert type(raw) is torch.Tensor
    assert raw.dtype == torch.float64
    assert raw.numel() == 0


# --- torch.Tensor._make_subclass --------------------------------------------------------------


@pytest.mark.parametrize("requires_grad", [False, True])
def test_make_subclass_wraps_the_same_storage(requires_grad: bool) -> None:
    base = torch.arange(4.0)
    t = torch.Tensor._make_subclass(_Recording, base, requires_grad)
    assert type(t) is _Recording
    assert t.requires_grad is requires_grad
    assert t.is_leaf
    with torch._C.DisableTorchFunctionSubclass():
        assert t.data_ptr() == base.data_ptr()
        assert t.dtype == base.dtype


@pytest.mark.parametrize(
    ("kind", "grad"),
    [(lazynn.UninitializedParameter, True), (lazynn.UninitializedBuffer, False)],
)
def test_placeholders_are_made_with_make_subclass(kind: type[torch.Tensor], grad: bool) -> None:
    p = kind(dtype=torch.float16)  # type: ignore[call-arg]
    assert type(p) is kind
    assert p.requires_grad is grad
    assert p.dtype == torch.float16
    assert torch.nn.parameter.is_lazy(p)


# --- dynamo's lazy-module protocol ------------------------------------------------------------


def test_dynamo_is_lazy_module(row: Row) -> None:
    layer = row.lazy(**row.simple)
    assert torch._dynamo.utils.is_lazy_module(layer)
    assert isinstance(layer, TorchLazyModuleMixin)
    assert hasattr(layer, "_initialize_hook")
    assert callable(layer._infer_parameters)
    if not row.agnostic:  # (a rank-agnostic layer's class waits for its input: test_compile)
        assert layer.cls_to_become is row.eager
    row.call(layer, row.example())
    assert not torch._dynamo.utils.is_lazy_module(layer)
    assert not hasattr(layer, "_initialize_hook")


def test_dynamo_infer_parameters_signature() -> None:
    # dynamo calls mod._infer_parameters(mod, args, kwargs) with fake args and a kwargs dict.
    layer = lazynn.LazyLinear(2)
    layer._infer_parameters(layer, [torch.randn(3, 4)], {})
    assert type(layer) is nn.Linear
    assert layer.in_features == 4


def _dynamo_source(relative: str) -> str:
    root = pathlib.Path(inspect.getfile(torch._dynamo)).parent
    return (root / relative).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("relative", "names"),
    [
        ("eval_frame.py", ["_initialize_hook", "_infer_parameters", "_call_lazy_check"]),
        (
            "variables/nn_module.py",
            ["_initialize_hook", "_infer_parameters", "cls_to_become", "is_lazy_module"],
        ),
        ("utils.py", ["def is_lazy_module", "LazyModuleMixin"]),
    ],
)
def test_dynamo_source_still_uses_the_protocol(relative: str, names: list[str]) -> None:
    source = _dynamo_source(relative)
    for name in names:
        assert name in source, f"torch/_dynamo/{relative} no longer mentions {name}"


def test_dynamo_is_lazy_module_keys_on_torchs_mixin() -> None:
    source = inspect.getsource(torch._dynamo.utils.is_lazy_module)
    assert "LazyModuleMixin" in source
    assert torch._dynamo.utils.LazyModuleMixin is TorchLazyModuleMixin


# --- torch's LazyModuleMixin is fully overridden ----------------------------------------------

_TORCH_MIXIN_CALLABLES = sorted(
    name
    for name, value in vars(TorchLazyModuleMixin).items()
    if callable(value) and not isinstance(value, type)
)


def test_torch_mixin_has_the_expected_methods() -> None:
    # A sanity check on the list below: if torch adds a method, the next test covers it too.
    assert {
        "__init__",
        "_infer_parameters",
        "initialize_parameters",
        "has_uninitialized_params",
        "_replicate_for_data_parallel",
        "_save_to_state_dict",
        "_lazy_load_hook",
    } <= set(_TORCH_MIXIN_CALLABLES)


@pytest.mark.parametrize("name", _TORCH_MIXIN_CALLABLES)
def test_every_torch_mixin_method_is_overridden(name: str) -> None:
    assert name in vars(lazynn.LazyModuleMixin) or name in vars(LazyLayer), (
        f"torch.nn.modules.lazy.LazyModuleMixin.{name} is not overridden by lazynn"
    )


def test_every_layer_resolves_the_mixin_methods_to_lazynn(row: Row) -> None:
    # (a rank-agnostic layer chooses its class in its own initialize_parameters, which then
    # builds as LazyLayer's)
    owners = (lazynn.LazyModuleMixin, LazyLayer, *((_RankAgnostic,) if row.agnostic else ()))
    for name in _TORCH_MIXIN_CALLABLES:
        owner = next(c for c in row.lazy.__mro__ if name in vars(c))
        if name == "__init__":
            assert owner.__module__.startswith("lazynn."), (name, owner)
        else:
            assert owner in owners, (name, owner)
    mro = row.lazy.__mro__
    assert mro.index(lazynn.LazyModuleMixin) < mro.index(TorchLazyModuleMixin)


def test_torch_mixin_hooks_are_not_registered(row: Row) -> None:
    # torch's mixin __init__ registers its own load hook; lazynn's does not.
    layer = row.lazy(**row.simple)
    assert not layer._load_state_dict_pre_hooks
    assert len(layer._forward_pre_hooks) == 1
    assert layer._initialize_hook.id in layer._forward_pre_hooks


# --- nn.Module's instance attributes and hook dicts -------------------------------------------


def test_module_instance_keys_are_what_lazynn_expects() -> None:
    assert set(vars(nn.Module())) == _MODULE_KEYS


def test_forward_pre_hook_dicts_exist_and_share_the_handle_id() -> None:
    module = nn.Identity()
    assert isinstance(module._forward_pre_hooks, dict)
    assert isinstance(module._forward_pre_hooks_with_kwargs, dict)

    def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        return None

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    assert module._forward_pre_hooks[handle.id] is hook
    assert module._forward_pre_hooks_with_kwargs[handle.id] is True
    # LazyModuleMixin.__copy__ rebuilds a handle over a copy's dicts this way.
    other = RemovableHandle(
        module._forward_pre_hooks, extra_dict=module._forward_pre_hooks_with_kwargs
    )
    other.id = handle.id
    other.remove()
    assert handle.id not in module._forward_pre_hooks
    assert handle.id not in module._forward_pre_hooks_with_kwargs


def test_shallow_copy_builds_independently() -> None:
    layer = lazynn.LazyLinear(2)
    twin = copy.copy(layer)
    twin(torch.randn(1, 5))
    assert type(twin) is nn.Linear
    assert twin.in_features == 5
    assert is_unbuilt(layer)
    assert torch.nn.parameter.is_lazy(layer.weight)
    assert len(layer._forward_pre_hooks) == len(layer._forward_pre_hooks_with_kwargs) == 1
    layer(torch.randn(1, 7))
    assert type(layer) is nn.Linear
    assert layer.in_features == 7
    assert twin.in_features == 5


# --- torch.serialization safe globals ---------------------------------------------------------


def test_placeholders_are_safe_globals() -> None:
    assert callable(torch.serialization.add_safe_globals)
    safe = torch.serialization.get_safe_globals()
    assert lazynn.UninitializedParameter in safe
    assert lazynn.UninitializedBuffer in safe


def test_unbuilt_state_dict_loads_with_weights_only() -> None:
    buffer = io.BytesIO()
    torch.save(lazynn.LazyBatchNorm1d().state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert set(loaded) == {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
    assert type(loaded["weight"]) is lazynn.UninitializedParameter
    assert type(loaded["running_mean"]) is lazynn.UninitializedBuffer


# --- sys._getframe: a nested layer's path in errors -------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = lazynn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Identity(), lazynn.LazyConv2d(4, 3))
        self.encoder = nn.ModuleDict({"block": _Block()})

    def forward(self, image: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        return self.features(image).sum() + self.encoder["block"](vector).sum()


def test_getframe_exists() -> None:
    assert callable(sys._getframe)
    assert sys._getframe(0).f_code is test_getframe_exists.__code__


def test_error_names_nested_layer_path() -> None:
    model = _Model()
    with pytest.raises(lazynn.InferenceError, match=r"LazyConv2d at 'features\.1'"):
        model(torch.randn(8, 3), torch.randn(2, 5))  # a 2-d input to the conv
    with pytest.raises(lazynn.InferenceError, match=r"LazyLinear at 'encoder\.block\.fc'"):
        model(torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2, 5)))  # an integer input


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_forward_runs_without_grad_or_under_saved_tensors_hooks(
    reentrant: bool,
) -> None:
    """callers.in_checkpoint walks the stack only where grad is off or saved-tensors hooks are
    pushed: torch.utils.checkpoint's forward runs under no_grad (reentrant) or under its hooks
    (non-reentrant, its recomputation too); outside, the query answers None."""
    from torch.utils.checkpoint import checkpoint

    top = torch._C._autograd._top_saved_tensors_default_hooks
    assert top(True) is None
    seen: list[bool] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        seen.append(not torch.is_grad_enabled() or top(True) is not None)
        return x.sin()  # (saves its input: the backward recomputes)

    x = torch.ones(2, requires_grad=True)
    checkpoint(forward, x, use_reentrant=reentrant).sum().backward()
    assert len(seen) == 2  # the forward, then the backward's recomputation
    assert seen[0]
    assert reentrant or seen[1]  # (the reentrant recomputation builds nothing: not asked)


def test_functorch_interpreter_stack_query_exists() -> None:
    """lazynn refuses a first call under a differentiating torch.func transform, and builds
    under vmap, by this private query (_module/refusals.py): the stack's levels and kinds."""
    from torch._C._functorch import TransformType, get_interpreter_stack

    assert get_interpreter_stack() is None
    seen: list[list[object]] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append([level.key() for level in get_interpreter_stack() or []])
        return x.sum()

    torch.func.grad(probe)(torch.ones(2))
    torch.vmap(probe)(torch.ones(2, 2))
    torch.func.grad(lambda x: torch.vmap(probe)(x).sum())(torch.ones(2, 2))
    assert seen == [
        [TransformType.Grad],
        [TransformType.Vmap],
        [TransformType.Grad, TransformType.Vmap],
    ]


# --- what the factory form, kept initializations, the twin and on_build rely on -------------


def test_trunc_normal_asks_is_meta_first_from_its_helper() -> None:
    """_module/kept.py keeps nn.init.trunc_normal_ on a placeholder when torch's helper
    _no_grad_trunc_normal_ asks the tensor's is_meta (and returns at once for meta)."""
    helper = torch.nn.init._no_grad_trunc_normal_  # type: ignore[attr-defined]
    source = inspect.getsource(helper)
    assert source.index("tensor.is_meta") < source.index(".normal_(")
    assert list(inspect.signature(helper).parameters)[:6] == [
        "tensor", "mean", "std", "a", "b", "generator",
    ]  # fmt: skip
    layer = lazynn.LazyLinear(3)
    torch.nn.init.trunc_normal_(layer.weight, std=0.5)
    (kept,) = layer.weight.__dict__["_lazynn_inits"]
    assert kept.fn is torch.nn.init.trunc_normal_
    assert kept.kwargs["std"] == 0.5


def test_compiled_modules_call_the_lazy_protocol_eagerly_first() -> None:
    """torch.compile(model) runs _infer_parameters(model, args, kwargs) before tracing when the
    model has an _initialize_hook (on_build relies on it to build before the trace)."""
    from torch._dynamo.eval_frame import OptimizedModule

    source = inspect.getsource(OptimizedModule._call_lazy_check)
    assert "_infer_parameters" in source
    assert '"_initialize_hook"' in inspect.getsource(OptimizedModule._initialize)


def test_op_schemas_tell_written_arguments_and_storages_have_an_identity() -> None:
    schema = torch.ops.aten.uniform_.default._schema
    assert schema.arguments[0].alias_info is not None
    assert schema.arguments[0].alias_info.is_write
    a, b = torch.empty(2, device="meta"), torch.empty(2, device="meta")
    assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
    assert a.untyped_storage()._cdata == a[1:].untyped_storage()._cdata


def test_load_state_dict_pre_hooks_are_an_ordered_dict_run_by_nn_modules_load() -> None:
    module = nn.Linear(2, 2)
    assert isinstance(module._load_state_dict_pre_hooks, OrderedDict)
    assert "_load_state_dict_pre_hooks" in inspect.getsource(nn.Module._load_from_state_dict)


def test_dynamos_graph_break_takes_lazynns_words() -> None:
    """_module/refusals.py's compile_refusal raises through torch._dynamo.exc.unimplemented
    (private)."""
    from torch._dynamo.exc import Unsupported, unimplemented

    parameters = inspect.signature(unimplemented).parameters
    for name in ("gb_type", "context", "explanation", "hints"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    with pytest.raises(Unsupported, match="lazynn's explanation"):
        unimplemented(gb_type="t", context="c", explanation="lazynn's explanation", hints=[])


def test_the_rehearsals_device_mode_is_torchs_device_context() -> None:
    """_rehearsal/meta_device.py's MetaDevice subclasses torch's DeviceContext: made tensors are
    meta (even inside another device context), the mode stack is left as it was, draws are
    noticed."""
    from lazynn._rehearsal.meta_device import MetaDevice

    with torch.device("cpu"):
        with MetaDevice() as mode:
            assert torch.empty(2).is_meta
            assert torch.zeros(2, device="cpu").device.type == "cpu"
            assert not mode.drew
            torch.empty(2, device="cpu").uniform_()
            assert mode.drew
        assert torch.empty(2).device.type == "cpu"
    assert torch.empty(2).device == torch.get_default_device()


def test_the_cpu_generators_seed_field_is_its_first_8_bytes_and_no_draw_reads_it() -> None:
    """lazynn._program.record marks the default generator while it records a construction:
    the state's first 8 bytes are ``the_initial_seed``; changing them changes neither the
    stream nor the next draws' values, and any reseed rewrites them."""
    torch.manual_seed(3)
    torch.rand(7)
    state = torch.get_rng_state()
    marked = state.clone()
    marked[:8] = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], dtype=torch.uint8)
    torch.set_rng_state(marked)
    assert torch.initial_seed() != 3
    drawn = torch.randn(100)
    assert torch.equal(torch.get_rng_state()[:8], marked[:8])  # (no draw writes it)
    torch.set_rng_state(state)
    assert torch.equal(torch.randn(100), drawn)  # (no draw reads it)
    torch.set_rng_state(marked)
    torch.manual_seed(int.from_bytes(bytes(state[:8].tolist()), "little"))  # the same seed
    assert torch.equal(torch.get_rng_state()[:8], state[:8])


def test_a_dispatch_mode_may_opt_out_of_dynamos_disable_wrapper() -> None:
    """``TorchDispatchMode._should_skip_dynamo`` (lazynn's modes return False: no dynamo
    "disable" around their ``__torch_dispatch__``, whose first call imports the compiler), and
    ``torch._C._len_torch_dispatch_stack`` (the rehearsal answers by formula only when no other
    dispatch mode is active): a subprocess that enters such a mode imports no torch._dynamo."""
    import subprocess

    from torch.utils._python_dispatch import TorchDispatchMode

    assert callable(TorchDispatchMode._should_skip_dynamo)
    assert torch._C._len_torch_dispatch_stack() == 0
    code = (
        "import sys, torch\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "class M(TorchDispatchMode):\n"
        "    @classmethod\n"
        "    def _should_skip_dynamo(cls): return False\n"
        "    def __torch_dispatch__(self, f, t, a=(), k=None): return f(*a, **(k or {}))\n"
        "with M():\n"
        "    assert torch._C._len_torch_dispatch_stack() == 1\n"
        "    torch.ones(2) + 1\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_flop_counters_dispatch_mode_can_run_unwrapped() -> None:
    """``torch.utils.flop_counter._FlopCounterMode`` (its ``__torch_dispatch__``, unwrapped from
    dynamo's disable through ``__wrapped__``), ``FlopCounterMode.mod_tracker`` (entered and
    left by the counter, its ``parents`` read at each count: lazynn's counter puts a tracker
    there that enters no module) and ``flop_counts`` (where the rehearsal adds the FLOPs of
    calls it answers by formula): lazynn's counter counts torch's total, and installs no
    global module hook while it counts."""
    from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode
    from torch.utils.module_tracker import ModuleTracker

    from lazynn._rehearsal.counter import FlopCounter

    assert hasattr(_FlopCounterMode.__torch_dispatch__, "__wrapped__")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Conv1d(16, 4, 3))
    x = torch.ones(2, 8)
    counts, hooked = [], []
    for kind in (FlopCounterMode, FlopCounter):
        with kind(display=False) as counter:
            hooked.append(len(nn.modules.module._global_forward_pre_hooks))
            model[2](model[1](model[0](x)).unsqueeze(-1).expand(2, 16, 5))
        counts.append({k: dict(v) for k, v in counter.flop_counts.items()})
        assert counter.get_total_flops() == sum(counts[-1]["Global"].values())
    assert isinstance(FlopCounterMode(display=False).mod_tracker, ModuleTracker)
    assert isinstance(FlopCounterMode(display=False).mod_tracker.parents, set)
    assert counts[0]["Global"]
    assert counts[1] == {"Global": counts[0]["Global"]}
    assert hooked[0] > hooked[1]  # (torch's tracker hooks every module call; lazynn's none)


def test_a_function_mode_can_be_stepped_out_of_for_a_while() -> None:
    """``torch.overrides._get_current_function_mode`` / ``_pop_mode`` / ``_push_mode`` (lazynn's
    own work on a layer steps out of the modes it entered: ``lifecycle.own_work``): the stack's
    top, popped and pushed back; torch's device context at the bottom of the stack, another
    mode above it. own_work leaves lazynn's modes from the top down, stops at one it did not
    enter, and puts them back, even after a raise."""
    from torch.overrides import (
        TorchFunctionMode,
        _get_current_function_mode,
        _pop_mode,
        _push_mode,
    )

    from lazynn._module.lifecycle import own_modes, own_work
    from lazynn._rehearsal.meta_device import MetaDevice

    seen: list[str] = []

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(getattr(func, "__name__", "?"))
            return func(*args, **(kwargs or {}))

    device, mine, theirs = MetaDevice(), Seen(), Seen()
    with device, mine:
        assert torch._C._len_torch_function_stack() == 2
        assert _get_current_function_mode() is mine
        popped = _pop_mode()
        assert popped is mine
        assert _get_current_function_mode() is device
        _push_mode(popped)
        assert _get_current_function_mode() is mine
        with own_modes(device, mine):
            with own_work():
                assert torch._C._len_torch_function_stack() == 0
                assert torch.ones(1).device.type == "cpu"  # (the meta device left too)
            with pytest.raises(ValueError, match="inside"), own_work():
                raise ValueError("inside")
            assert _get_current_function_mode() is mine
            assert torch.ones(1).device.type == "meta"
            seen.clear()
            with theirs:  # (a mode lazynn did not enter, on top: it stays, and sees the work)
                with own_work():
                    torch.ones(1)
                assert torch._C._len_torch_function_stack() == 3
        assert seen == ["ones", "ones"]  # (theirs, then mine under it)
        with own_work():  # (no mode registered: nothing left)
            assert torch._C._len_torch_function_stack() == 2


def test_a_tensors_content_can_be_swapped_back_even_while_it_is_held_weakly() -> None:
    """``torch._C._swap_tensor_impl`` (with ``__class__`` and ``__dict__`` swapped, as
    ``torch.utils.swap_tensors`` does without its weakref check): a rehearsal gives a
    placeholder its content back after a run that made weak references to it."""
    import weakref

    import lazynn
    from lazynn._module.placeholder import relocate
    from lazynn._module.tensors import raw
    from lazynn._rehearsal.stand_ins import swap_back

    placeholder = lazynn.LazyLinear(4).weight
    other = relocate(placeholder, "meta")
    torch.utils.swap_tensors(placeholder, other)
    held = weakref.ref(placeholder)
    with pytest.raises(RuntimeError, match="weakref"):
        torch.utils.swap_tensors(placeholder, other)
    swap_back(placeholder, other)
    assert held() is placeholder
    assert raw(placeholder).device.type == "cpu"
    assert raw(other).device.type == "meta"


def test_global_module_hooks_are_kept_in_the_dicts_torch_only_reads() -> None:
    """``callers.torch_only`` reads torch's private dicts of global module hooks to know that
    a first call runs only torch's code: each public registration fills one of them."""
    module = torch.nn.modules.module
    registrations = [
        module.register_module_forward_pre_hook,
        module.register_module_forward_hook,
        module.register_module_full_backward_pre_hook,
        module.register_module_full_backward_hook,
    ]
    dicts = [
        module._global_forward_pre_hooks,
        module._global_forward_hooks,
        module._global_backward_pre_hooks,
        module._global_backward_hooks,
    ]
    for register, held in zip(registrations, dicts, strict=True):
        handle = register(lambda *args: None)
        try:
            assert len(held) == 1
        finally:
            handle.remove()
        assert not held
