"""Cross-framework report: LeNet-5 on meta against PyTorch, the exported LeNet-5 against
onnxruntime; ratios of medians with bootstrap confidence intervals, all from one run.

Three parts (``--parts``), each at every thread count of ``--threads`` (1 first):

- ``step``: one training step of LeNet-5 (batch 64: forward, backward, SGD momentum 0.9) from
  the same weights, on one synthetic batch: meta's native executor, PyTorch eager (the graph's
  nodes as ``F.conv2d``/``F.linear``/... with ``torch.optim.SGD``, as ``train_step.py``), and
  meta's graph on meta's PyTorch executor (``executor: pytorch``: PyTorch autograd filling
  Level 1 under meta's optimizer). The variants' timed blocks alternate
  (``harness.interleaved_blocks``); a ratio is ``median(PyTorch eager s/step) / median(variant
  s/step)``, so above 1 the variant is faster. With a CUDA device, PyTorch eager and the PyTorch
  executor also run on it (their rows say ``cuda``).
- ``inference``: the exported LeNet-5 (``to_onnx``, inference form) at batch 1 and 64: meta's
  native executor against an onnxruntime ``InferenceSession`` (graph optimisations on, its
  intra-op threads set to the thread count). Ratio: ``median(onnxruntime) / median(meta)``.
- ``accuracy``: time to accuracy on MNIST: ``meta run recipes/mnist_lenet.py --repeat N --set
  executor=native`` and ``executor=pytorch`` (and ``device=cuda`` with a GPU), each executor in
  its own process at each thread count (``OMP_NUM_THREADS``, which meta and PyTorch both read):
  the median over runs of the wall time until the test accuracy first reached 98 % and the
  recipe's bound (98.8 %), and the step-time ratio with its two-stage bootstrap interval.

    python benchmarks/cross_framework.py                     # all parts, ~6 min on 2 cores
    python benchmarks/cross_framework.py --parts step,inference --json out.json --plot out.png

Without PyTorch the PyTorch rows are left out; without onnxruntime the inference part is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import OtherLoad, environment, interleaved_blocks, print_environment, torch
from train_step import (
    LR,
    MOMENTUM,
    PAUSE_S,
    meta_step,
    synthetic_batch,
    torch_forward,
    torch_step,
)

from meta import lv1
from meta.common.threads import set_threads
from meta.bench.stats import ratio_of_medians, ratio_of_medians_by_run
from meta.common.files import write_bytes, write_text

try:
    import onnxruntime
except ImportError:  # optional: a measuring stick, never a code path of meta
    onnxruntime = None

REPO = Path(__file__).resolve().parents[1]
BATCH = 64
CUDA = torch is not None and torch.cuda.is_available()  # --no-cuda sets it False


def executor_step(x: np.ndarray, y: np.ndarray, device: str) -> object:
    """meta's LeNet-5 graph on meta's PyTorch executor, stepped by meta's SGD (host arrays)."""
    import meta.lv1.torch_executor  # noqa: F401  registers executor "pytorch"

    return meta_step("lenet5", "pytorch", x, y, device=device)


def cuda_eager_step(x: np.ndarray, y: np.ndarray) -> object:
    """PyTorch eager on the GPU: ``train_step.torch_step``'s model with its tensors there."""
    graph = lv1.lenet5(seed=0)
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy()).cuda())
              for k, v in graph.parameters.items()}
    forward = torch_forward(graph, params)
    xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    optimizer = torch.optim.SGD(params.values(), lr=LR, momentum=MOMENTUM)

    def step() -> float:
        optimizer.zero_grad()
        loss = forward(xt, yt)
        loss.backward()
        optimizer.step()
        return loss.item()  # waits for the GPU
    return step


def ratio(baseline: list[float], candidate: list[float], seed: int) -> dict:
    """``median(baseline) / median(candidate)``: above 1 the candidate takes less time."""
    r = ratio_of_medians(candidate, baseline, seed=seed)
    return {"ratio": r.ratio, "low": r.ci_low, "high": r.ci_high, "confidence": r.confidence}


def timed(fns: dict, calls: int, repeats: int, warmup: int) -> tuple[dict, dict]:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    with OtherLoad() as load:
        seconds = interleaved_blocks(fns, calls, repeats, PAUSE_S)
    return seconds, {"other_processes_cores": load.cores, "load": load.describe()}


def step_part(args: argparse.Namespace, threads: int) -> dict:
    x, y = synthetic_batch(BATCH)
    steps = {"meta native": meta_step("lenet5", "native", x, y)}
    if torch is not None:
        steps["pytorch eager"] = torch_step("lenet5", x, y)
        steps["meta on pytorch executor"] = executor_step(x, y, "cpu")
        if CUDA:
            steps["pytorch eager cuda"] = cuda_eager_step(x, y)
            steps["meta on pytorch executor cuda"] = executor_step(x, y, "cuda")
    first = {name: step() for name, step in steps.items()}
    seconds, load = timed(steps, args.steps, args.repeats, args.warmup)
    out = {"first_loss": first, "ms_per_step": {k: float(np.median(v)) * 1e3
                                                for k, v in seconds.items()},
           "seconds": seconds, **load, "vs_pytorch_eager": {}}
    if torch is not None:
        for name in steps:
            if name != "pytorch eager":
                out["vs_pytorch_eager"][name] = ratio(seconds["pytorch eager"], seconds[name],
                                                      args.seed)
    return out


def inference_part(args: argparse.Namespace, threads: int) -> dict:
    graph = lv1.lenet5(seed=0)
    model = lv1.to_onnx(graph, outputs=["logits"])  # as meta run exports it: no loss
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    inference = lv1.from_onnx(model)
    executor = lv1.EXECUTORS["native"](inference).eval()
    out = {}
    for batch in (1, BATCH):
        x = synthetic_batch(batch)[0]
        name, output = session.get_inputs()[0].name, session.get_outputs()[0].name
        ours = executor.inference({"input": x})
        theirs = session.run([output], {name: x})[0]
        difference = float(np.max(np.abs(next(iter(ours.values())) - theirs)))
        calls = max(args.steps, 200 // batch)
        seconds, load = timed({"meta native": lambda x=x: executor.inference({"input": x}),
                               "onnxruntime": lambda x=x, o=output, n=name: session.run(
                                   [o], {n: x})},
                              calls, args.repeats, args.warmup)
        out[f"batch {batch}"] = {
            "ms_per_call": {k: float(np.median(v)) * 1e3 for k, v in seconds.items()},
            "max_abs_difference": difference, "seconds": seconds, **load,
            "meta_vs_onnxruntime": ratio(seconds["onnxruntime"], seconds["meta native"],
                                         args.seed)}
    return out


def accuracy_part(args: argparse.Namespace, threads: int) -> dict:
    """Each executor in its own processes (``meta run --repeat``): two frameworks' thread
    pools in one process slowed each other at 2 threads (see the README's report)."""
    if args.accuracy_executors:
        executors = args.accuracy_executors.split(",")
    else:
        executors = ["native"] + (["pytorch"] if torch is not None else []) \
            + (["pytorch@cuda"] if CUDA else [])
    runs: dict[str, list[dict]] = {}
    out: dict = {"variants": {}}
    started = time.perf_counter()
    for executor in executors:
        name, _, device = executor.partition("@")
        sets = ["--set", f"executor={name}"] + (["--set", f"device={device}"] if device else [])
        with tempfile.TemporaryDirectory() as folder:
            cmd = [sys.executable, "-m", "meta.cli", "run", str(REPO / "recipes/mnist_lenet.py"),
                   "--output-dir", folder, "--quiet", "--no-export", "--repeat",
                   str(args.accuracy_repeat), *sets]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            subprocess.run(cmd, env=env, check=False)  # exit 1: a run missed a bound
            report = json.loads((Path(folder) / "report.json").read_text())
        variant = report["variants"][0]
        label = f"executor={name}" + (f",device={device}" if device else "")
        runs[label] = variant["runs"]
        reach = {f"{level:.3f}": float(np.median([
            next((e["elapsed_s"] for e in r["epochs"] if e.get("test_accuracy", 0) >= level),
                 np.inf) for r in variant["runs"]])) for level in (0.98, 0.988)}
        out["variants"][label] = {
            "time_to_accuracy_s": {k: (v if np.isfinite(v) else None) for k, v in reach.items()},
            "final_test_accuracy": variant["final_metrics"].get("test_accuracy"),
            "step_ms": variant["step_time_s"]["median"] * 1e3,
            "samples_per_s": variant["samples_per_s"].get("median"), "runs": len(runs[label])}
    out["wall_s"] = time.perf_counter() - started
    first, *others = runs
    out["step_time_vs_first"] = []
    for label in others:
        r = ratio_of_medians_by_run([run["step_time_s"][3:] for run in runs[first]],
                                    [run["step_time_s"][3:] for run in runs[label]],
                                    seed=args.seed)
        out["step_time_vs_first"].append({"candidate": label, "ratio": r.ratio,
                                          "low": r.ci_low, "high": r.ci_high})
    return out


PARTS = {"step": step_part, "inference": inference_part, "accuracy": accuracy_part}


def print_results(results: dict) -> None:
    for threads, parts in results.items():
        print(f"\n== {threads} thread(s)")
        if "step" in parts:
            p = parts["step"]
            print(f"training step, LeNet-5 batch {BATCH} ({p['load']}):")
            for name, ms in p["ms_per_step"].items():
                r = p["vs_pytorch_eager"].get(name)
                vs = f"  x{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}] vs pytorch eager" \
                    if r else ""
                print(f"  {name:<30} {ms:8.2f} ms{vs}")
        for batch, p in parts.get("inference", {}).items():
            r = p["meta_vs_onnxruntime"]
            print(f"inference, exported LeNet-5, {batch}: meta native "
                  f"{p['ms_per_call']['meta native']:.3f} ms, onnxruntime "
                  f"{p['ms_per_call']['onnxruntime']:.3f} ms; meta x{r['ratio']:.2f} "
                  f"[{r['low']:.2f}, {r['high']:.2f}] ({p['load']})")
        if "accuracy" in parts:
            for name, v in parts["accuracy"]["variants"].items():
                print(f"time to accuracy, {name}: {v['time_to_accuracy_s']}, final "
                      f"{v['final_test_accuracy']}, {v['step_ms']:.2f} ms/step")
            for c in parts["accuracy"]["step_time_vs_first"]:
                print(f"  step time {c['candidate']} / first: {c['ratio']:.2f} "
                      f"[{c['low']:.2f}, {c['high']:.2f}]")


def plot(results: dict, path: Path) -> None:
    """Left: each variant's speed relative to the framework it is measured against, with its
    confidence interval (the line at 1 is parity). Right, when measured: time to 98 % test
    accuracy on MNIST per variant and thread count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, lows, highs = [], [], [], []
    for threads, parts in results.items():
        for name, r in parts.get("step", {}).get("vs_pytorch_eager", {}).items():
            labels.append(f"train step: {name} vs PyTorch eager, {threads}t")
            values.append(r["ratio"]), lows.append(r["low"]), highs.append(r["high"])
        for batch, p in parts.get("inference", {}).items():
            r = p["meta_vs_onnxruntime"]
            labels.append(f"inference {batch}: meta native vs onnxruntime, {threads}t")
            values.append(r["ratio"]), lows.append(r["low"]), highs.append(r["high"])
    reach = [(f"{name}, {threads}t", v["time_to_accuracy_s"]["0.980"])
             for threads, parts in results.items()
             for name, v in parts.get("accuracy", {}).get("variants", {}).items()]
    panels = 1 + bool(reach)
    fig, axes = plt.subplots(1, panels, figsize=(8.5 * panels, 0.42 * max(len(labels),
                                                                          len(reach)) + 1.4))
    axes = np.atleast_1d(axes)
    rows = np.arange(len(labels))
    axes[0].errorbar(values, rows, xerr=[np.subtract(values, lows), np.subtract(highs, values)],
                     fmt="o", color="tab:blue", capsize=3)
    axes[0].axvline(1.0, color="black", lw=1)
    axes[0].set_yticks(rows, labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set_xscale("log")
    axes[0].set_xlabel("speed relative to the other framework (> 1: faster), 95 % interval",
                       fontsize=8)
    if reach:
        names = [n for n, _ in reach]
        times = [t if t is not None else np.nan for _, t in reach]
        axes[1].barh(np.arange(len(names)), times, color="tab:green", alpha=0.7)
        axes[1].set_yticks(np.arange(len(names)), names, fontsize=7)
        axes[1].invert_yaxis()
        axes[1].set_xlabel("seconds to 98 % test accuracy, MNIST LeNet-5 recipe", fontsize=8)
    fig.suptitle("LeNet-5 across frameworks, one run", fontsize=10)
    fig.tight_layout()
    from io import BytesIO
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def merge(args: argparse.Namespace) -> None:
    """Join the ``results`` of several ``--json`` files by thread count; keep each file's
    environment (the load each part ran under differs)."""
    results: dict = {}
    environments = []
    for path in args.merge:
        saved = json.loads(path.read_text())
        environments.append({"file": path.name, "args": saved["args"],
                             "environment": saved["environment"]})
        for threads, parts in saved["results"].items():
            results.setdefault(threads, {}).update(parts)
    print_results(results)
    if args.json:
        write_text(args.json, json.dumps({"runs": environments, "results": results},
                                         indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="step,inference,accuracy")
    parser.add_argument("--threads", default="1,2", help="comma-separated, run in this order")
    parser.add_argument("--steps", type=int, default=20, help="calls per timed block")
    parser.add_argument("--repeats", type=int, default=15, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--accuracy-repeat", type=int, default=2, metavar="N",
                        help="runs of the LeNet-5 recipe per executor and thread count")
    parser.add_argument("--accuracy-executors", metavar="LIST",
                        help="executors of the accuracy part, EXECUTOR[@DEVICE] comma-separated, "
                             "the first the baseline (default: native,pytorch[,pytorch@cuda])")
    parser.add_argument("--no-cuda", action="store_true", help="leave out the GPU rows")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="instead of measuring, join the results of earlier runs (e.g. "
                             "parts run at the same time on disjoint cores) and print/plot them")
    parser.add_argument("--json", type=Path, metavar="PATH")
    parser.add_argument("--plot", type=Path, metavar="PATH")
    args = parser.parse_args()
    global CUDA
    CUDA = CUDA and not args.no_cuda
    if args.merge:
        return merge(args)
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {sorted(unknown)}; choose from {sorted(PARTS)}")
    if onnxruntime is None and "inference" in parts:
        print("onnxruntime is not installed: the inference part is left out", flush=True)
        parts.remove("inference")
    env = environment()
    env["cuda"] = torch.cuda.get_device_name(0) if CUDA else None
    print_environment(env)
    results: dict = {}
    for threads in (int(t) for t in args.threads.split(",")):
        set_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        results[threads] = {part: PARTS[part](args, threads) for part in parts}
    print_results(results)
    if args.json:
        write_text(args.json, json.dumps({"environment": env, "args": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "results": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
