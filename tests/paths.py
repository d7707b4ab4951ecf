"""Where the tests find the project's files (test files sit one folder below this one, by
wing)."""

from __future__ import annotations

from pathlib import Path

#: this folder: the test helpers (registry.py, real_models/...) and golden/
TESTS = Path(__file__).resolve().parent
#: the project's root
ROOT = TESTS.parent
EXAMPLES = ROOT / "examples"
GOLDEN = TESTS / "golden"
