"""Twin modules made on their first touch: the twins of the blocks a rehearsal skips.

A transformer's 80 identical blocks: the memo (``memo.py``) runs the first one and reuses its
result for the others, which the forward calls but never enters. Making their twins (a meta
tensor for each parameter, a copy of each dict, for each of their modules) was a third of a
LLaMA-70B summary. So the twin (``twin.py``) leaves the modules below such a block hollow: an
object with a module's layout and nothing in it, whose first touch of any kind (an attribute
read or write, a call, ``repr``, ``len``, ``iter``, an operator, a copy) makes every module
below the block as the twin would have, turns each into its own class, and answers.
``m.__class__`` (and so ``isinstance``) is its class's without a making. Only ``type(m)`` and
``id(m)`` see a hollow module as it is: lazynn asks :func:`is_hollow` before them, and a
forward that branches on ``type()`` of a module below a later block, before anything else
touches it, sees the stand-in (a known limit: docs/design.md). A block is made as the model
was when the rest of the twin was made: where another thread may have built some of it since
(``twin.py`` checks the block's fingerprint), the touch raises :class:`Stale` and the
rehearsal runs again on a twin made whole. A hollow module the forward or a hook kept is made,
from the model as it is then, when touched after its rehearsal too (``twin.py``'s
``_Apart``).

>>> from torch import nn
>>> class Maker:
...     def make(self, key):  # (twin.py's _Deferred: fills the modules of block ``key``)
...         to_class(module, nn.Linear)
...         nn.Linear.__init__(module, 2, 3, device="meta")
>>> module = object.__new__(nn.Linear)
>>> maker = Maker()
>>> hollow(module, maker, key=0)
True
>>> is_hollow(module)
True
>>> module.out_features, type(module).__name__
(3, 'Linear')
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Maker", "Stale", "hand_over", "hollow", "is_hollow", "to_class"]

#: a hollow module's one attribute: (its maker, its block's key, its class)
_KEY = "_lazynn_hollow"


class Stale(BaseException):
    """A hollow module touched after the model changed (another thread built some of it):
    made now, its block would not be the model the rest of the twin is. The rehearsal runs
    again on a twin made at once. (A BaseException: through a forward's ``except
    Exception``, as a KeyboardInterrupt.)"""


class Maker(Protocol):
    """What makes the modules below a block (``twin.py``)."""

    def make(self, key: int) -> None:
        """Make every hollow module below block ``key``, each turned into its class."""


def _make(module: Any) -> Any:
    """``module``, made (with the rest of its block) by its maker."""
    found = object.__getattribute__(module, "__dict__").get(_KEY)
    if found is None:  # (made meanwhile: a touch inside its own making)
        return module
    found[0].make(found[1])
    if is_hollow(module):  # (its block's making failed earlier: the failure was raised then)
        raise RuntimeError("a module of a lazynn rehearsal's twin could not be made")
    return module


class _Hollow:
    """A module not made yet (see the module doc): any touch makes it, then answers."""

    def __getattribute__(self, name: str) -> Any:
        if name == "__class__":  # (isinstance against its class: answered, not made, as
            # isinstance compares the class read with the one it had before the read)
            return object.__getattribute__(self, "__dict__")[_KEY][2]
        return getattr(_make(self), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_make(self), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(_make(self), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _make(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(_make(self))

    def __dir__(self) -> list[str]:
        return dir(_make(self))

    def __bool__(self) -> bool:
        return bool(_make(self))

    def __len__(self) -> int:
        return len(_make(self))

    def __iter__(self) -> Any:
        return iter(_make(self))

    def __reversed__(self) -> Any:
        return reversed(_make(self))

    def __contains__(self, item: Any) -> bool:
        return item in _make(self)

    def __getitem__(self, key: Any) -> Any:
        return _make(self)[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        _make(self)[key] = value

    def __delitem__(self, key: Any) -> None:
        del _make(self)[key]

    def __format__(self, spec: str) -> str:
        return format(_make(self), spec)

    def __enter__(self) -> Any:
        module = _make(self)
        return type(module).__enter__(module)

    def __exit__(self, *args: Any) -> Any:
        module = _make(self)
        return type(module).__exit__(module, *args)


def _unary(fn: Callable[[Any], Any]) -> Any:
    return lambda self: fn(_make(self))


def _binary(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Any:
    if reflected:
        return lambda self, other: fn(other, _make(self))
    return lambda self, other: fn(_make(self), other)


# Operators Python looks up on the type, not the instance (``Sequential + Sequential``,
# ``with module:``): made, then the operator again, on the module. (Not ``__eq__`` and
# ``__hash__``: a module's are identity's, and a hollow one is a key in the rehearsal's dicts
# before it is made.)
_BINARY: dict[str, Callable[[Any, Any], Any]] = {"add": operator.add, "sub": operator.sub}
_BINARY.update(mul=operator.mul)
_BINARY.update(matmul=operator.matmul, truediv=operator.truediv, floordiv=operator.floordiv)
_BINARY.update(mod=operator.mod, pow=operator.pow, and_=operator.and_, or_=operator.or_)
_BINARY.update(xor=operator.xor)
for _name, _fn in _BINARY.items():
    _name = _name.rstrip("_")
    setattr(_Hollow, f"__{_name}__", _binary(_fn))
    setattr(_Hollow, f"__r{_name}__", _binary(_fn, reflected=True))
    setattr(_Hollow, f"__i{_name}__", _binary(getattr(operator, f"i{_name}")))
for _fn in (operator.lt, operator.le, operator.gt, operator.ge):
    setattr(_Hollow, f"__{_fn.__name__}__", _binary(_fn))
_UNARY: dict[str, Callable[[Any], Any]] = {"neg": operator.neg, "pos": operator.pos}
_UNARY.update(abs=abs, invert=operator.invert, int=int, float=float, index=operator.index)
_UNARY.update(str=str)
for _name, _unary_fn in _UNARY.items():
    setattr(_Hollow, f"__{_name}__", _unary(_unary_fn))


def hollow(module: Any, maker: Maker, key: int) -> bool:
    """Leave ``module`` (a new object of its class, nothing in its dict) hollow until a touch,
    then made by ``maker.make(key)``; False (and the module as it was) where its class's
    layout is not a plain module's (``__slots__``): it must be made now."""
    cls = type(module)
    try:
        object.__setattr__(module, "__class__", _Hollow)
    except TypeError:
        return False
    object.__getattribute__(module, "__dict__")[_KEY] = (maker, key, cls)
    return True


def hand_over(module: Any, maker: Maker) -> None:
    """A hollow ``module``'s maker is ``maker`` from now on (same key)."""
    attrs = object.__getattribute__(module, "__dict__")
    attrs[_KEY] = (maker, *attrs[_KEY][1:])


def is_hollow(module: Any) -> bool:
    """True while ``module`` waits for its first touch (without touching it)."""
    return type(module) is _Hollow


def to_class(module: Any, cls: type) -> dict[str, Any]:
    """Turn a hollow ``module`` into ``cls`` with an empty dict, for its maker to fill; the
    dict."""
    attrs: dict[str, Any] = object.__getattribute__(module, "__dict__")
    attrs.clear()
    object.__setattr__(module, "__class__", cls)
    return attrs
