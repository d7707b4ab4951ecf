"""lazy(): any module class made lazy in one line.

``LazyFoo = lazynn.lazy(Foo, in_dim=lazynn.Infer(dim=-1))`` declares a :class:`LazyLayer` whose
constructor takes ``Foo``'s arguments minus ``in_dim``; the first input (or a checkpoint, or
``lazynn.build``) decides ``in_dim``, and the module then *is* a ``Foo``, with the numbers
``Foo(in_dim, ...)`` draws under the same seed. Every guarantee of lazynn's own layers holds:
placeholders from construction (``parameters()`` is complete), checks before the build,
atomic failure, copies, checkpoints, threads.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from torch import nn

from .._errors import ArgumentError, message
from .base import LazyLayer
from .infer import Infer

__all__ = ["lazy"]


def lazy(cls: type[nn.Module], /, **inferred: Infer) -> type[LazyLayer]:
    """A lazy version of ``cls``: the named constructor arguments are read from the inputs.

    Args:
        cls: an ``nn.Module`` subclass with an explicit ``__init__`` signature. If it takes
            ``device`` and ``dtype`` arguments (as torch.nn layers do) they are used;
            otherwise it is constructed under ``torch.device(...)``.
        **inferred: constructor argument name -> :class:`lazynn.Infer`, where to read it.

    Returns:
        A lazy layer class named ``Lazy<cls name>`` (a subclass of ``cls`` and of
        :class:`lazynn.LazyModuleMixin`) whose instances become ``cls`` when built.

    >>> import torch, lazynn
    >>> from torch import nn
    >>> class Scale(nn.Module):
    ...     def __init__(self, features, init=1.0, device=None, dtype=None):
    ...         super().__init__()
    ...         self.features = features
    ...         full = torch.full((features,), init, device=device, dtype=dtype)
    ...         self.weight = nn.Parameter(full)
    ...     def forward(self, x):
    ...         return x * self.weight
    >>> LazyScale = lazynn.lazy(Scale, features=lazynn.Infer(dim=-1))
    >>> layer = LazyScale(init=2.0)
    >>> layer(torch.ones(2, 3))
    tensor([[2., 2., 2.],
            [2., 2., 2.]], grad_fn=<MulBackward0>)
    >>> type(layer).__name__, layer.features
    ('Scale', 3)
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ArgumentError(
            message(
                "lazynn.lazy",
                "an nn.Module subclass",
                repr(cls),
                "pass the class: lazynn.lazy(nn.GroupNorm, num_channels=lazynn.Infer(dim=1))",
            )
        )
    if not inferred:
        raise ArgumentError(
            message(
                f"lazy({cls.__name__})",
                "the constructor arguments to infer, each named with a lazynn.Infer",
                "none",
                f"name them: lazy({cls.__name__}, in_features=lazynn.Infer(dim=-1))",
            )
        )
    signature = inspect.signature(cls.__init__)
    params = list(signature.parameters.values())
    # (**kwargs is fine: the inferred names are explicit, the rest pass through by name;
    # *args could not be named)
    variadic = [p.name for p in params if p.kind is p.VAR_POSITIONAL]
    unknown = sorted(set(inferred) - {p.name for p in params[1:]})
    if unknown or variadic:
        received = [f"unknown {unknown}"] if unknown else []
        if variadic:
            received.append(f"an __init__ taking *{variadic}, whose names lazy() cannot see")
        raise ArgumentError(
            message(
                f"lazy({cls.__name__})",
                f"constructor arguments of {cls.__name__} to infer",
                "; ".join(received),
                "name arguments of its explicit signature, or subclass lazynn.LazyLayer",
            )
        )
    for name, spec in inferred.items():
        if not isinstance(spec, Infer):
            raise ArgumentError(
                message(
                    f"lazy({cls.__name__})",
                    f"{name}= a lazynn.Infer (where the input tells it)",
                    repr(spec),
                    f"pass {name}=lazynn.Infer(dim=...)",
                )
            )
    kept = [params[0], *(p for p in params[1:] if p.name not in inferred)]
    reduced = signature.replace(parameters=kept)
    without_self = reduced.replace(parameters=kept[1:])
    keywords = [p.name for p in kept if p.kind is p.VAR_KEYWORD]

    def __init__(self: LazyLayer, *args: Any, **kwargs: Any) -> None:
        bound = without_self.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for extra in keywords:  # **kwargs of the class's own: passed on by name
            arguments.update(arguments.pop(extra, {}))
        self._lazynn_setup(**arguments)

    __init__.__signature__ = reduced  # type: ignore[attr-defined]
    name = f"Lazy{cls.__name__}"
    doc = (
        f"``{cls.__name__}`` with {', '.join(f'``{n}``' for n in inferred)} read from the "
        f"first input; other arguments as ``{cls.__name__}``. Made by ``lazynn.lazy``."
    )
    namespace = {
        "__init__": __init__,
        "__doc__": doc,
        # The caller's module, so that `LazyFoo = lazy(Foo, ...)` at module level pickles.
        "__module__": sys._getframe(1).f_globals.get("__name__", cls.__module__),
        "__qualname__": name,
        "cls_to_become": cls,
        "inferred": dict(inferred),
    }
    return type(name, (LazyLayer, cls), namespace)
