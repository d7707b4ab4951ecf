"""The zoo job's process (README.md here): tests/ on the import path, for the distributed
harness the repository's other distributed tests use (tests/distributed_util.py); one
intra-op thread; the versions, and whether torchvision's extension loaded, in pytest's
header."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # spawned ranks inherit it


def pytest_report_header(config: pytest.Config) -> list[str]:
    import torchvision_ops

    torchvision_ops.prepare()

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    why = torchvision_ops.schemas_defined()
    extension = (
        "loaded" if why is None else f"not loaded ({why}): torchvision_ops.py defined its schemas"
    )
    packages = ("torch", "timm", "torchvision", "torchtitan", "lazynn")
    return [", ".join(map(installed, packages)), f"torchvision's C++ extension: {extension}"]


def pytest_configure(config: pytest.Config) -> None:
    # One intra-op thread, as each spawned rank has (tests/distributed_util.py): the models
    # are small, and two OpenMP threads on two cores shared with other work wait on each
    # other (a 64x64 forward of fastvit_t8: 0.03 s on one thread, 0.3 to 2.7 s on two).
    import torch

    torch.set_num_threads(1)
