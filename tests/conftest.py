import pytest

from registry import ROWS, Row


@pytest.fixture(params=ROWS, ids=lambda r: r.id)
def row(request: pytest.FixtureRequest) -> Row:
    return request.param  # type: ignore[no-any-return]
