"""Training-step throughput of an MLP 784-512-512-10: meta (numpy, native) against PyTorch.

A step is forward + backward + SGD-momentum update on one synthetic batch made once. Each variant
runs warm-up steps, then ``--repeats`` timed blocks of ``--steps`` steps; the variants' blocks
alternate (each after a short pause and one untimed step), so background noise hits them alike.
Thread counts run in the order given (1 first): on a small machine two-thread timings collapse
when anything else runs, so compare only ratios from one run, and check the "other processes
busy" figure printed with them.

    python benchmarks/mlp_step.py                    # batch 128, threads 1,2
    python benchmarks/mlp_step.py --steps 20 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import threadpoolctl

from meta import lv1, lv2
from meta._threads import cores, set_threads

try:
    import torch
except ImportError:
    torch = None

LR, MOMENTUM = 0.01, 0.9
PAUSE_S = 0.3  # before each timed block, see measure()
Step = Callable[[], float]  # one training step; returns the loss


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds this process has used)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    own = os.times()
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def environment() -> dict:
    blas = [f"{p['internal_api']} {p.get('version')} ({p.get('architecture', '?')}, "
            f"{p.get('threading_layer', '?')})"
            for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    cpu = platform.processor() or "unknown"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    return {"python": platform.python_version(), "numpy": np.__version__,
            "blas": ", ".join(blas) or "unknown", "torch": torch.__version__ if torch else None,
            "cpu": cpu, "cores": cores(), "cpu_count": os.cpu_count()}


def meta_step(x: np.ndarray, y: np.ndarray, backends: tuple[str, ...]) -> Step:
    graph = lv1.mlp(seed=0)
    executor = lv1.ReferenceExecutor(graph, backends=backends)
    optimizer = lv2.Optimizer(lv2.sgd(LR, MOMENTUM), graph.parameters)
    feeds = {"input": x, "labels": y}

    def step() -> float:
        values, grads = executor.inference_and_backprop(feeds, loss="loss")
        optimizer.step(grads)
        return float(values["loss"])
    return step


def torch_step(x: np.ndarray, y: np.ndarray) -> Step:
    params = lv1.mlp(seed=0).parameters  # start from meta's initial weights
    layers: list = [torch.nn.Flatten()]
    for i in range(3):
        w = params[f"fc{i}.weight"]
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w))
            linear.bias.copy_(torch.from_numpy(params[f"fc{i}.bias"]))
        layers += [linear, torch.nn.ReLU()] if i < 2 else [linear]
    model, loss_fn = torch.nn.Sequential(*layers), torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(xt), yt)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def measure(steps: dict[str, Step], batch: int, n_steps: int, repeats: int,
            warmup: int) -> dict[str, list[float]]:
    """Samples/s of each timed block, the variants' blocks interleaved."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            # The previous variant's thread pools (OpenBLAS, OpenMP) spin for a while after its
            # last call; on 2 cores that took a core from this block (PyTorch ran 30 % slower).
            time.sleep(PAUSE_S)
            step()
            start = time.perf_counter_ns()
            for _ in range(n_steps):
                step()
            rates[name].append(batch * n_steps * 1e9 / (time.perf_counter_ns() - start))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=9, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated, run in this order")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    env = environment()
    print(f"python {env['python']}, numpy {env['numpy']}, BLAS {env['blas']}")
    print(f"torch {env['torch'] or 'not installed'}; CPU {env['cpu']}, "
          f"{env['cores']} usable cores ({env['cpu_count']} online)")
    print(f"MLP 784-512-512-10, batch {args.batch}, SGD lr {LR} momentum {MOMENTUM}; "
          f"{args.warmup} warm-up steps, {args.repeats} blocks of {args.steps} steps per variant")
    if torch is None:
        print("PyTorch is not installed, so it is left out; to compare: pip install torch==2.13.0")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, args.batch, dtype=np.int64)
    steps = {"meta numpy": meta_step(x, y, ("numpy",)),
             "meta native": meta_step(x, y, ("native", "numpy"))}
    if torch is not None:
        steps["pytorch"] = torch_step(x, y)
    first = {name: step() for name, step in steps.items()}  # same weights and data: same loss
    print("first-step loss: " + ", ".join(f"{n} {v:.5f}" for n, v in first.items()))

    results, others = [], {}
    for n in threads:
        set_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
        start, (busy0, own0) = time.perf_counter(), busy_seconds()
        rates = measure(steps, args.batch, args.steps, args.repeats, args.warmup)
        busy1, own1 = busy_seconds()
        others[n] = max(0.0, (busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - start)
        results += [{"threads": n, "variant": name, "median": statistics.median(r),
                     "min": min(r), "max": max(r), "samples_per_s": r}
                    for name, r in rates.items()]

    print(f"\n{'threads':>7}  {'variant':<12} {'samples/s':>10} {'min-max':>17} {'ms/step':>8}")
    for r in results:
        print(f"{r['threads']:>7}  {r['variant']:<12} {r['median']:>10.0f} "
              f"{r['min']:>8.0f}-{r['max']:<8.0f} {1e3 * args.batch / r['median']:>8.2f}")
    median = {(r["threads"], r["variant"]): r["median"] for r in results}
    print("\nratios of medians, this run:")
    for n in threads:
        vs_torch = ", ".join(f"{v}/pytorch {median[n, v] / median[n, 'pytorch']:.2f}"
                             for v in steps if torch is not None and v != "pytorch")
        print(f"  {n} thread(s): {vs_torch or '-'}  (other processes busy: {others[n]:.2f} "
              f"cores{'; figures unreliable' if others[n] > 0.1 else ''})")
    if len(threads) > 1:
        a, b = threads[0], threads[-1]
        print(f"  speed-up {b} vs {a} thread(s): " + ", ".join(
            f"{v} {median[b, v] / median[a, v]:.2f}x" for v in steps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "first_loss": first,
                       "other_processes_cores": others, "results": results}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
