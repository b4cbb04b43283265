"""Time to accuracy on MNIST: meta's executors against PyTorch training the same network.

    python benchmarks/time_to_accuracy.py                    # MLP to 97 %, 1 then 2 threads
    python benchmarks/time_to_accuracy.py --model lenet5 --target 0.98 --json out.json

The MLP 784-512-512-10 (batch 128, the main job's) or LeNet-5 (batch 64) from meta's seed-0
weights, SGD with momentum 0.9 (lr 0.05; 0.01 for LeNet-5), at most 5 epochs; one loop for
every variant: the same batches in the same order (meta's seeded sampler), a test-set
evaluation after every epoch.
``meta planned`` and ``meta native`` step that executor + meta's SGD; ``pytorch`` runs the
same graph in PyTorch eager, node by node (``train_step.torch_forward``: ``F.conv2d``,
``F.linear``, ...), with ``torch.optim.SGD``. Each variant runs in a fresh process per thread
count (two frameworks' thread pools in one process slowed each other), ``--runs`` times; the
time to accuracy is the training time (evaluations excluded) until the first epoch whose test
accuracy reaches ``--target``; the figure is the median over runs, and the ratio PyTorch /
meta (above 1: meta is there sooner).
Needs torch and MNIST (``META_MNIST_DIR``, or the download cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

EPOCHS, MOMENTUM = 5, 0.9
BATCH = {"mlp": 128, "lenet5": 64}
LR = {"mlp": 0.05, "lenet5": 0.01}  # 0.05 left LeNet-5 wandering about 96 %
VARIANTS = ("meta planned", "meta native", "pytorch")


def run(model: str, variant: str, threads: int, target: float) -> dict:
    from meta import lv1
    from meta.common.threads import set_threads
    from meta.lv2 import Optimizer, sgd
    from meta.lv2.datasets import mnist
    from meta.lv2.sampler import ShuffleSampler

    set_threads(threads)
    train, test = mnist("train"), mnist("test")
    graph = {"mlp": lv1.mlp, "lenet5": lv1.lenet5}[model](seed=0)
    sampler = ShuffleSampler(len(train), BATCH[model], seed=0)
    if variant == "pytorch":
        import torch
        from train_step import torch_forward

        torch.set_num_threads(threads)
        params = {k: torch.nn.Parameter(torch.from_numpy(v.copy()))
                  for k, v in graph.parameters.items()}
        loss_of, logits_of = torch_forward(graph, params), torch_forward(graph, params, "logits")
        opt = torch.optim.SGD(params.values(), lr=LR[model], momentum=MOMENTUM)

        def step(x, y):
            opt.zero_grad()
            loss = loss_of(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            opt.step()

        def predict(x):
            with torch.no_grad():
                return logits_of(torch.from_numpy(x)).numpy()
        modes = (lambda: None, lambda: None)  # no state that depends on the mode
    else:
        executor = lv1.EXECUTORS[variant.split()[1]](graph)
        optimizer = Optimizer(sgd(LR[model], momentum=MOMENTUM), graph.parameters)

        def step(x, y):
            _, grads = executor.inference_and_backprop({"input": x, "labels": y})
            optimizer.step(grads)

        def predict(x):
            return executor.inference({"input": x}, ["logits"])["logits"]
        modes = (executor.train, executor.eval)
    elapsed, reached, epochs = 0.0, None, []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        modes[0]()
        start = time.perf_counter()
        for indices in sampler:
            step(*train.batch(indices))
        elapsed += time.perf_counter() - start
        modes[1]()
        correct = 0
        for i in range(0, len(test), 1000):
            x, y = test.batch(np.arange(i, min(i + 1000, len(test))))
            correct += int((predict(x).argmax(1) == y).sum())
        accuracy = correct / len(test)
        epochs.append({"epoch": epoch + 1, "train_s": elapsed, "test_accuracy": accuracy})
        if reached is None and accuracy >= target:
            reached = elapsed
            break
    return {"model": model, "variant": variant, "threads": threads,
            "time_to_target_s": reached, "epochs": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp", choices=sorted(BATCH))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.model, args.child[0], int(args.child[1]), args.target)))
        return
    from harness import child_run, environment, print_environment

    env = environment()
    print_environment(env)
    results = []
    variants = args.variants.split(",")
    for threads in (int(t) for t in args.threads.split(",")):
        for _ in range(args.runs):
            for variant in variants:  # taking turns
                results.append(child_run(__file__, variant, threads, "--target",
                                         str(args.target), "--model", args.model))
                r = results[-1]
                print(f"{variant:<13} {threads} thread(s): {r['time_to_target_s']} s to "
                      f"{args.target:.1%} ({r['epochs'][-1]['test_accuracy']:.2%} after epoch "
                      f"{r['epochs'][-1]['epoch']})", flush=True)
        times = {v: [r["time_to_target_s"] for r in results if r["variant"] == v
                     and r["threads"] == threads and r["time_to_target_s"] is not None]
                 for v in variants}
        m = {v: statistics.median(t) for v, t in times.items() if t}
        shown = ", ".join(f"{v} {t:.2f} s" for v, t in m.items())
        vs = ", ".join(f"pytorch / {v} {m['pytorch'] / t:.2f}" for v, t in m.items()
                       if "pytorch" in m and v != "pytorch")
        print(f"== {args.model}, {threads} thread(s): median time to {args.target:.0%}: "
              f"{shown}; {vs}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "model": args.model,
                                         "target": args.target, "results": results},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
