"""Benchmark: building a model with lazynn against eager construction and torch's lazy modules.

Each contender runs in a fresh Python process and builds the model twice: "cold" (the first
build in the process, paying torch's first-use costs) and "warm" (the second). Time is wall
time of the build (construction included); memory is the peak resident set size during the
build minus the resident size just before it (Linux: /proc/self/clear_refs resets the peak).
Results are reported as ratios to eager construction measured the same way in the same run.

    python benchmarks/bench_build.py                # all; prints the markdown tables
    python benchmarks/bench_build.py --out FILE     # ... and writes them to FILE
    python benchmarks/bench_build.py --quick        # small models, a smoke run (used by tests)
    python benchmarks/bench_build.py --models mlp,resnet50 --contenders eager,lazynn.build

Contenders:
  eager          the model written with explicit sizes (the baseline)
  lazynn.build   the lazynn model + lazynn.build(model, Spec) (meta rehearsal, one allocation)
  lazynn.build(factory)  lazynn.build(Net, Spec): the factory form (a draft on meta, a
                 rehearsal, the real construction with every size known)
  torch-nograd   torch's nn.Lazy* twin + a real dry run under torch.no_grad()
  torch-autograd the same with autograd on, as torch's docs show it
  meta+to_empty  the eager model constructed on meta, then to_empty() + reset_parameters()
and, for the LLaMA-7B/70B-shaped lazy models built under torch.device("meta"):
  build(meta)    lazynn.build(model, Spec, device="meta")
  summary        lazynn.summary(model, Spec)
whose memory is reported as MiB above the process's size right after `import lazynn`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = [
    "eager",
    "lazynn.build",
    "lazynn.build(factory)",
    "torch-nograd",
    "torch-autograd",
    "meta+to_empty",
]
MODELS = {"gpt2-medium": "gpt", "resnet50": "resnet50", "mlp": "mlp", "unet (60 layers)": "unet"}
QUICK = {"cnn": "cnn"}
LLAMAS = ["llama_7b", "llama_70b"]
WARM_RUNS = 5


# --- measuring, inside a worker process -------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _measure(fn: Any) -> tuple[float, int, Any]:
    gc.collect()
    _reset_peak()
    before = _rss()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    return elapsed, _peak() - before, result


def with_torch_lazy(models: Any, ref: Any) -> Any:
    """The reference's lazy model with torch's nn.Lazy* classes (same names and arguments)."""
    import torch

    saved = {
        n: getattr(models, n)
        for n in ("LazyLinear", "LazyConv2d", "LazyBatchNorm2d", "LazyConvTranspose2d")
    }
    try:
        for name in saved:
            setattr(models, name, getattr(torch.nn, name))
        return ref.lazy()
    finally:
        for name, cls in saved.items():
            setattr(models, name, cls)


def _worker(contender: str, model_key: str, quick: bool) -> dict[str, Any]:
    import torch

    import lazynn

    sys.path.insert(0, str(ROOT / "examples"))
    import models

    ref = (models.REFERENCE if quick else models.FULL)[model_key]
    example = ref.example("cpu")
    spec = lazynn.Spec(tuple(example.shape), example.dtype)

    def torch_lazy() -> Any:
        return with_torch_lazy(models, ref)

    def run() -> Any:
        torch.manual_seed(0)
        if contender == "eager":
            return ref.eager()
        if contender == "lazynn.build":
            return lazynn.build(ref.lazy(), spec)
        if contender == "lazynn.build(factory)":
            return lazynn.build(ref.lazy, spec)
        if contender in ("torch-nograd", "torch-autograd"):
            model = torch_lazy()
            with torch.set_grad_enabled(contender == "torch-autograd"):
                model(example)
            return model
        if contender == "meta+to_empty":
            with torch.device("meta"):
                model = ref.eager()
            model.to_empty(device="cpu")
            with torch.no_grad():
                for module in model.modules():
                    if callable(getattr(module, "reset_parameters", None)):
                        module.reset_parameters()
            return model
        raise SystemExit(f"unknown contender {contender}")

    cold_t, cold_m, model = _measure(run)
    params = sum(p.numel() for p in model.parameters())
    del model
    warm = []
    for _ in range(WARM_RUNS):  # the median of a few, to tame allocator and machine noise
        t, m, model = _measure(run)
        del model
        warm.append((t, m))
    warm_t = sorted(t for t, _ in warm)[len(warm) // 2]
    warm_m = sorted(m for _, m in warm)[len(warm) // 2]
    return {
        "cold_s": cold_t,
        "cold_bytes": cold_m,
        "warm_s": warm_t,
        "warm_bytes": warm_m,
        "params": params,
    }


def _llama_worker(name: str, what: str) -> dict[str, Any]:
    import torch

    import lazynn

    after_import = _rss()
    sys.path.insert(0, str(ROOT / "examples"))
    import models

    factory, example = models.LAZY_ONLY[name]
    spec = lazynn.Spec(tuple(example("meta").shape), torch.long)
    out = {}
    for phase in ("cold", "warm"):
        gc.collect()
        _reset_peak()
        # Construction is timed too: it runs the first meta operations of the process
        # (nn.Embedding's init on meta), which is where torch's one-time imports happen.
        start = time.perf_counter()
        with torch.device("meta"):
            model = factory()
        if what == "build(meta)":
            lazynn.build(model, spec, device="meta")
        else:
            lazynn.summary(model, spec)
        out[f"{phase}_s"] = time.perf_counter() - start
        out[f"{phase}_bytes_over_import"] = _peak() - after_import
        del model
    return out


def _cold_worker() -> dict[str, Any]:
    """What the first meta operations of a process import (after `import lazynn`)."""
    import lazynn  # noqa: F401  (imports torch)

    out = {}
    for name in ("sympy", "torch._dynamo"):
        start = time.perf_counter()
        __import__(name)
        out[name] = time.perf_counter() - start
    return out


# --- orchestrating ------------------------------------------------------------------------------
def _spawn(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        check=False,
        # A fixed mmap threshold makes glibc return every large block on free, so the
        # resident set tracks live memory and warm builds measure their own peak.
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.system()} {platform.release()}"
    )


def _command() -> str:
    """The command this run was given, as typed (``--out FILE`` left out: where the text went)."""
    words, skip = [], False
    for word in sys.argv[1:]:
        if skip or word == "--out" or word.startswith("--out="):
            skip = word == "--out"
            continue
        words.append(word)
    return shlex.join(["python", "benchmarks/bench_build.py", *words])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--worker", nargs=2, metavar=("CONTENDER", "MODEL"))
    parser.add_argument("--llama", nargs=2, metavar=("MODEL", "WHAT"))
    parser.add_argument("--worker-quick", action="store_true")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--models", default="", help="keys of examples/models.py's FULL only")
    parser.add_argument("--contenders", default="", help="these contenders only (eager: always)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker, quick=args.worker_quick)))
        return
    if args.cold:
        print(json.dumps(_cold_worker()))
        return
    if args.llama:
        print(json.dumps(_llama_worker(*args.llama)))
        return

    lines = [
        "# Benchmarks",
        "",
        f"Machine: {_machine()}.",
        "",
        f"Command: `{_command()}`. Each cell: ratio to eager construction in the same run "
        "(time, peak memory); "
        "absolute numbers in parentheses. Cold: the first build in a fresh process; warm: "
        f"the median of the next {WARM_RUNS}.",
        "",
    ]
    models = QUICK if args.quick else MODELS
    if args.models:
        models = {t: k for t, k in models.items() if k in args.models.split(",")}
    wanted = args.contenders.split(",") if args.contenders else CONTENDERS
    chosen = [c for c in CONTENDERS if c == "eager" or c in wanted]
    for title, key in models.items():
        results = {}
        for contender in chosen:
            extra = ["--worker-quick"] if args.quick else []
            results[contender] = _spawn(["--worker", contender, key, *extra])
            print(f"{title} {contender}: {results[contender]}", file=sys.stderr)
        base = results["eager"]
        lines += [
            f"## {title} ({base['params'] / 1e6:.1f}M parameters)",
            "",
            "| contender | time cold | time warm | memory cold | memory warm |",
            "|---|---|---|---|---|",
        ]
        for contender, r in results.items():
            cells = []
            for kind, unit, scale in (("s", "s", 1), ("bytes", "MiB", 2**20)):
                for phase in ("cold", "warm"):
                    value, ref = r[f"{phase}_{kind}"], base[f"{phase}_{kind}"]
                    ratio = value / ref if ref > 0 else float("nan")
                    cells.append(f"{ratio:.2f}x ({value / scale:.2f} {unit})")
            lines.append(f"| {contender} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
        lines.append("")
    if not args.quick and not args.models:
        lines += [
            "## LLaMA-shaped lazy models on meta",
            "",
            'Times include constructing the model under `torch.device("meta")`.',
            "",
            "| model | operation | cold | warm | peak memory over `import lazynn` |",
            "|---|---|---|---|---|",
        ]
        for name in LLAMAS:
            for what in ("build(meta)", "summary"):
                r = _spawn(["--llama", name, what])
                print(f"{name} {what}: {r}", file=sys.stderr)
                mib = max(r["cold_bytes_over_import"], r["warm_bytes_over_import"]) / 2**20
                lines.append(
                    f"| {name} | {what} | {r['cold_s']:.3f} s | {r['warm_s']:.3f} s "
                    f"| {mib:.0f} MiB |"
                )
        lines.append("")
    cold = _spawn(["--cold"])
    lines += [
        "## Where cold time goes",
        "",
        "torch's Python meta kernels import sympy and torch._dynamo the first time they run "
        f"(here: sympy {cold['sympy']:.2f} s, torch._dynamo {cold['torch._dynamo']:.2f} s on "
        "their own). lazynn's rehearsal answers the common functions and torch.nn layers by "
        "formula and its dispatch modes are not wrapped for dynamo, so a build or summary of a "
        "model of torch.nn layers imports neither (tests/rehearsal/test_formulas.py); a model "
        "constructed under torch.device('meta') by the user still does (torch's own init).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
