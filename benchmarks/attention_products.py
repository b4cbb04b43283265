"""The fused attention node alone (``meta/lv1/plan/lowering/attention.py``) at the six
architectures' attention sizes: its training step (forward and backward) in GFLOP/s, under
several settings of the lowering, in one run, interleaved (issue 41: is the attention's
batched product the slow kernel of the transformer fixtures?).

The graph is what ``torch.onnx.export`` writes for one SDPA: Q, K and V of (N, T, H, D) as a
projection leaves them, split into heads by Transposes, ``MatMul``, ``Mul`` by 1/sqrt(D), the
causal mask added (GPT-2, Llama) or not (ViT, T5's products), ``Softmax``, ``MatMul``, the
heads merged by a Transpose, and a weighted sum as the loss. Per setting, the attention's
steps (the heads' split and merge included) are timed in the plan (``Program.profile``: each
step's fastest of ``--rounds`` calls, so another process's preemption drops out), and GFLOP/s
counts the products a dense step does (forward Q.K^T and P.V, backward Q.K^T again, dP, dQ,
dK, dV: 7 x 2NHT^2D, also under a causal mask, so settings compare as work per second of the
same step). A matrix product of the BENCH GPT-2's MLP (1024 x 256 x 1024, oneDNN, same
runtime) runs in the same rounds as the yardstick: the throughput a projection gets in the
same minutes.

Settings: ``block B`` is the causal query block (``attention.BLOCK``; ``whole``: one block,
every product dense); ``scratch K`` the scores' scratch in KiB (``attention.SCRATCH_BYTES``:
how many heads one chunk of products takes); ``unfused`` lowers the nodes one by one
(``attention.ENABLED = False``).

    python benchmarks/attention_products.py                       # the fixtures' sizes
    python benchmarks/attention_products.py --sizes 8x4x256x64 --rounds 30
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from meta.common.threads import set_threads
from meta.lv1 import GraphBuilder, PlannedExecutor
from meta.lv1.plan import profile_share, runtime
from meta.lv1.plan.lowering import attention

# name -> (N, H, T, D, causal): the BENCH models' attention (benchmarks/architectures.py)
SIZES = {"gpt2": (8, 4, 128, 64, True), "llama": (8, 8, 128, 32, True),
         "t5": (8, 4, 128, 64, False), "vit": (16, 3, 65, 64, False)}


def attention_graph(n: int, h: int, t: int, d: int, causal: bool):
    """One exported SDPA over (N, T, H, D) inputs ``q``, ``k``, ``v``; output ``y`` (N, T, H,
    D) and the scalar ``loss``."""
    b = GraphBuilder("attention", 17)
    q, k, v = (b.input(x, np.float32, (n, t, h, d)) for x in "qkv")
    qh = b.node("Transpose", [q], name="q.t", perm=[0, 2, 1, 3])
    kh = b.node("Transpose", [k], name="k.t", perm=[0, 2, 3, 1])
    vh = b.node("Transpose", [v], name="v.t", perm=[0, 2, 1, 3])
    s = b.node("MatMul", [qh, kh], name="scores")
    scale = b.node("Constant", [], name="scale", value=np.asarray(1 / math.sqrt(d), np.float32))
    s = b.node("Mul", [s, scale], name="scaled")
    if causal:  # constants (a Constant node: an initializer would be a trainable parameter)
        mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
        s = b.node("Add", [s, b.node("Constant", [], name="mask", value=mask)], name="masked")
    p = b.node("Softmax", [s], name="softmax", axis=-1)
    y = b.node("Transpose", [b.node("MatMul", [p, vh], name="mix")], name="y", perm=[0, 2, 1, 3])
    w = b.initializer("w", np.linspace(-1, 1, d, dtype=np.float32))
    loss = b.node("ReduceSum", [b.node("Mul", [y, w], name="weighted")], name="loss",
                  keepdims=0)
    b.output(y, np.float32)
    b.output(loss, np.float32, ())
    return b.build()


def executor(graph, setting: str, t: int, feeds: dict) -> PlannedExecutor:
    """A training executor whose plan was lowered under ``setting`` (a plan is built on the
    first call: that call runs here, under the setting)."""
    saved = attention.BLOCK, attention.ENABLED, attention.SCRATCH_BYTES
    attention.ENABLED = setting != "unfused"
    if setting.startswith("block "):
        attention.BLOCK = t if setting == "block whole" else int(setting.split()[1])
    if setting.startswith("scratch "):
        attention.SCRATCH_BYTES = int(setting.split()[1]) << 10
    try:
        ex = PlannedExecutor(graph).train()
        ex.python_watch.done = True
        train_call(ex, feeds)
        return ex
    finally:
        attention.BLOCK, attention.ENABLED, attention.SCRATCH_BYTES = saved


def train_call(ex: PlannedExecutor, feeds: dict) -> None:
    ex.inference_and_backprop(feeds, outputs=["y"], wrt=["q", "k", "v"])


def node_steps(plan, nodes: set[str]) -> list[tuple[int, int]]:
    """(program, step) of every step the ``nodes`` own, across the training call's programs."""
    return [(k, j) for k, (_, owners) in enumerate(profile_share.programs(plan))
            for j, owner in enumerate(owners) if owner.node in nodes]


def yardstick():
    """The GPT-2 BENCH MLP's product (1024 x 256 x 1024) as one plan step, and its flops."""
    rng = np.random.default_rng(0)
    keep = [rng.standard_normal(s).astype(np.float32) for s in ((1024, 256), (256, 1024))]
    keep.append(np.zeros((1024, 1024), np.float32))
    step = runtime.module().matmul([1024, 256], [256, 1024], False, False, keep[0], keep[1],
                                   None, keep[2], "", 0.0, 0.0, False, False)
    return step, keep, 2 * 1024 * 256 * 1024


def measure(name: str, size: tuple, settings: list[str], rounds: int) -> dict[str, float]:
    """GFLOP/s of the attention node's steps per setting (and of the yardstick product)."""
    n, h, t, d, causal = size
    graph = attention_graph(n, h, t, d, causal)
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((n, t, h, d)).astype(np.float32) for x in "qkv"}
    flops = 7 * 2 * n * h * t * t * d
    runs, owned = {}, {}
    for setting in settings:
        ex = executor(graph, setting, t, feeds)

        def call(ex=ex):
            train_call(ex, feeds)
        plan = ex._last
        for program, _ in profile_share.programs(plan):
            program.profile = True
        runs[setting] = (call, plan)
        # the attention's steps: the chain's nodes and the heads' split and merge (which the
        # fused node reads and writes through strides, where it can)
        owned[setting] = node_steps(plan, {"q.t", "k.t", "v.t", "scores", "scaled", "masked",
                                           "softmax", "mix", "y"})
    step, keep, mm_flops = yardstick()
    best = {s: [math.inf] * len(owned[s]) for s in settings}
    mm_best, wall = math.inf, {s: [] for s in settings}
    for _ in range(rounds):
        for setting, (call, plan) in runs.items():
            before = profile_share.snapshot(plan)
            start = time.perf_counter()
            call()
            wall[setting].append(time.perf_counter() - start)
            after = profile_share.snapshot(plan)
            for i, (k, j) in enumerate(owned[setting]):
                best[setting][i] = min(best[setting][i], after[k][j] - before[k][j])
            start = time.perf_counter()
            step.run()
            mm_best = min(mm_best, time.perf_counter() - start)
    out = {}
    print(f"\n{name}: N {n}, H {h}, T {t}, D {d}, {'causal' if causal else 'no mask'}; "
          f"{flops / 1e6:.0f} MFLOP a dense step; load {os.getloadavg()[0]:.2f}")
    for setting in settings:
        ns = sum(best[setting])
        out[setting] = flops / ns
        print(f"  {setting:<12} attention {ns / 1e6:7.3f} ms {flops / ns:6.1f} GFLOP/s; "
              f"whole step median {np.median(wall[setting]) * 1e3:7.3f} ms")
    out["yardstick"] = mm_flops / mm_best / 1e9
    print(f"  {'projection':<12} 1024x256x1024 matmul {mm_best * 1e3:7.3f} ms "
          f"{out['yardstick']:6.1f} GFLOP/s (same rounds)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="", help="comma-separated fixture names "
                        f"({', '.join(SIZES)}) or NxHxTxD[c] (c: causal); default: all fixtures")
    parser.add_argument("--settings", default="block 32,block 64,block whole,unfused",
                        help="comma-separated: 'block B', 'block whole', 'scratch KiB', "
                        "'unfused'")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if not runtime.available():
        print("benchmarks/attention_products.py needs meta._plan (pip install -e .)",
              file=sys.stderr)
        return 2
    sizes = {}
    for item in (args.sizes.split(",") if args.sizes else list(SIZES)):
        if item in SIZES:
            sizes[item] = SIZES[item]
            continue
        try:
            dims = [int(v) for v in item.rstrip("c").split("x")]
            assert len(dims) == 4 and min(dims) > 0
        except (ValueError, AssertionError):
            print(f"--sizes: {item!r} is neither a fixture ({', '.join(SIZES)}) nor NxHxTxD[c]",
                  file=sys.stderr)
            return 2
        sizes[item] = (*dims, item.endswith("c"))
    settings = [s.strip() for s in args.settings.split(",")]
    for s in settings:
        word, _, n = s.partition(" ")
        if s not in ("unfused", "block whole") and not (
                word in ("block", "scratch") and n.isdigit() and int(n) > 0):
            print(f"--settings: {s!r} is not 'block B', 'block whole', 'scratch KiB' or "
                  "'unfused'", file=sys.stderr)
            return 2
    from harness import environment, print_environment  # (imports torch: not for the tests)
    set_threads(1)
    print_environment(environment())
    print(f"1 thread; each step's fastest of {args.rounds} rounds, settings interleaved")
    for name, size in sizes.items():
        measure(name, size, settings, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
