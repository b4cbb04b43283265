"""How fast a float32 training step could be at most on this CPU, against the speed-ups issue 41
asks for: is "1.5x PyTorch eager" reachable at all?

A step's matrix products and convolutions must be computed by someone: at best at the
machine's float32 matrix-product rate (``harness.gemm_peak``: a 2048^2 product, the best of
numpy's BLAS and PyTorch's, measured here at 1 thread). Per model, in one run at 1 thread:

- the step's product FLOPs (``harness.graph_flops``: MatMul, Gemm, Conv and recurrent gate
  products of the graph meta trains, 3x the forward; elementwise work, normalisations and
  softmax are left out, so the figure is a floor on the work);
- PyTorch eager's step (forward, backward, SGD with momentum), the median of ``--repeats``
  blocks of ``--steps`` steps, and the rate it reaches over those FLOPs;
- the rate a step 1.5x faster than eager would need, as a fraction of the peak. Above 1.0 no
  float32 implementation that does those products can reach it on this CPU (a product at
  this CPU's best measured rate, everything else free); near 1.0 none would in practice.

The models: the six architecture fixtures (``benchmarks/architectures.py``'s, exported the
same way) and the float32 LSTM LM and ResNet-18 of ``benchmarks/train_step.py``.

    python benchmarks/flop_bound.py [--models gpt2,resnet18] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
from harness import environment, gemm_peak, graph_flops, print_environment, torch

from meta.common.files import write_text
from meta.common.threads import set_threads

TRAIN_STEP_MODELS = ("lstm_lm512", "resnet18")
SPEED_UP = 1.5  # issue 41's bound over eager


def fixture_case(name: str, folder: Path) -> tuple[int, Callable[[], float]]:
    """(product FLOPs of a step, PyTorch eager's step) of an architecture fixture."""
    import architectures
    from train_step import LR, MOMENTUM

    fx = architectures.fixtures_module()
    build, spec, classes, batch = fx.BENCH[name]
    torch.manual_seed(0)
    model = build().train()
    x, y = fx.example(spec, classes, batch, name in fx.LANGUAGE, np.random.default_rng(0))
    proto, graph, _ = architectures.trainable_export(fx, model, (torch.from_numpy(x),),
                                                     folder, name)
    flops = graph_flops(graph, {proto.graph.input[0].name: x, "labels": y})
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()
    return flops, step


def train_step_case(name: str) -> tuple[int, Callable[[], float]]:
    """(product FLOPs of a step, PyTorch eager's step) of a ``train_step.py`` model."""
    import train_step

    x, y = train_step.synthetic_batch(train_step.MODELS[name][1], name)
    graph = train_step.graph_of(name)
    flops = graph_flops(graph, {graph.inputs[0].name: x, "labels": y})
    return flops, train_step.torch_step(name, x, y)


def eager_seconds(step: Callable[[], float], steps: int, repeats: int) -> float:
    """The median over ``repeats`` blocks of a block's seconds per step (after 2 warm-up steps)."""
    step()
    step()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        blocks.append((time.perf_counter() - start) / steps)
    return statistics.median(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="eager steps a block")
    parser.add_argument("--repeats", type=int, default=5, help="blocks per model")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if torch is None:
        print("flop_bound: needs PyTorch (pip install 'torch==2.13.0+cpu')", file=sys.stderr)
        return 2
    import architectures

    fixtures = list(architectures.fixtures_module().BENCH)
    names = args.models.split(",") if args.models else fixtures + list(TRAIN_STEP_MODELS)
    unknown = sorted(set(names) - set(fixtures) - set(TRAIN_STEP_MODELS))
    if unknown:
        print(f"flop_bound: unknown model(s) {unknown}; choose from "
              f"{fixtures + list(TRAIN_STEP_MODELS)}", file=sys.stderr)
        return 2
    set_threads(1)
    torch.set_num_threads(1)
    env = environment()
    print_environment(env)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            flops, step = (fixture_case(name, Path(tmp)) if name in fixtures
                           else train_step_case(name))
            seconds = eager_seconds(step, args.steps, args.repeats)
            peak, source = gemm_peak(1)  # measured next to each model: the load moves both
            eager_rate = flops / seconds / 1e9
            needed = SPEED_UP * eager_rate
            rows[name] = {"gflop_per_step": flops / 1e9, "eager_ms": 1e3 * seconds,
                          "eager_gflops": eager_rate, "needed_gflops": needed,
                          "peak_gflops": peak, "peak_source": source,
                          "needed_over_peak": needed / peak,
                          "load_average": os.getloadavg()[0]}
            print(f"{name:14s} {flops / 1e9:7.2f} GFLOP/step  eager {1e3 * seconds:7.1f} ms "
                  f"= {eager_rate:5.1f} GFLOP/s; {SPEED_UP}x eager needs {needed:5.1f} GFLOP/s "
                  f"= {needed / peak:4.2f} of the float32 peak ({peak:.0f}, {source}); load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        write_text(args.json, json.dumps({"environment": env, "args": vars(args),
                                          "speed_up": SPEED_UP, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
