"""lazynn.summary(): FLOPs, call counts, modes, a symbolic batch, the default view and formats.

Each figure is checked against what torch gives on the built model: FLOPs against
``FlopCounterMode`` on real tensors (the small configurations of every shipped example) and
on the full-size examples built on meta; call counts against forward hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import lazynn
from golden_models import Blocks, TiedLM, lazy_cnn
from lazynn._summary.render import SCREEN_ROWS
from paths import EXAMPLES, ROOT

sys.path.insert(0, str(EXAMPLES))
import models

#: the small configuration of every shipped example: (lazy factory, example input factory)
SMALL: dict[str, tuple[Any, Any]] = {
    **{name: (ref.lazy, ref.example) for name, ref in models.REFERENCE.items()},
    "llama_tiny": models.LAZY_ONLY["llama_tiny"],
}
#: what `python -m lazynn summary examples/models.py:NAME` shows, with the README's inputs
FULL_SIZE: dict[str, lazynn.Spec] = {
    "resnet50": lazynn.Spec((1, 3, 224, 224)),
    "gpt2_medium": lazynn.Spec((1, 1024), torch.long),
    "llama_7b": lazynn.Spec((1, 16), torch.long),
    "llama_70b": lazynn.Spec((1, 16), torch.long),
}


def counted(model: nn.Module, *inputs: Any) -> tuple[int, dict[str, int]]:
    """FlopCounterMode's total and per-module counts for one forward (module names as rows'
    paths: FlopCounterMode prefixes them with the root's class name)."""
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    root = type(model).__name__
    per_module = {
        name.removeprefix(root).removeprefix("."): sum(ops.values())
        for name, ops in counter.get_flop_counts().items()
        if name == root or name.startswith(root + ".")
    }
    return int(counter.get_total_flops()), per_module


@contextlib.contextmanager
def kernels_as_matmuls() -> Iterator[None]:
    """Attention and RNNs as the matmuls FlopCounterMode counts. On CPU, torch runs them as
    fused kernels (flash attention for CPU, oneDNN RNNs) that FlopCounterMode does not count
    at all; on meta they are matmuls, which lazynn counts (docs/summary.md)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (oneDNN's note on TF32, when its flags are set)
        with sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False):
            yield


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_flops_equal_flop_counter_on_the_built_model_with_real_tensors(
    name: str, mode: str
) -> None:
    factory, example = SMALL[name]
    x = example()
    report = lazynn.summary(factory(), x, mode=mode)
    torch.manual_seed(0)
    built = lazynn.build(factory(), x)
    built.train(mode == "train")
    with kernels_as_matmuls():
        total, per_module = counted(built, x)
    assert report.total_flops == total > 0
    rows = {r.path: r for r in report.rows}
    for path, flops in per_module.items():
        assert rows[path].flops == flops, path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_flops_of_full_size_examples_equal_flop_counter_on_meta(name: str) -> None:
    spec = FULL_SIZE[name]
    with torch.device("meta"):
        model = getattr(models, name)()
    report = lazynn.summary(model, spec)  # (repeated blocks run once: memoized)
    lazynn.build(model, spec, device="meta")
    x = torch.zeros(spec.shape, dtype=spec.dtype or torch.float32, device="meta")  # type: ignore[arg-type]
    total, _ = counted(model, x)  # every block runs
    assert report.total_flops == total > 0


def test_calls_count_every_call_of_a_shared_module() -> None:
    model = Blocks()
    report = lazynn.summary(model, (4, 6))
    lazynn.build(model, (4, 6))
    seen: dict[str, int] = {}
    for path, module in model.named_modules():
        module.register_forward_hook(
            lambda m, a, o, p=path: seen.__setitem__(p, seen.get(p, 0) + 1)
        )
    model(torch.ones(4, 6))
    assert {r.path: r.calls for r in report.rows} == {
        p: seen.get(p, 0) for p, _ in model.named_modules()
    }
    assert seen["relu"] == 4
    assert "relu (ReLU) [4 calls]" in str(report)


def test_eval_mode_runs_the_examples_in_eval_and_keeps_the_model_modes() -> None:
    factory, _ = SMALL["resnet50"]
    model = factory()
    modes = [m.training for m in model.modules()]
    with pytest.raises(lazynn.InferenceError, match="Expected more than 1 value per channel"):
        lazynn.summary(model, (1, 3, 16, 16))  # train: layer4's BatchNorm sees one value
    report = lazynn.summary(model, (1, 3, 16, 16), mode="eval")
    assert report.mode == "eval"
    assert report.rows[-1].outputs[0][0] == (1, 10)
    assert [m.training for m in model.modules()] == modes
    assert lazynn.is_lazy(model)
    with pytest.raises(lazynn.LazynnError, match="mode='train' or mode='eval'"):
        lazynn.summary(model, (1, 3, 16, 16), mode="inference")


@pytest.mark.parametrize("name", ["cnn", "gpt", "lstm_tagger"])
def test_symbolic_batch_reads_b_and_counts_per_sample(name: str) -> None:
    factory, example = SMALL[name]
    x = example()
    spec = lazynn.Spec(("B", *x.shape[1:]), x.dtype)
    symbolic = lazynn.summary(factory(), spec, mode="eval")
    assert symbolic.batch == "B"
    assert symbolic.inputs[0][0] == ("B", *x.shape[1:])
    for n in (2, 5):  # the shapes at two batch sizes: B is the batch, wherever it goes
        at = lazynn.summary(factory(), lazynn.Spec((n, *x.shape[1:]), x.dtype), mode="eval")
        for row, fixed in zip(symbolic.rows, at.rows, strict=True):
            for (dims, _), (sizes, _) in zip(row.outputs, fixed.outputs, strict=True):
                expected = tuple(
                    s if isinstance(d, int) else n * (int(d[:-1]) if len(d) > 1 else 1)
                    for d, s in zip(dims, sizes, strict=True)
                )
                assert expected == sizes, row.path
        assert at.total_parameters == symbolic.total_parameters
    one = lazynn.summary(factory(), lazynn.Spec((1, *x.shape[1:]), x.dtype), mode="eval")
    assert symbolic.total_flops == one.total_flops  # per sample
    assert "B: the batch dimension" in str(symbolic)
    torch.manual_seed(0)
    free = lazynn.build(factory(), spec)  # (a build runs a free batch as a number)
    torch.manual_seed(0)
    fixed = lazynn.build(factory(), lazynn.Spec((2, *x.shape[1:]), x.dtype))
    assert free.state_dict().keys() == fixed.state_dict().keys()
    for a, b in zip(free.state_dict().values(), fixed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_spec_parse_of_a_symbolic_batch_and_bad_dimensions() -> None:
    assert lazynn.Spec.parse("Bx3x224x224").shape == ("B", 3, 224, 224)
    assert lazynn.Spec.parse("1X3X224X224").shape == (1, 3, 224, 224)  # as before: X too
    assert lazynn.Spec.parse("nx16").shape == ("n", 16)
    with pytest.raises(lazynn.InferenceError, match="dimensions that are sizes") as e:
        lazynn.Spec.parse("1x-3")
    assert "Fix: fix the shape" not in str(e.value)
    with pytest.raises(lazynn.InferenceError, match=r"integers >= 1.*'0x3', with 0"):
        lazynn.Spec.parse("0x3")  # the command line's --input; lazynn.Spec((0, 3)) is torch's
    with pytest.raises(lazynn.LazynnError, match="one symbolic dimension"):
        lazynn.summary(lazy_cnn(), lazynn.Spec(("B", 3, 8, 8)), lazynn.Spec(("N", 3)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_default_view_of_full_size_examples_fits_a_screen(name: str) -> None:
    with torch.device("meta"):
        model = getattr(models, name)()
    text = str(lazynn.summary(model, FULL_SIZE[name]))
    lines = text.splitlines()
    body = [line for line in lines if line.startswith(" ")]  # the module rows below the root
    assert len(body) < SCREEN_ROWS
    assert len(lines) <= SCREEN_ROWS + 20  # header, totals and notes
    assert max(map(len, lines)) <= 100


@pytest.mark.parametrize("name", sorted(SMALL))
def test_default_view_of_small_examples_fits_100_columns(name: str) -> None:
    factory, example = SMALL[name]
    lines = str(lazynn.summary(factory(), example())).splitlines()
    assert max(map(len, lines)) <= 100
    assert len(lines) <= SCREEN_ROWS + 20


def test_depth_and_expand() -> None:
    report = lazynn.summary(Blocks(), (4, 6))
    collapsed = report.render().splitlines()
    (run,) = [line for line in collapsed if "0-2 (Block) x3" in line]
    assert run.split()[-2] == "486"  # the run's total: 3 blocks x (84 + 78)
    (fc1,) = [line for line in collapsed if "fc1 (" in line]
    assert fc1.split()[-2] == "84"  # a row under the run: one block
    expanded = report.render(expand=True)
    assert all(f"    {i} (Block)" in expanded for i in range(3))
    assert "x3" not in expanded
    top = report.render(depth=1)
    assert "(Block)" not in top
    (blocks,) = [line for line in top.splitlines() if "blocks (Sequential)" in line]
    assert blocks.split()[-2] == "486"  # hidden submodules: counted in their parent's row
    assert "Depth 1 of 3 shown" in top
    rows = [line for line in report.render(depth=0).splitlines() if line.startswith("Blocks ")]
    assert len(rows) == 1  # the model's row alone
    assert rows[0].split()[-2] == "500"
    with pytest.raises(lazynn.ArgumentError, match="expected depth: an integer of 0 or more"):
        report.render(depth=-1)  # (an ArgumentError is a ValueError, as the error was)
    with pytest.raises(ValueError, match="format"):
        report.render(format="html")
    with pytest.raises(lazynn.ArgumentError, match=r"unknown columns \['nope'\]"):
        report.render(columns=("params", "nope"))
    narrow = report.render(width=60)
    assert max(map(len, narrow.splitlines())) <= 60


def test_json_has_the_documented_fields_and_round_trips() -> None:
    report = lazynn.summary(Blocks(), (4, 6))
    data = json.loads(report.render(format="json"))
    assert data == json.loads(json.dumps(report.to_dict()))
    for key in ("total_parameters", "trainable_parameters", "total_flops", "parameter_bytes"):
        assert isinstance(data[key], int), key
    assert data["total_parameters"] == report.total_parameters
    assert data["total_flops"] == report.total_flops
    assert data["inputs"] == [{"shape": [4, 6], "dtype": "float32"}]
    assert [r["path"] for r in data["rows"]] == [r.path for r in report.rows]
    assert sum(r["num_parameters"] for r in data["rows"]) == data["total_parameters"]
    assert data["memory"] is None


def _fields(record: object) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]


@pytest.mark.parametrize("training", [False, True])
def test_json_keys_are_the_field_names_of_the_summary_and_of_each_row(training: bool) -> None:
    """One name for each figure: the JSON says what the Python attribute says."""
    report = lazynn.summary(TiedLM(), lazynn.Spec((2, 5), torch.long), training=training)
    data = json.loads(report.render(format="json"))
    assert set(data) == _fields(lazynn.Summary)
    for row, record in zip(data["rows"], report.rows, strict=True):
        assert set(row) == _fields(lazynn.SummaryRow)
        for name in _fields(lazynn.SummaryRow) - {"inputs", "outputs", "parameters", "tied"}:
            assert row[name] == getattr(record, name), name
        assert row["parameters"] == {k: list(v) for k, v in record.parameters}
        assert row["tied"] == dict(record.tied)
        assert [s["shape"] for s in row["outputs"]] == [list(s.shape) for s in record.outputs]
    tied = [row for row in data["rows"] if row["tied"]]
    assert tied, "the model has a tied weight"


def test_the_summary_documents_each_of_its_fields_and_each_rows() -> None:
    for record in (lazynn.Summary, lazynn.SummaryRow):
        attributes = record.__doc__.split("Attributes:")[1]  # type: ignore[union-attr]
        listed = re.findall(r"^        (\w+): ", attributes, re.MULTILINE)
        assert listed == [f.name for f in dataclasses.fields(record)]


def test_readme_shows_what_the_main_job_prints(capsys: pytest.CaptureFixture[str]) -> None:
    from lazynn._cli.main import main

    root = ROOT
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Summary, and the command line") :]
    shown = section[section.index("```text\n") + len("```text\n") :]
    shown = shown[: shown.index("```")]
    target = str(root / "examples" / "models.py") + ":gpt2_medium"
    assert main(["summary", target, "--input", "1x1024:long"]) == 0
    assert capsys.readouterr().out == shown


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_training_memory_in_the_summary_and_its_json(optimizer: str) -> None:
    from lazynn._summary.memory import training_memory

    report = lazynn.summary(Blocks(), (4, 6), training=True, optimizer=optimizer)
    assert report.memory == training_memory(Blocks(), ((4, 6),), {}, optimizer)
    memory = report.to_dict()["memory"]
    assert set(memory) >= {"params", "gradients", "optimizer_states", "activations", "total"}
    assert memory["total"] == sum(
        memory[k] for k in ("params", "gradients", "optimizer_states", "activations")
    )
    assert f"Training memory ({report.memory.optimizer}" in str(report)  # type: ignore[union-attr]
    per_sample = lazynn.summary(Blocks(), lazynn.Spec(("B", 6)), training=True).memory
    one = training_memory(Blocks(), ((1, 6),), {})
    assert per_sample == one  # activations per sample, from batches of 2 and 3
    assert lazynn.summary(Blocks(), (4, 6)).memory is None


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = lazynn.LazyLinear(8), lazynn.LazyLinear(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


class _ShapesVary(nn.Module):
    """One block run at two shapes, a twin skipped at each: memoized rows must add per call."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Pair() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks[1](self.blocks[0](x))
        z = self.blocks[1](y[:2])
        w = self.blocks[0](self.blocks[0](x))  # a block skipped against its own first call
        return self.blocks[2](z) + w[:2]


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(_Pair(), _Pair())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "factory",
    [_ShapesVary, lambda: nn.Sequential(_Nested(), _Nested(), _Nested()), Blocks],
    ids=["shapes-vary", "nested", "shared-relu"],
)
def test_rows_count_each_call_as_a_real_forward_does(factory: Any) -> None:
    """Blocks alike, called at several shapes or shared: every row's calls, FLOPs and
    first-call shapes are those of the built model's real forward (hooks and
    FlopCounterMode)."""
    shape = (4, 8) if factory is not Blocks else (4, 6)
    model = factory()
    report = lazynn.summary(model, shape)
    lazynn.build(model, shape)
    seen: dict[str, list[Any]] = {}
    counter = FlopCounterMode(display=False)
    for path, module in model.named_modules():

        def hook(m: nn.Module, a: Any, o: Any, path: str = path) -> None:
            seen.setdefault(path, []).append((tuple(a[0].shape), tuple(o.shape)))

        module.register_forward_hook(hook)
    with counter:
        model(torch.ones(shape))
    rows = {r.path: r for r in report.rows}
    assert {p: r.calls for p, r in rows.items() if r.calls} == {p: len(c) for p, c in seen.items()}
    for path, calls in seen.items():
        assert rows[path].inputs[0].shape == calls[0][0]
        assert rows[path].outputs[0].shape == calls[0][1]
    assert report.total_flops == counter.get_total_flops()


@pytest.mark.parametrize("depth", [1, 2])
def test_rows_at_a_depth_limit_hold_their_submodules_flops_and_params(depth: int) -> None:
    """A container never called itself (a ModuleList) counts its submodules' FLOPs, so the
    rows of a depth-1 view add up to the totals, as the note says."""
    factory, example = SMALL["gpt"]
    report = lazynn.summary(factory(), example())
    text = report.render(depth=depth, columns=("params", "flops"), width=None)
    (blocks,) = [line for line in text.splitlines() if "blocks (ModuleList)" in line]
    inside = [r for r in report.rows if r.path.startswith("blocks.")]
    assert blocks.split()[-1] != "--"
    if depth == 1:
        assert int(blocks.split()[-2].replace(",", "")) == sum(r.num_parameters for r in inside)
    top = [r for r in report.rows if r.depth == 1 and not r.path.startswith("blocks")]
    flops = sum(r.flops for r in top) + sum(r.flops for r in inside if r.depth == 2)
    assert flops == report.total_flops  # (the blocks' own rows, and the rest)


def test_blocks_that_differ_in_buffers_or_trainability_do_not_collapse() -> None:
    def stack() -> nn.Sequential:
        return nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)))

    same = stack()
    assert "0-2 (Sequential) x3" in lazynn.summary(same, (2, 8)).render()
    extra = stack()
    extra[2].register_buffer("extra", torch.zeros(1000))
    frozen = stack()
    frozen[1].requires_grad_(False)
    for model, run in ((extra, "0-1 (Sequential) x2"), (frozen, "0 (Sequential)")):
        text = lazynn.summary(model, (2, 8)).render(columns=("params", "buffer_bytes"))
        assert run in text
        assert "0-2 (Sequential) x3" not in text


def test_symbolic_batch_refuses_what_it_cannot_describe() -> None:
    class Flattens(nn.Module):  # a size read from the flattened batch
        def __init__(self) -> None:
            super().__init__()
            self.fc = lazynn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.reshape(-1))  # type: ignore[no-any-return]

    with pytest.raises(
        lazynn.InferenceError, match=r"'fc.weight'.*\[4, 16\] at B=2, \[4, 24\] at B=3"
    ):
        lazynn.summary(Flattens(), lazynn.Spec(("B", 8)))
    with pytest.raises(lazynn.InferenceError, match=r"ran the symbolic batch 'B' as 2"):
        lazynn.summary(nn.Bilinear(8, 8, 3), lazynn.Spec(("B", 8)), torch.zeros(3, 8))
    with pytest.raises(lazynn.LazynnError, match="as the batch only"):
        lazynn.summary(nn.Linear(8, 2), lazynn.Spec((2, "T")))


def test_training_estimate_refusing_a_batch_of_one_says_it_runs_in_training_mode() -> None:
    model = nn.Sequential(lazynn.LazyLinear(4), lazynn.LazyBatchNorm1d())
    assert lazynn.summary(model, (1, 8), mode="eval").mode == "eval"
    with pytest.raises(lazynn.InferenceError, match="runs them in training mode") as info:
        lazynn.summary(model, (1, 8), mode="eval", training=True)
    assert "mode='eval'" not in str(info.value).split("Fix:")[-1]


def test_a_repl_and_a_notebook_show_the_table() -> None:
    report = lazynn.summary(Blocks(), (4, 6))
    table = str(report)
    assert table.splitlines()[0].startswith("Blocks: input [4, 6]")
    assert repr(report) == table  # (a dataclass's repr would list every field and row)
    shown: list[str] = []

    class Printer:  # IPython's pretty printer, as _repr_pretty_ uses it
        def text(self, text: str) -> None:
            shown.append(text)

    report._repr_pretty_(Printer(), cycle=False)
    assert shown == [table]
    page = report._repr_html_()
    assert page.startswith("<pre>")
    assert page.endswith("</pre>")
    assert html.unescape(page[5:-6]) == table
    assert "->" in table
    assert "->" not in page  # (escaped: the arrows of lazy rows stay text, not markup)
