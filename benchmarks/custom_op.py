"""A C++ custom operator in the planned executor's fast path, against the same computation in
built-in kernels.

Run:  python benchmarks/custom_op.py [--hidden 512,512 --batch 64 --calls 20 --repeats 7]
      (OMP_NUM_THREADS=1 on a machine other processes keep busy: spinning OpenMP threads
      there cost more than the kernels)

One MLP training step (forward and backward, planned executor) with SiLU as its hidden
activation, four ways, the same weights and batch, timed in interleaved blocks in one run:

* ``built-in``: SiLU as PyTorch exports it, ``Sigmoid`` then ``Mul``: oneDNN kernels;
* ``C++ op``: ``Swish`` from ``examples/cpp_ops/swish.cpp``, registered at run time with
  ``meta.register_cpp_op``: a compiled step of the plan (its kernel on the plan's buffers),
  built with the default flags (-O3);
* ``C++ op, --flags``: the same source built with ``--flags`` (default ``-march=native
  -ffast-math``). oneDNN's sigmoid is JIT-compiled for this CPU's vector units with a
  polynomial exp; a C++ loop calling ``std::exp`` is vectorised only for a named ISA and under
  -ffast-math (glibc's vector exp), so this is the like-for-like build of the kernel;
* ``Python op``: the same Swish as a numpy operator: a Python step (for scale).

It checks that the four agree (loss and gradients), prints the median step time of each and
the C++ operators' speed relative to the built-in kernels; the target, >= 0.8x, is judged on
the like-for-like build (the exit status: 1 below it). The plan's own cost for a compiled step
is one call from the plan into the bound kernel: what separates the two C++ rows is the
kernel's code alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import meta
from meta.lv0 import Operator, register, registry
from meta.lv1 import PlannedExecutor
from meta.lv1.layers import Flatten, Linear, Op, Sequential, Silu
from meta.lv1.plan.runtime import module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import OtherLoad, interleaved_blocks  # noqa: E402

SWISH = Path(__file__).resolve().parents[1] / "examples" / "cpp_ops" / "swish.cpp"
TARGET = 0.8


class PySwish(Operator):
    """x * sigmoid(x) in numpy: what a user's Python operator costs in a plan."""

    def forward(self, ctx, x):
        s = 1.0 / (1.0 + np.exp(-x))
        ctx.save(x=x, s=s)
        return (x * s).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        s = ctx.s
        return ((dy * (s + ctx.x * s * (1 - s))).astype(dy.dtype, copy=False),)


def model(hidden: list[int], activation) -> object:
    layers = [Flatten()]
    for width in hidden:
        layers += [Linear(width), activation()]
    return Sequential(*layers, Linear(10)).graph((1, 28, 28), 10, seed=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", default="512,512")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--flags", default="-march=native -ffast-math",
                        help="compiler flags of the like-for-like C++ build")
    args = parser.parse_args()
    hidden = [int(h) for h in args.hidden.split(",")]
    with registry.scratch():
        meta.register_cpp_op("Swish", SWISH, attributes={"beta": 1.0})
        meta.register_cpp_op("SwishTuned", SWISH, attributes={"beta": 1.0},
                             extra_flags=args.flags.split())
        register("PySwish", domain="bench")(PySwish)
        tuned = f"C++ op, {args.flags}"
        graphs = {"built-in": model(hidden, Silu),
                  "C++ op": model(hidden, lambda: Op("Swish", domain="ai.meta.custom")),
                  tuned: model(hidden, lambda: Op("SwishTuned", domain="ai.meta.custom")),
                  "Python op": model(hidden, lambda: Op("PySwish", domain="bench"))}
        rng = np.random.default_rng(0)
        feeds = {"input": rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32),
                 "labels": rng.integers(0, 10, args.batch)}
        executors = {name: PlannedExecutor(g).train() for name, g in graphs.items()}
        results = {name: ex.inference_and_backprop(feeds) for name, ex in executors.items()}
        (ref_values, ref_grads) = results["built-in"]
        for name, (values, grads) in results.items():
            np.testing.assert_allclose(values["loss"], ref_values["loss"], rtol=1e-5)
            for key in ref_grads:
                np.testing.assert_allclose(grads[key], ref_grads[key], rtol=1e-3, atol=1e-6,
                                           err_msg=f"{name}: {key}")
        for name in ("C++ op", tuned):
            where = executors[name].placement()
            print(f"placement of the nodes of {name}: "
                  f"{sorted({where[n.name] for n in graphs[name].nodes if n.domain})}")
        steps = {name: (lambda ex=ex: ex.inference_and_backprop(feeds))
                 for name, ex in executors.items()}
        with OtherLoad() as load:
            samples = interleaved_blocks(steps, args.calls, args.repeats, pause_s=0.05)
    median = {name: float(np.median(s)) for name, s in samples.items()}
    print(f"MLP 784-{'-'.join(map(str, hidden))}-10, batch {args.batch}, one training step "
          f"(planned executor, {module().max_threads()} threads), median of {args.repeats} "
          f"blocks of {args.calls}; {load.describe()}")
    width = max(map(len, median))
    for name, t in median.items():
        print(f"  {name:<{width}} {t * 1e3:8.3f} ms   {args.batch / t:10.0f} samples/s")
    default = median["built-in"] / median["C++ op"]
    ratio = median["built-in"] / median[tuned]
    ok = ratio >= TARGET
    print(f"C++ custom op speed relative to built-in kernels: {ratio:.2f}x built with "
          f"{args.flags} (target >= {TARGET}x): {'PASS' if ok else 'FAIL'}; {default:.2f}x "
          f"with the default flags")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
