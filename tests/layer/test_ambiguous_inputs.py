"""First inputs a layer may read other than meant (issue 20): a forgotten batch dimension, a
batch without its channel dimension, channels-last images. The layer is built as torch reads
the input (unbatched inputs stay accepted); an AmbiguousInputWarning says how to give the
other reading: at the first call, at ``lazynn.build``, in a failure's message, and in the
summary's row."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import lazynn
from lazynn._layer.infer import ambiguity

# (lazy layer, input shape, the phrase of its note, or None: a plain reading)
CASES = [
    (lambda: lazynn.LazyConv2d(4, 3), (8, 28, 28), "give (8, 1, 28, 28) for one channel"),
    (lambda: lazynn.LazyConv2d(4, 3), (3, 224, 224), "add it: (1, 3, 224, 224)"),
    (lambda: lazynn.LazyConv1d(4, 3), (16, 100), "give (16, 1, 100) for one channel"),
    (lambda: lazynn.LazyConv3d(4, 3), (2, 8, 8, 8), "add it: (1, 2, 8, 8, 8)"),
    (lambda: lazynn.LazyConvTranspose2d(4, 3), (3, 9, 9), "as one unbatched (C, H, W)"),
    (lambda: lazynn.LazyInstanceNorm2d(), (3, 9, 9), "as one unbatched (C, H, W)"),
    (lambda: lazynn.LazyConv2d(4, 3), (1, 224, 224, 3), "give (1, 3, 224, 224)"),
    (lambda: lazynn.LazyConv2d(4, 3), (2, 32, 32, 4), "(x.permute(0, 3, 1, 2))"),
    (lambda: lazynn.LazyBatchNorm2d(), (2, 32, 32, 3), "channels-last (N, H, W, C)"),
    (lambda: lazynn.LazyConv3d(4, 1), (1, 16, 16, 16, 1), "give (1, 1, 16, 16, 16)"),
    # plain readings: batched images, a late feature map, many channels at their own size
    (lambda: lazynn.LazyConv2d(4, 3), (2, 3, 224, 224), None),
    (lambda: lazynn.LazyConv2d(4, 1), (2, 512, 4, 4), None),
    (lambda: lazynn.LazyConv2d(4, 3), (2, 64, 64, 64), None),
    (lambda: lazynn.LazyConv1d(4, 3), (2, 100, 3), None),
    (lambda: lazynn.LazyBatchNorm1d(), (8, 16), None),
    (lambda: lazynn.LazyLinear(4), (3, 224, 224), None),
]
IDS = [f"{make().__class__.__name__}-{'x'.join(map(str, shape))}" for make, shape, _ in CASES]


@pytest.mark.parametrize(("make", "shape", "phrase"), CASES, ids=IDS)
def test_first_call_warns_and_builds_as_torch_reads(make, shape, phrase) -> None:  # type: ignore[no-untyped-def]
    layer = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(torch.randn(shape))
    notes = [w for w in caught if issubclass(w.category, lazynn.AmbiguousInputWarning)]
    if phrase is None:
        assert notes == []
        return
    assert len(notes) == 1
    assert phrase in str(notes[0].message)
    assert notes[0].filename == __file__  # the user's line, not torch's container
    # built as torch reads the input: torch's unbatched and channel readings are kept
    read = getattr(layer, "in_channels", getattr(layer, "num_features", None))
    assert read == shape[0 if "unbatched" in str(notes[0].message) else 1]


@pytest.mark.parametrize("form", ["instance", "factory"])
@pytest.mark.parametrize(("make", "shape", "phrase"), CASES, ids=IDS)
def test_build_warns_the_same(make, shape, phrase, form: str) -> None:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if form == "instance":
            lazynn.build(nn.Sequential(make()), shape)
        else:  # the factory form: lazynn.build(Net, example)
            lazynn.build(lambda: nn.Sequential(make()), shape)
    notes = [w for w in caught if issubclass(w.category, lazynn.AmbiguousInputWarning)]
    assert len(notes) == (phrase is not None)
    if phrase is not None:
        assert "at '0' " in str(notes[0].message)
        assert phrase in str(notes[0].message)
        assert notes[0].filename == __file__


def _resnet_stem() -> nn.Module:
    return nn.Sequential(
        lazynn.LazyConv2d(8, 7, stride=2, padding=3), lazynn.LazyBatchNorm2d(), nn.ReLU()
    )


def test_a_failure_after_an_unbatched_reading_says_where_it_began() -> None:
    # a forgotten batch dimension is blamed on the next layer by torch; the error names the
    # layer that read the input as unbatched, with the fix, and the model is unchanged
    model = _resnet_stem()
    with pytest.raises(lazynn.InferenceError) as info:
        lazynn.build(model, (3, 32, 32))
    text = str(info.value)
    assert text.startswith("LazyBatchNorm2d at '1': expected a 4-d (N, C, H, W) input")
    assert "Note: LazyConv2d at '0' reads its input (3, 32, 32) as one unbatched" in text
    assert "add it: (1, 3, 32, 32). Fix: " in text
    assert lazynn.is_lazy(model[0])


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_summary_row_carries_the_note(form: str) -> None:
    """Of a model or of a factory (whose model the summary builds on meta first)."""
    target = _resnet_stem() if form == "instance" else _resnet_stem
    summary = lazynn.summary(target, (1, 32, 32, 3))
    row = next(r for r in summary.rows if r.path == "0")
    assert "channels-last" in row.note
    assert all(not r.note for r in summary.rows if r.path != "0")
    table = str(summary)
    assert "0 (LazyConv2d -> Conv2d) !" in table
    assert "! LazyConv2d at '0' reads in_channels=32 from dimension 1 of (1, 32, 32, 3)" in table
    assert json.loads(summary.render(format="json"))["rows"][1]["note"] == row.note
    assert "- LazyConv2d at '0' reads" in summary.render(format="markdown")


def test_every_door_marks_the_reading(tmp_path: Any) -> None:
    """The command line (which summarizes a factory) marks the row and prints the note; build
    of an instance or a factory, and a first call, warn it."""
    script = tmp_path / "stem.py"
    script.write_text(
        "import lazynn\nfrom torch import nn\n\n"
        "def stem():\n    return nn.Sequential(lazynn.LazyConv2d(8, 3), lazynn.LazyBatchNorm2d())\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "lazynn", "summary", f"{script}:stem", "--input", "1x32x32x3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "0 (LazyConv2d -> Conv2d) !" in out
    assert "! LazyConv2d at '0' reads in_channels=32" in out
    for door in (
        lambda: lazynn.build(_resnet_stem(), (1, 32, 32, 3)),
        lambda: lazynn.build(_resnet_stem, (1, 32, 32, 3)),
        lambda: _resnet_stem()(torch.randn(1, 32, 32, 3)),
    ):
        with pytest.warns(lazynn.AmbiguousInputWarning, match="channels-last"):
            door()


def test_warning_can_be_silenced_where_the_reading_is_meant() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=lazynn.AmbiguousInputWarning)
        layer = lazynn.LazyConv2d(4, 3)
        layer(torch.randn(3, 9, 9))  # one unbatched sample, as meant
    assert layer.in_channels == 3


_IMAGE = st.integers(5, 64)


@given(n=st.integers(1, 8), c=st.integers(1, 4), h=_IMAGE, w=_IMAGE)
def test_batched_images_are_never_flagged(n: int, c: int, h: int, w: int) -> None:
    spec = lazynn.LazyConv2d.inferred["in_channels"]
    assert ambiguity(spec, (n, c, h, w), "in_channels") is None


@given(n=st.integers(1, 8), c=st.integers(1, 4), side=_IMAGE)
def test_channels_last_images_get_the_permuted_shape(n: int, c: int, side: int) -> None:
    spec = lazynn.LazyConv2d.inferred["in_channels"]
    note = ambiguity(spec, (n, side, side, c), "in_channels")
    assert note is not None
    assert f"give ({n}, {c}, {side}, {side})" in note
