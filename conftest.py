"""The test harness for the doctests (README.md, docs/, src/lazynn); tests/conftest.py serves
tests/.

Doctests keep their globals until the process exits. doctest clears an example's globals
dict when the example ends, but torch.compile installs names of its own in the globals of
each frame it compiles (``__builtins_dict___N``, ``__resume_at_...``) and deletes them when
the compiled function's code object is freed. For a function a doctest defines (a lambda
compiled in src/lazynn/_module/registries.py, a model in docs/when-to-build.md) that is at
interpreter exit, after pytest's summary, and the names are gone: dynamo's cleanup raises
``KeyError: '__builtins_dict___N'`` in a weakref callback, which Python prints as
"Exception ignored in: ..." tracebacks below the summary (``torch.compiler.reset()`` at the
example's end does not free every such code object). Kept, the globals (a few small dicts)
are freed at exit with the code, and their names are there for dynamo to delete; nothing of
torch is patched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _pytest.doctest import DoctestItem


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    runner = item.runner if isinstance(item, DoctestItem) else None
    if runner is None:
        return (yield)
    run = runner.run

    def keep_globals(*args: Any, **kwargs: Any) -> Any:
        return run(*args, **{**kwargs, "clear_globs": False})

    runner.run = keep_globals  # type: ignore[method-assign]
    try:
        return (yield)
    finally:
        del runner.run
