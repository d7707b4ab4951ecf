from __future__ import annotations

import pytest

from registry import KNOWN_BUGS, ROWS, Row


def pytest_configure(config: pytest.Config) -> None:
    # torch's own performance note (eager LSTMs with proj_size > 0 warn it too), not a
    # warning about the code under test
    config.addinivalue_line(
        "filterwarnings", "ignore:LSTM with projections is not supported with oneDNN:UserWarning"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the (test, row id or parametrization id) pairs of registry.KNOWN_BUGS as strict
    expected failures."""
    for item in items:
        params = getattr(item, "callspec", None)
        row = params.params.get("row") if params is not None else None
        if not isinstance(row, Row):
            continue
        name = getattr(item, "originalname", item.name)
        reason = KNOWN_BUGS.get((name, params.id)) or KNOWN_BUGS.get((name, row.id))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(params=ROWS, ids=lambda r: r.id)
def row(request: pytest.FixtureRequest) -> Row:
    return request.param  # type: ignore[no-any-return]
