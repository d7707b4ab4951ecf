from __future__ import annotations

import pytest

from registry import ROWS, Row

# torchrl's own tests, run in a pytest process of their own (ecosystem/torchrl/README.md): their
# conftest points torch's lazy names at lazynn's, which this suite's process must never do.
# The real zoos too (ecosystem/zoos/README.md): they need timm and torchvision, which lazynn
# never depends on, and minutes of their own.
collect_ignore = ["ecosystem/torchrl", "ecosystem/zoos"]


def pytest_configure(config: pytest.Config) -> None:
    # torch's own performance note (eager LSTMs with proj_size > 0 warn it too), not a
    # warning about the code under test
    config.addinivalue_line(
        "filterwarnings", "ignore:LSTM with projections is not supported with oneDNN:UserWarning"
    )
    # (and its note on even kernels with padding="same", given once per process)
    config.addinivalue_line(
        "filterwarnings", "ignore:Using padding='same' with even kernel lengths:UserWarning"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # distributed and compile tests take seconds each: -m "not slow" leaves them out too
    for item in items:
        if item.get_closest_marker("distributed") or item.get_closest_marker("compile"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=ROWS, ids=lambda r: r.id)
def row(request: pytest.FixtureRequest) -> Row:
    return request.param  # type: ignore[no-any-return]
