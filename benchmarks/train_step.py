"""Training-step throughput and peak memory: meta's executors against PyTorch, same network.

Models (``--models``): the MLP 784-512-512-10 (batch 128), LeNet-5 (batch 64) and the wide CNN
conv3x3(32), conv3x3(64), maxpool, fc128, fc10 (batch 64), all on 28x28 inputs. A step is
forward + backward + SGD-momentum update on one synthetic batch made once. Variants: meta's
reference executor (numpy), meta's native executor (C++ kernels) and PyTorch eager running the
same graph with the same initial weights (when torch is installed). Each variant runs warm-up
steps, then ``--repeats`` timed blocks of ``--steps`` steps; the variants' blocks alternate (each
after a short pause and one untimed step) so background noise hits them alike. Thread counts
run in the order given (1 first): on a small machine two-thread timings collapse when anything
else runs, so compare only ratios from one run, and check the "other processes busy" figure.

``--memory`` measures instead the peak resident memory a training step adds over the process
before its first step (parameters, data and imports already there), each variant in a fresh
process with 1 thread: Linux's peak-RSS counter is reset just before the steps.

    python benchmarks/train_step.py                          # all models, threads 1,2
    python benchmarks/train_step.py --models lenet5 --steps 20 --repeats 3 --json out.json
    python benchmarks/train_step.py --memory                 # peak memory, LeNet-5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable

import numpy as np
from harness import OtherLoad, environment, interleaved_blocks, print_environment, torch

from meta import lv1, lv2
from meta._threads import set_threads

if torch is not None:
    import torch.nn.functional as F

LR, MOMENTUM = 0.01, 0.9
PAUSE_S = 0.3  # before each timed block, see measure()
MODELS = {  # name -> (graph builder, batch size)
    "mlp": (lambda: lv1.mlp(seed=0), 128),
    "lenet5": (lambda: lv1.lenet5(seed=0), 64),
    "wide_cnn": (lambda: lv1.wide_cnn(seed=0), 64),
}
Step = Callable[[], float]  # one training step; returns the loss


def synthetic_batch(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, 1, 28, 28), dtype=np.float32),
            rng.integers(0, 10, batch, dtype=np.int64))


def meta_step(model: str, executor_name: str, x: np.ndarray, y: np.ndarray,
              **executor_options: object) -> Step:
    """One training step of ``model`` on meta's executor ``executor_name`` (its options, e.g.
    ``device`` of ``pytorch``), updated by meta's SGD."""
    graph = MODELS[model][0]()
    executor = lv1.EXECUTORS[executor_name](graph, **executor_options)
    optimizer = lv2.Optimizer(lv2.sgd(LR, MOMENTUM), graph.parameters)
    feeds = {"input": x, "labels": y}

    def step() -> float:
        values, grads = executor.inference_and_backprop(feeds, loss="loss")
        optimizer.step(grads)
        return float(values["loss"])
    return step


def torch_forward(graph: lv1.Graph, params: dict) -> Callable:
    """PyTorch eager ops running ``graph``'s nodes (the ops these models use)."""
    def conv(n, x, w, b=None):
        pads = n.attrs.get("pads") or [0] * 4
        return F.conv2d(x, w, b, stride=tuple(n.attrs.get("strides") or (1, 1)),
                        padding=tuple(pads[:2]), dilation=tuple(n.attrs.get("dilations") or (1, 1)),
                        groups=n.attrs.get("group", 1))

    ops = {
        "Conv": conv,
        "Relu": lambda n, x: F.relu(x),
        "MaxPool": lambda n, x: F.max_pool2d(x, tuple(n.attrs["kernel_shape"]),
                                             tuple(n.attrs.get("strides") or (1, 1))),
        "Flatten": lambda n, x: torch.flatten(x, 1),
        "Gemm": lambda n, x, w, b: F.linear(x, w, b),  # the models' Gemm: transB=1
        "SoftmaxCrossEntropyLoss": lambda n, s, t: F.cross_entropy(s, t),
    }

    def forward(x, labels):
        values = {**params, "input": x, "labels": labels}
        for node in graph.nodes:
            values[node.outputs[0]] = ops[node.op_type](node, *(values[i] for i in node.inputs))
        return values["loss"]
    return forward


def torch_step(model: str, x: np.ndarray, y: np.ndarray) -> Step:
    graph = MODELS[model][0]()  # meta's graph and initial weights
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in
              graph.parameters.items()}
    forward = torch_forward(graph, params)
    optimizer = torch.optim.SGD(params.values(), lr=LR, momentum=MOMENTUM)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = forward(xt, yt)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def make_steps(model: str, x: np.ndarray, y: np.ndarray) -> dict[str, Step]:
    steps = {"meta reference": meta_step(model, "reference", x, y),
             "meta native": meta_step(model, "native", x, y)}
    if torch is not None:
        steps["pytorch"] = torch_step(model, x, y)
    return steps


def measure(steps: dict[str, Step], batch: int, n_steps: int, repeats: int,
            warmup: int) -> dict[str, list[float]]:
    """Samples/s of each timed block, the variants' blocks interleaved."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    blocks = interleaved_blocks(steps, n_steps, repeats, PAUSE_S)
    return {name: [batch / t for t in times] for name, times in blocks.items()}


def throughput(args: argparse.Namespace) -> dict:
    threads = [int(t) for t in args.threads.split(",")]
    results, others, first = [], {}, {}
    for model in args.models.split(","):
        batch = MODELS[model][1]
        x, y = synthetic_batch(batch)
        set_threads(threads[0])
        steps = make_steps(model, x, y)
        first[model] = {name: step() for name, step in steps.items()}  # same model: same loss
        print(f"{model}, batch {batch}, first-step loss: "
              + ", ".join(f"{n} {v:.5f}" for n, v in first[model].items()), flush=True)
        for n in threads:
            set_threads(n)
            if torch is not None:
                torch.set_num_threads(n)
            with OtherLoad() as load:
                rates = measure(steps, batch, args.steps, args.repeats, args.warmup)
            others[f"{model}/{n}"] = load
            results += [{"model": model, "batch": batch, "threads": n, "variant": name,
                         "median": statistics.median(r), "min": min(r), "max": max(r),
                         "samples_per_s": r} for name, r in rates.items()]

    print(f"\n{'model':<9} {'threads':>7}  {'variant':<15} {'samples/s':>10} {'min-max':>17} "
          f"{'ms/step':>8}")
    for r in results:
        print(f"{r['model']:<9} {r['threads']:>7}  {r['variant']:<15} {r['median']:>10.0f} "
              f"{r['min']:>8.0f}-{r['max']:<8.0f} {1e3 * r['batch'] / r['median']:>8.2f}")
    median = {(r["model"], r["threads"], r["variant"]): r["median"] for r in results}
    print("\nratios of medians, this run (throughput; > 1 means meta is faster):")
    for model in args.models.split(","):
        for n in threads:
            m = {v: median[model, n, v] for v in ("meta reference", "meta native", "pytorch")
                 if (model, n, v) in median}
            vs = [f"native/reference {m['meta native'] / m['meta reference']:.2f}"]
            if torch is not None:
                vs += [f"{v.split()[1]}/pytorch {m[v] / m['pytorch']:.2f}"
                       for v in ("meta reference", "meta native")]
            print(f"  {model:<9} {n} thread(s): {', '.join(vs)}  "
                  f"({others[f'{model}/{n}'].describe()})")
    return {"first_loss": first, "results": results,
            "other_processes_cores": {k: v.cores for k, v in others.items()}}


def memory_child(model: str, variant: str, steps: int) -> None:
    """Runs in a fresh process: prints the peak RSS (bytes) the steps added."""
    set_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    x, y = synthetic_batch(MODELS[model][1])
    step = (torch_step(model, x, y) if variant == "pytorch"
            else meta_step(model, variant.split()[1], x, y))
    with open("/proc/self/status") as f:
        before = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    for _ in range(steps):
        step()
    with open("/proc/self/status") as f:
        peak = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) * 1024
    print(json.dumps({"before": before, "peak": peak}))


def memory(args: argparse.Namespace) -> dict:
    variants = ["meta reference", "meta native"] + (["pytorch"] if torch is not None else [])
    results = {}
    model = args.models.split(",")[0] if args.models != ",".join(MODELS) else "lenet5"
    for variant in variants:
        out = subprocess.run([sys.executable, __file__, "--memory-child", variant, "--models",
                              model, "--steps", str(args.memory_steps)], check=True,
                             capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"\n{model}, batch {MODELS[model][1]}, {args.memory_steps} steps, 1 thread, each "
          f"variant in a fresh process:")
    print(f"{'variant':<15} {'RSS before MiB':>15} {'step peak adds MiB':>19}")
    for variant, r in results.items():
        added = (r["peak"] - r["before"]) / 2**20
        print(f"{variant:<15} {r['before'] / 2**20:>15.1f} {added:>19.1f}")
    if torch is not None:
        base = results["pytorch"]["peak"] - results["pytorch"]["before"]
        for variant in variants[:2]:
            added = results[variant]["peak"] - results[variant]["before"]
            print(f"  {variant}/pytorch peak added by a step: {added / base:.2f}x")
    return {"model": model, "memory": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                        + ", ".join(MODELS))
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated, run in this order")
    parser.add_argument("--memory", action="store_true", help="peak memory of a step instead")
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {sorted(MODELS)}")
    if args.memory_child:
        return memory_child(args.models.split(",")[0], args.memory_child, args.steps)

    env = environment()
    print_environment(env)
    if not args.memory:
        print(f"SGD lr {LR} momentum {MOMENTUM}; {args.warmup} warm-up steps, {args.repeats} "
              f"blocks of {args.steps} steps per variant")
    report = memory(args) if args.memory else throughput(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), **report}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
