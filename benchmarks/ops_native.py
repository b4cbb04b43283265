"""Op-level times of the native (C++) kernels against numpy and PyTorch: Conv at the LeNet-5 and
wide-CNN layer shapes (batch 64, MNIST 28x28), their max pools, and Gemm at MLP / fc shapes.

Forward and backward are timed apart: backward reuses one forward's context (PyTorch: one graph,
``retain_graph``). A layer reading the network input does not compute dX, as in training. Each
variant runs ``--repeats`` timed blocks of ``--calls`` calls; the variants' blocks alternate, so
background load hits them alike, and the ratios compare medians of one run. Thread counts run
in the order given (1 first): two-thread figures collapse when anything else runs, so check the
"other processes busy" figure printed with them.

    python benchmarks/ops_native.py                  # threads 1,2
    python benchmarks/ops_native.py --threads 1 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from harness import OtherLoad, environment, interleaved_blocks, print_environment, torch

from meta.common.threads import set_threads
from meta.lv0 import Context, lookup

PAUSE_S = 0.05  # before each timed block: let the previous variant's thread pools go idle
BATCH = 64


@dataclass
class Case:
    name: str
    op_type: str
    since: int
    attrs: dict
    inputs: list[np.ndarray]
    needs: list[bool]  # which inputs want a gradient
    torch_fn: Callable | None  # (*tensors) -> output, the same op in PyTorch


def cases(rng: np.random.Generator) -> list[Case]:
    def r(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    out = []
    conv = [("LeNet conv1", (1, 28, 28), 6, 5, 2, False),
            ("LeNet conv2", (6, 14, 14), 16, 5, 0, True),
            ("wide conv1", (1, 28, 28), 32, 3, 0, False),
            ("wide conv2", (32, 26, 26), 64, 3, 0, True)]
    for name, (c, h, w), m, k, pad, data_grad in conv:
        torch_fn = (lambda x, w, b, pad=pad: torch.nn.functional.conv2d(x, w, b, padding=pad)) \
            if torch else None
        out.append(Case(f"{name} {c}x{h}x{w} -> {m}, {k}x{k}" + (f" pad {pad}" if pad else ""),
                        "Conv", 11, {"kernel_shape": [k, k], "pads": [pad] * 4},
                        [r(BATCH, c, h, w), r(m, c, k, k), r(m)], [data_grad, True, True],
                        torch_fn))
    for name, shape in (("LeNet pool1", (6, 28, 28)), ("wide pool", (64, 24, 24))):
        torch_fn = (lambda x: torch.nn.functional.max_pool2d(x, 2, 2, return_indices=True)) \
            if torch else None
        out.append(Case(f"{name} {'x'.join(map(str, shape))}, 2x2/2", "MaxPool", 12,
                        {"kernel_shape": [2, 2], "strides": [2, 2]}, [r(BATCH, *shape)], [True],
                        torch_fn))
    gemm = [("MLP fc0", 128, 784, 512), ("MLP fc1", 128, 512, 512), ("LeNet fc1", 64, 400, 120),
            ("wide fc1", 64, 9216, 128)]
    for name, n, k, m in gemm:
        torch_fn = (lambda a, w, b: torch.nn.functional.linear(a, w, b)) if torch else None
        out.append(Case(f"{name} {n}x{k} @ {k}x{m}", "Gemm", 13, {"transB": 1},
                        [r(n, k), r(m, k), r(m)], [True, True, True], torch_fn))
    return out


def meta_fns(cls, case: Case) -> tuple[Callable, Callable]:
    op = cls(**case.attrs)
    ctx = Context(case.needs)
    ys = op.apply(ctx, *case.inputs)
    dys = [np.ones_like(y) if y.dtype.kind == "f" else None for y in ys]
    return (lambda: op.apply(Context(case.needs), *case.inputs)), (lambda: op.backward(ctx, *dys))


def torch_fns(case: Case) -> tuple[Callable, Callable]:
    ts = [torch.from_numpy(x).requires_grad_(need) for x, need in zip(case.inputs, case.needs)]
    wanted = [t for t in ts if t.requires_grad]
    y = case.torch_fn(*ts)
    y = y[0] if isinstance(y, tuple) else y
    dy = torch.ones_like(y)
    return (lambda: case.torch_fn(*ts)), \
        (lambda: torch.autograd.grad(y, wanted, dy, retain_graph=True))


def time_blocks(fns: dict[str, Callable], calls: int, repeats: int) -> dict[str, float]:
    """Median ms per call of each variant, the variants' blocks interleaved."""
    for fn in fns.values():
        fn()
    blocks = interleaved_blocks(fns, calls, repeats, PAUSE_S)
    return {name: 1e3 * statistics.median(times) for name, times in blocks.items()}


def fmt(ms: float | None) -> str:
    return f"{ms:8.3f}" if ms is not None else f"{'-':>8}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a is not None and b is not None else f"{'-':>6}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5, help="calls per timed block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per variant")
    parser.add_argument("--threads", default="1,2", help="comma-separated, run in this order")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()

    env = environment()
    print_environment(env)
    print(f"float32, batch {BATCH}; median of {args.repeats} blocks of {args.calls} calls, "
          f"variants interleaved; ms per call")

    all_cases = cases(np.random.default_rng(0))
    results, others = [], {}
    for threads in (int(t) for t in args.threads.split(",")):
        set_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        with OtherLoad() as load:
            print(f"\n{threads} thread(s)")
            print(f"  {'op':<44} {'pass':<4} {'numpy':>8} {'native':>8} {'pytorch':>8} "
                  f"{'np/nat':>6} {'pt/nat':>6}")
            for case in all_cases:
                numpy_cls = lookup(case.op_type, case.since, backends=("numpy",))
                native_cls = lookup(case.op_type, case.since, backends=("native",))
                variants = {"numpy": meta_fns(numpy_cls, case)}
                if native_cls is not numpy_cls:
                    variants["native"] = meta_fns(native_cls, case)
                if torch is not None and case.torch_fn is not None:
                    variants["pytorch"] = torch_fns(case)
                for i, which in enumerate(("fwd", "bwd")):
                    ms = time_blocks({v: fns[i] for v, fns in variants.items()}, args.calls,
                                     args.repeats)
                    nat = ms.get("native")
                    print(f"  {case.name if i == 0 else '':<44} {which:<4} {fmt(ms['numpy'])} "
                          f"{fmt(nat)} {fmt(ms.get('pytorch'))} {ratio(ms['numpy'], nat)} "
                          f"{ratio(ms.get('pytorch'), nat)}"
                          + ("" if nat is not None or i else "  (no native twin: numpy only)"),
                          flush=True)
                    results.append({"threads": threads, "op": case.name, "pass": which, **ms})
        others[threads] = load.cores
        print(f"  ({load.describe()})")
    print("\nnp/nat: numpy time / native time (> 1: native faster); pt/nat: PyTorch time / "
          "native time (>= 1: native at least as fast as PyTorch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "other_processes_cores": others,
                       "results": results}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
