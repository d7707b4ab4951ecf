"""Make ``import torchvision`` work beside torch's CPU build when torchvision's C++ extension
cannot load (README.md here, "torchvision on a CPU torch").

torchvision 0.28.0 is the release for torch 2.13, and its only wheel on the package index is
a CUDA build: its extension (``torchvision/_C.so``) links ``libc10_cuda.so``, which torch's CPU
build lacks, so it does not load. torchvision then goes on without its operators (``nms``,
``roi_align``...), as it is meant to, except in one place: ``torchvision/_meta_registrations.py``
registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` without first asking
whether the extension loaded (its other meta kernels ask), and registering a kernel for an
operator nobody defined raises ``RuntimeError: operator torchvision::nms does not exist``, so
``import torchvision``, and timm's with it, fails.

:func:`prepare` runs before torchvision is first imported. It loads the extension as
torchvision would (``torch.ops.load_library`` of the same file); if that works, nothing else is
done. If it fails, it defines those two operators' schemas (the ones torchvision's C++ code
defines) in torch's operator registry, with no kernel: the import then succeeds, and calling
``torchvision.ops.nms`` raises torchvision's own "Couldn't load custom C++ ops" error, as on any
install whose extension did not load. Nothing of torch's is patched, and only this test job's
processes run it (its conftest.py, and each spawned rank through zoo.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

import torch

__all__ = ["prepare", "schemas_defined"]

#: what torchvision/csrc/ops/nms.cpp and ops/quantized/cpu/qnms_kernel.cpp define
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

# Kept for the life of the process: a torch.library.Library drops its definitions when freed.
_library: torch.library.Library | None = None
_reason: str | None = None


def _extension_path() -> str | None:
    """Where torchvision's ``_C`` extension lies (found as torchvision finds it), or None;
    torchvision itself is not imported."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = next(iter(spec.submodule_search_locations))
    finder = importlib.machinery.FileFinder(
        folder,
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    )
    found = finder.find_spec("_C")
    return None if found is None else found.origin


def prepare() -> None:
    """Before the first ``import torchvision``: if its extension does not load, define the two
    operator schemas its import needs (see the module doc). Idempotent."""
    global _library, _reason
    if _library is not None or "torchvision" in sys.modules:
        return
    path = _extension_path()
    if path is None:
        return  # no torchvision, or one without an extension: its import decides
    try:
        torch.ops.load_library(path)
    except OSError as error:
        cause = error.__cause__ or error.__context__  # the loader's own message, if any
        _reason = f"{error}: {cause}" if cause else str(error)
        _library = torch.library.Library("torchvision", "DEF")
        for schema in SCHEMAS:
            _library.define(schema)


def schemas_defined() -> str | None:
    """Why the schemas were defined (the extension's load error), or None if they were not."""
    return _reason
