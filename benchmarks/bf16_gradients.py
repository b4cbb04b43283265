"""How far bf16 gradients are from float32's, per harness model: meta's planned executor with
``precision="bf16"`` against ``precision="f32"``, and PyTorch under
``torch.autocast("cpu", dtype=torch.bfloat16)`` against PyTorch in float32, each pair on the
same weights and the same batch (issue 42's acceptance asks within 2e-2, relative norm).

The models are ``train_step.py``'s (``--models``), their batches its batches (``--batch N``
takes the first N examples). Each figure is the relative norm difference of all parameters'
gradients together, ``||g_bf16 - g_f32|| / ||g_f32||``; the row ends with the parameter
furthest off in each framework (of those holding at least 1e-3 of the gradient's norm: a
parameter whose float32 gradient is zero but for rounding, as a softmax's key bias, has no
relative difference worth the name). The columns:

- ``meta bf16``: meta's bf16 step against its float32 step;
- ``autocast``: PyTorch's, the field's baseline: where it too is beyond 2e-2, bf16's rounding,
  not meta, moves the gradients;
- ``autocast, f32 kinks``: the autocast pass with float32's ReLU, ReLU6 and max-pool decisions
  replayed (``torch_kinks.py``): what is left when no unit near its kink goes the other way;
- ``meta f32 on bf16 weights``: meta in float32 with only the weights rounded to bf16, against
  float32: how far the model's gradient moves under bf16's rounding at all.

On ReLU networks at initialisation a few units in 10^4 whose input lies within bf16's
rounding of the kink flip, and each moves the gradient of every layer before it by its whole
gradient: the first layers' gradients move 5-40 % (in any framework, and in float32 under
rounded weights alone); replaying float32's decisions takes most of it away.

    python benchmarks/bf16_gradients.py
    python benchmarks/bf16_gradients.py --models mlp,lenet5 --batch 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import train_step
from harness import environment, print_environment, torch

from meta import lv1
from meta.common.threads import set_threads

if torch is not None:
    from torch_kinks import Kinks

BOUND = 2e-2  # issue 42's acceptance bound
SMALL = 1e-3  # a parameter below this share of the gradient's norm has no worst-of say


def relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def compare(g16: dict[str, np.ndarray], g32: dict[str, np.ndarray]) -> dict:
    """The global relative difference, and each parameter's."""
    names = sorted(g32)
    total = np.sqrt(sum(float(np.sum(np.float64(g32[n]) ** 2)) for n in names))
    each = {n: relative(g16[n], g32[n]) for n in names}
    counted = {n: r for n, r in each.items()
               if np.linalg.norm(np.float64(g32[n])) >= SMALL * total}
    worst = max(counted, key=counted.get)
    return {"global": relative(np.concatenate([g16[n].ravel() for n in names]),
                               np.concatenate([g32[n].ravel() for n in names])),
            "worst": worst, "worst_relative": counted[worst], "per_parameter": each}


def to_bf16(a: np.ndarray) -> np.ndarray:
    """``a`` (float32) rounded to the nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).reshape(np.shape(a))


def meta_gradients(graph: lv1.Graph, feeds: dict, precision: str) -> dict[str, np.ndarray]:
    executor = lv1.PlannedExecutor(graph, precision=precision)
    _, grads = executor.inference_and_backprop(feeds, "loss")
    if precision == "bf16" and "onednn bf16" not in executor.placement().values():
        sys.exit("bf16_gradients.py: meta's step ran no bf16 product (see the line above): "
                 "nothing to measure")
    return {k: np.array(g, np.float32, copy=True) for k, g in grads.items()}


def model_pair(model: str) -> tuple[lv1.Graph, object, dict]:
    """(meta's graph, PyTorch's loss function of (x, y), PyTorch's named parameters) of
    ``model``, holding the same weights: the module written in PyTorch and meta's load of its
    export, meta's language model and its PyTorch twin, or meta's graph and PyTorch running
    it op by op. Without PyTorch: (graph, None, None) for the models meta builds."""
    F = torch.nn.functional if torch is not None else None
    if train_step.MODELS[model][0] is None:  # written in PyTorch: meta runs its export
        net, graph = train_step.torch_models.build(model)
        net.train()
        return graph, lambda x, y: F.cross_entropy(net(x), y), dict(net.named_parameters())
    graph = train_step.graph_of(model)
    if torch is None:
        return graph, None, None
    if train_step.language_model(model):
        net = train_step.torch_models.LANGUAGE_MODELS[model][2](graph).train()
        return (graph, lambda x, y: F.cross_entropy(net(x).flatten(0, 1), y.flatten()),
                dict(net.named_parameters()))
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy()))
              for k, v in graph.parameters.items()}
    return graph, train_step.torch_forward(graph, params), params


def harness_batch(model: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``batch`` examples of the harness's synthetic batch of ``model``."""
    x, y = train_step.synthetic_batch(train_step.MODELS[model][1], model)
    return x[:batch], y[:batch]


def torch_gradients(loss_of, params: dict, x: np.ndarray, y: np.ndarray,
                    autocast: bool) -> dict[str, np.ndarray]:
    for p in params.values():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_of(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    return {k: p.grad.float().numpy().copy() for k, p in params.items()}


def measure(model: str, batch: int) -> dict:
    """One model's rows: meta bf16 against meta f32, meta f32 on bf16-rounded weights against
    meta f32, and (with PyTorch) autocast against float32, plain and with float32's kinks."""
    x, y = harness_batch(model, batch)
    feeds = {"input": x, "labels": y}
    row: dict = {"batch": len(x)}
    graph, loss_of, params = model_pair(model)
    g32 = meta_gradients(graph, feeds, "f32")
    row["meta"] = compare(meta_gradients(graph, feeds, "bf16"), g32)
    for w in graph.parameters.values():  # last use of the graph: its weights rounded
        w[...] = to_bf16(w)
    row["rounded_weights"] = compare(meta_gradients(graph, feeds, "f32"), g32)
    if torch is not None:
        kinks = Kinks()
        with kinks.recording():
            t32 = torch_gradients(loss_of, params, x, y, False)
        row["pytorch"] = compare(torch_gradients(loss_of, params, x, y, True), t32)
        row["kinks"] = len(kinks.saved)
        if kinks.saved:
            with kinks.replaying():
                row["pytorch_kinks"] = compare(torch_gradients(loss_of, params, x, y, True),
                                               t32)
    return row


def print_row(model: str, row: dict) -> None:
    def cell(r: dict | None) -> str:
        return "-" if r is None else f"{r['global']:.2e}"

    def worst(r: dict | None) -> str:
        return "-" if r is None else f"{r['worst']} {r['worst_relative']:.2e}"
    print(f"{model:13s} {row['batch']:5d}  {cell(row['meta']):>9s} {cell(row.get('pytorch')):>9s}"
          f" {cell(row.get('pytorch_kinks')):>13s} {cell(row['rounded_weights']):>13s}   "
          f"{worst(row['meta'])}  |  {worst(row.get('pytorch'))}", flush=True)


HEADER = (f"{'model':13s} {'batch':>5s}  {'meta':>9s} {'autocast':>9s} {'autocast,':>13s} "
          f"{'meta f32 on':>13s}   worst parameter: meta | autocast\n"
          f"{'':13s} {'':5s}  {'bf16':>9s} {'':>9s} {'f32 kinks':>13s} {'bf16 weights':>13s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(train_step.MODELS),
                        help="comma-separated: " + ", ".join(train_step.MODELS))
    parser.add_argument("--batch", type=int, default=0, help="examples per batch (0: the "
                        "harness's batch of each model)")
    parser.add_argument("--threads", type=int, default=1, help="meta's and PyTorch's threads "
                        "(the sums' order; the figures barely move with it)")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = set(models) - set(train_step.MODELS)
    if unknown:
        print(f"bf16_gradients.py: unknown model(s) {sorted(unknown)}; choose from "
              f"{', '.join(train_step.MODELS)}", file=sys.stderr)
        sys.exit(2)
    if args.batch < 0 or args.threads < 1:
        print("bf16_gradients.py: --batch must be >= 0 and --threads >= 1", file=sys.stderr)
        sys.exit(2)
    set_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    from meta.lv1.plan.precision import native_bf16
    native, why = native_bf16()
    if not native:
        print(f"bf16_gradients.py: bf16 is not native here ({why}): meta's precision=bf16 "
              "runs float32, nothing to measure", file=sys.stderr)
        sys.exit(2)
    env = environment()
    print_environment(env)
    print(f"{args.threads} thread(s), meta and PyTorch")
    print(f"relative norm ||g_bf16 - g_f32|| / ||g_f32||, all parameters together (issue 42's "
          f"bound {BOUND:g}); worst: the parameter furthest off")
    print(HEADER)
    rows = {}
    for model in models:
        rows[model] = measure(model, args.batch or train_step.MODELS[model][1])
        rows[model]["load_average"] = os.getloadavg()[0]
        print_row(model, rows[model])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "bound": BOUND, "models": rows},
                      f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
