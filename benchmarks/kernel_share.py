"""How far meta's planned training step can get ahead of PyTorch eager when both run the same
oneDNN primitives for most of it: the bound on the speed-up that those shared kernels leave.

Issue 41 item 5 asks the LSTM LM and ResNet-18 to train 1.5x faster than eager at 1 thread.
Both frameworks call oneDNN for the bulk of these steps: PyTorch's ``nn.LSTM`` is
``aten::mkldnn_rnn_layer`` (forward and backward), its convolutions ``aten::mkldnn_convolution``
and ``aten::convolution_backward``; meta's plan runs oneDNN 3.2's LSTM and convolution
primitives (``cpp/plan/rnn.cpp``, ``conv.cpp``); the LSTM LM's head is a matrix product in
both (``aten::mm``, MKL). Whatever meta saves elsewhere (layouts kept between kernels, fused
element-wise work, no autograd), its step cannot be shorter than the time in those kernels. This script measures, per model, in one process:

- the step of each (forward, backward, SGD with momentum), meta planned and PyTorch eager,
  interleaved, in thread CPU time (a loaded machine preempts the process; the CPU time it was
  given is what a step cost) and wall time;
- meta's per-step profile (``PlannedExecutor.profile``: every plan step timed, the fastest of a
  few calls): the share of its step in the shared kernels' op types;
- PyTorch's (``torch.profiler``): the share of eager's step in the same primitives;
- the ratio eager / meta would reach if everything in meta's step but the shared kernels
  cost nothing: eager / (meta x share). Below a target, no work outside those kernels reaches it.

    python benchmarks/kernel_share.py --models lstm_lm512,resnet18 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import train_step
from harness import OtherLoad, environment, print_environment, torch

from meta import lv1
from meta.common.threads import set_threads

# model -> (meta's op types doing work eager does in the same kernels, eager's op names for
# it). The language models' head is a matrix product in both (oneDNN's matmul in meta, MKL's
# sgemm in PyTorch): the same floating-point work at the machine's GEMM rate.
LSTM_LM = (("LSTM", "MatMul"), ("aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward",
                                "aten::mm", "aten::addmm"))
SHARED = {
    "lstm_lm": LSTM_LM,
    "lstm_lm512": LSTM_LM,
    "resnet18": (("Conv",), ("aten::mkldnn_convolution", "aten::convolution_backward")),
    "mobilenet_v2": (("Conv",), ("aten::mkldnn_convolution", "aten::convolution_backward")),
}


def timed_steps(steps: dict, count: int) -> dict[str, dict[str, list[float]]]:
    """``count`` rounds, each variant one step per round: thread CPU and wall seconds."""
    out = {name: {"cpu": [], "wall": []} for name in steps}
    for _ in range(count):
        for name, step in steps.items():
            c, w = time.thread_time(), time.perf_counter()
            step()
            out[name]["cpu"].append(time.thread_time() - c)
            out[name]["wall"].append(time.perf_counter() - w)
    return out


def meta_share(model: str, x: np.ndarray, y: np.ndarray, ops: tuple[str, ...],
               calls: int = 3) -> tuple[float, dict[str, float]]:
    """The share of meta's planned training call in plan steps of ``ops``' nodes (each step's
    fastest of ``calls`` timed calls), and wall ms per op type (the profile times each plan
    step by the clock: on a loaded machine, more than the CPU time it got; the share holds)."""
    executor = lv1.EXECUTORS["planned"](train_step.graph_of(model)).train()
    feeds = {"input": x, "labels": y}
    for _ in range(2):
        executor.inference_and_backprop(feeds, "loss")
    executor.profile = True
    runs = []
    for _ in range(calls):
        executor.records.clear()
        executor.inference_and_backprop(feeds, "loss")
        runs.append(list(executor.records))
    ns = np.min([[r[3] for r in run] for run in runs], axis=0)
    per_op: dict[str, float] = {}
    for (_, op, _, _), t in zip(runs[0], ns):
        per_op[op] = per_op.get(op, 0.0) + t / 1e6
    shared = sum(t for (_, op, _, _), t in zip(runs[0], ns) if op in ops)
    return float(shared / ns.sum()), dict(sorted(per_op.items(), key=lambda kv: -kv[1]))


def eager_share(step, names: tuple[str, ...], calls: int = 3) -> float:
    """The share of eager's steps (``torch.profiler``, self CPU time) in ops ``names``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sum(e.self_cpu_time_total for e in events if e.key in names) / total


def measure(model: str, rounds: int) -> dict:
    ops, names = SHARED[model]
    x, y = train_step.synthetic_batch(train_step.MODELS[model][1], model)
    steps = {"meta planned": train_step.meta_step(model, "planned", x, y),
             "pytorch": train_step.torch_step(model, x, y)}
    first = {name: step() for name, step in steps.items()}
    for step in steps.values():
        step()
    with OtherLoad() as load:
        times = timed_steps(steps, rounds)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    share, per_op = meta_share(model, x, y, ops)
    eager = eager_share(steps["pytorch"], names)
    meta_cpu, eager_cpu = med["meta planned"]["cpu"], med["pytorch"]["cpu"]
    return {"model": model, "batch": train_step.MODELS[model][1], "first_loss": first,
            "rounds": rounds, "times_s": times, "median_s": med,
            "ratio_cpu": eager_cpu / meta_cpu,
            "ratio_wall": med["pytorch"]["wall"] / med["meta planned"]["wall"],
            "shared_ops": {"meta": list(ops), "pytorch": list(names)},
            "meta_shared_share": share, "pytorch_shared_share": eager,
            "meta_shared_ms": 1e3 * meta_cpu * share, "pytorch_shared_ms": 1e3 * eager_cpu * eager,
            "bound": eager_cpu / (meta_cpu * share), "meta_ms_per_op": per_op,
            "other_processes_cores": load.cores, "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="lstm_lm512,resnet18",
                        help="comma-separated: " + ", ".join(SHARED))
    parser.add_argument("--rounds", type=int, default=6, help="interleaved steps per variant")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in SHARED]
    if torch is None or unknown:
        parser.exit(2, f"kernel_share.py: {'needs torch' if torch is None else 'unknown model '}"
                       f"{', '.join(unknown)} (known: {', '.join(SHARED)})\n")
    set_threads(1)
    torch.set_num_threads(1)
    env = environment()
    print_environment(env)
    results = []
    for model in models:
        r = measure(model, args.rounds)
        results.append(r)
        m, e = r["median_s"]["meta planned"], r["median_s"]["pytorch"]
        print(f"\n{model} (batch {r['batch']}), 1 thread, medians of {args.rounds} interleaved "
              f"steps; first-step loss meta {r['first_loss']['meta planned']:.5f}, "
              f"PyTorch {r['first_loss']['pytorch']:.5f}")
        print(f"  step, thread CPU: meta planned {1e3 * m['cpu']:.1f} ms, PyTorch eager "
              f"{1e3 * e['cpu']:.1f} ms: eager/meta {r['ratio_cpu']:.2f} (wall "
              f"{r['ratio_wall']:.2f})")
        print(f"  in the kernels both run ({'/'.join(r['shared_ops']['meta'])}): meta "
              f"{r['meta_shared_ms']:.1f} ms ({r['meta_shared_share']:.0%} of its step), PyTorch "
              f"{r['pytorch_shared_ms']:.1f} ms ({r['pytorch_shared_share']:.0%})")
        print(f"  eager/meta if the rest of meta's step cost nothing: {r['bound']:.2f}")
        print("  meta's step by op type (profiled, wall ms): " + ", ".join(
            f"{op} {ms:.1f}" for op, ms in list(r["meta_ms_per_op"].items())[:6]))
        print(f"  load average {r['load_average']:.2f} on {os.cpu_count()} CPUs; other "
              f"processes busy {r['other_processes_cores']:.2f} cores"
              + ("; figures unreliable" if r["other_processes_cores"] > 0.1 else ""),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "results": results}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
