"""Benchmark: lazynn's first call and checkpoint load against torch's lazy modules.

Each measurement runs in a fresh Python process. "Cold" is the first construction + first
call in the process (paying every first-use cost); "warm" the median of the next few.
Memory is the peak resident set size during the step minus the size just before it (Linux:
/proc/self/clear_refs resets the peak), plus, cold, what the process grew by in all.

    python benchmarks/bench_first_call.py            # all, prints a markdown report
    python benchmarks/bench_first_call.py --quick    # small models, a smoke run
    python benchmarks/bench_first_call.py --steps mlp --rounds 300   # one process, by step

``--steps``: in one process, torch's lazy model and lazynn's alternating, each round timing
the construction, the first call and the second call apart (medians over the rounds): what
the first call itself costs beside torch's, without the process's start.

First call, per model (examples/models.py), the same model with:
  torch    torch's nn.Lazy* classes (LazyLinear, LazyConv2d, LazyBatchNorm2d...), then model(x)
  lazynn   lazynn's classes of the same names, then model(x)
Checkpoint into an unbuilt model, the eager model's state_dict loaded by:
  meta+to_empty+load   construct the eager model on meta, to_empty(), load_state_dict
  lazynn-copy          construct the lazynn model on meta, to_empty(), load_state_dict
  meta+assign          construct the eager model on meta, load_state_dict(assign=True)
  lazynn-assign        construct the lazynn model on meta, load_state_dict(assign=True)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_build import _machine, _peak, _reset_peak, _rss, with_torch_lazy  # noqa: E402

MODELS = {"mlp": "mlp", "cnn": "cnn", "resnet50": "resnet50", "gpt2-medium": "gpt"}
QUICK = {"mlp": "mlp", "cnn": "cnn"}
SMALL = {"mlp", "cnn"}
FIRST = ["torch", "lazynn"]
LOADS = ["meta+to_empty+load", "lazynn-copy", "meta+assign", "lazynn-assign"]
WARM_RUNS = 5


def _models(quick: bool) -> Any:
    sys.path.insert(0, str(ROOT / "examples"))
    import models

    return models, (models.REFERENCE if quick else models.FULL)


def _lazy(models: Any, ref: Any, kind: str) -> Any:
    """The lazy model with lazynn's classes, or with torch's of the same names."""
    return ref.lazy() if kind == "lazynn" else with_torch_lazy(models, ref)


def _time(fn: Any) -> tuple[float, int]:
    gc.collect()
    _reset_peak()
    before = _rss()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    used = _peak() - before
    del result
    return elapsed, used


def _first_worker(kind: str, key: str, quick: bool) -> dict[str, Any]:
    import torch

    import lazynn  # noqa: F401  (imported by both: the comparison is of the call)

    start_rss = _rss()
    models, table = _models(quick)
    ref = table[key]
    example = ref.example("cpu")

    def run() -> Any:
        torch.manual_seed(0)
        model = _lazy(models, ref, kind)
        model(example)
        return model

    cold_t, cold_m = _time(run)
    grown = _rss() - start_rss
    warm = sorted(_time(run) for _ in range(WARM_RUNS))
    return {
        "cold_s": cold_t,
        "cold_bytes": cold_m,
        "grown_bytes": grown,
        "warm_s": warm[len(warm) // 2][0],
        "imports": sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules),
    }


def _load_worker(kind: str, key: str, quick: bool) -> dict[str, Any]:
    import torch

    import lazynn  # noqa: F401

    _, table = _models(quick)
    ref = table[key]
    state = ref.eager().state_dict()

    def run() -> Any:
        if kind.startswith("meta"):
            with torch.device("meta"):
                model = ref.eager()
            if kind == "meta+to_empty+load":
                model.to_empty(device="cpu")
                model.load_state_dict(state)
            else:
                model.load_state_dict(state, assign=True)
            return model
        # The lazynn model on meta too (its eager parts, such as embeddings, would otherwise
        # be allocated and initialized, which the meta recipes skip).
        with torch.device("meta"):
            model = ref.lazy()
        if kind == "lazynn-copy":
            model.to_empty(device="cpu")  # the placeholders follow: still unbuilt
        model.load_state_dict(state, assign=kind == "lazynn-assign")
        return model

    cold_t, cold_m = _time(run)
    warm = sorted(_time(run) for _ in range(WARM_RUNS))
    return {"cold_s": cold_t, "cold_bytes": cold_m, "warm_s": warm[len(warm) // 2][0]}


def _steps(key: str, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds of construction, first call and second call, per contender (one
    process, the contenders alternating round by round)."""
    import torch

    import lazynn  # noqa: F401

    models, table = _models(False)
    ref = table[key]
    example = ref.example("cpu")
    times: dict[str, dict[str, list[float]]] = {
        kind: {"construct": [], "first": [], "second": []} for kind in FIRST
    }
    for _ in range(rounds):
        for kind in FIRST:
            torch.manual_seed(0)
            start = time.perf_counter()
            model = _lazy(models, ref, kind)
            built = time.perf_counter()
            model(example)
            first = time.perf_counter()
            model(example)
            second = time.perf_counter()
            steps = times[kind]
            steps["construct"].append(built - start)
            steps["first"].append(first - built)
            steps["second"].append(second - first)
    return {
        kind: {step: statistics.median(values) for step, values in steps.items()}
        for kind, steps in times.items()
    }


def _medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric field's median over fresh processes (the last run's other fields)."""
    out = dict(results[-1])
    for field, value in results[-1].items():
        if isinstance(value, (int, float)):
            out[field] = statistics.median(r[field] for r in results)
    return out


def _spawn(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--first", nargs=2, metavar=("KIND", "MODEL"))
    parser.add_argument("--load", nargs=2, metavar=("KIND", "MODEL"))
    parser.add_argument("--worker-quick", action="store_true")
    parser.add_argument("--loads-only", action="store_true", help="only the checkpoint table")
    parser.add_argument("--models", default=None, help="comma-separated subset, e.g. mlp,cnn")
    parser.add_argument(
        "--repeats", type=int, default=20, help="fresh processes per contender, mlp and cnn"
    )
    parser.add_argument(
        "--repeats-large", type=int, default=3, help="fresh processes per contender, others"
    )
    parser.add_argument("--steps", metavar="MODEL", help="one process, by step (see above)")
    parser.add_argument("--rounds", type=int, default=300, help="rounds of --steps")
    args = parser.parse_args()
    if args.steps:
        result = _steps(MODELS.get(args.steps, args.steps), args.rounds)
        t, z = result["torch"], result["lazynn"]
        print(f"{args.steps}, {args.rounds} rounds in one process (medians):")
        for step in ("construct", "first", "second"):
            print(
                f"  {step:9s} torch {t[step] * 1e3:.3f} ms  lazynn {z[step] * 1e3:.3f} ms  "
                f"ratio {z[step] / t[step]:.2f}x"
            )
        return
    if args.first:
        print(json.dumps(_first_worker(*args.first, quick=args.worker_quick)))
        return
    if args.load:
        print(json.dumps(_load_worker(*args.load, quick=args.worker_quick)))
        return
    extra = ["--worker-quick"] if args.quick else []
    table = QUICK if args.quick else MODELS
    if args.models:
        table = {k: v for k, v in table.items() if k in args.models.split(",")}
    mib = 2**20
    lines = [
        "## First call: lazynn against torch's lazy modules",
        "",
        f"Machine: {_machine()}. Command: `python benchmarks/bench_first_call.py"
        + (" --quick" if args.quick else "")
        + f"`. Each figure: the median over fresh processes per contender ({args.repeats} "
        f"for mlp and cnn, {args.repeats_large} for the others), the contenders alternating; "
        "ratio lazynn / torch.",
        "",
        "| model | torch cold | lazynn cold | ratio | torch warm | lazynn warm | ratio "
        "| extra peak memory, cold | process growth, lazynn - torch | lazynn imports |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for title, key in table.items() if not args.loads_only else ():
        # Fresh processes, the contenders alternating (machine drift hits both alike); each
        # figure is the median over the processes (milliseconds: one run is noise).
        repeats = args.repeats if key in SMALL else args.repeats_large
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in FIRST}
        for _ in range(repeats):
            for kind in FIRST:
                runs[kind].append(_spawn(["--first", kind, key, *extra]))
        r = {kind: _medians(results) for kind, results in runs.items()}
        print(f"{title} ({repeats} processes each): {r}", file=sys.stderr)
        t, z = r["torch"], r["lazynn"]
        lines.append(
            f"| {title} | {t['cold_s'] * 1e3:.1f} ms | {z['cold_s'] * 1e3:.1f} ms "
            f"| {z['cold_s'] / t['cold_s']:.2f}x | {t['warm_s'] * 1e3:.2f} ms "
            f"| {z['warm_s'] * 1e3:.2f} ms | {z['warm_s'] / t['warm_s']:.2f}x "
            f"| {(z['cold_bytes'] - t['cold_bytes']) / mib:+.1f} MiB "
            f"| {(z['grown_bytes'] - t['grown_bytes']) / mib:+.1f} MiB "
            f"| {', '.join(z['imports']) or 'neither sympy nor torch._dynamo'} |"
        )
    lines += [
        "",
        "## A built checkpoint into an unbuilt model",
        "",
        "Ratios to `meta+to_empty+load` (construct the eager model on meta, `to_empty`, "
        "`load_state_dict`), warm medians.",
        "",
        "| model | " + " | ".join(LOADS) + " |",
        "|---|" + "---|" * len(LOADS),
    ]
    for title, key in table.items():
        r = {kind: _spawn(["--load", kind, key, *extra]) for kind in LOADS}
        print(f"{title} load: {r}", file=sys.stderr)
        base = r[LOADS[0]]["warm_s"]
        cells = [f"{r[k]['warm_s'] / base:.2f}x ({r[k]['warm_s'] * 1e3:.1f} ms)" for k in LOADS]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
