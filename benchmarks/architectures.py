"""Six architectures users bring, at CPU-sized settings: meta's planned executor against PyTorch
(training) and onnxruntime (inference), at 1 thread, ratios from one run (issue 41).

The models are ``tests/fixtures/pytorch/make_architecture_fixtures.py``'s classes (a GPT-2,
a Llama with a tied and with an untied head, a T5 encoder, a ViT, a ConvNeXt, a MobileNetV3:
plain PyTorch) at its ``BENCH`` sizes: small enough for a 2-core machine, large enough that a
step is matrix products, not overhead (the table prints each model's sizes and parameters).
Each is exported the way a user does, ``torch.onnx.export(model, args)`` with nothing else
(static batch: one export per batch, in a temporary folder). MobileNetV3's default export
folds BatchNorm into the convolutions even from train mode, which cannot train as PyTorch
does, and meta refuses such a file in one line: then the training file is the remedy that
line names, dynamo's export without the optimizer (said in the output and the JSON). The
inference file is the default export of the eval-mode model, loaded with ``as_exported=True``
(folded BatchNorm is what an inference file holds).

Per model, at 1 thread (meta's and PyTorch's):

- training step (forward, backward, SGD with momentum) on one batch: meta planned against
  PyTorch eager and ``torch.compile`` of the same module and loss, the variants' timed blocks
  interleaved (``harness.interleaved_blocks``), ratios of medians (> 1: meta faster) and, in
  brackets, the median of paired ratios; the first losses agree (same weights); besides wall
  time, the CPU time the process spent in the same blocks (``timed_blocks``), whose ratios a
  loaded machine moves far less;
- Python's share of a meta training step (``meta.lv1.plan.profile_share.measure``: each
  step's time in the plan, the nodes placed as Python steps) and those nodes;
- where meta's step goes, from the same measurement: the fused attention nodes' share, then
  the largest op types' (``step_split``; at these sizes the projections' MatMuls, not the
  attention, are most of a step: ``benchmarks/attention_products.py`` times the attention),
  and ``eager_bound``: eager's step over meta's time in MatMul, Gemm and Conv nodes (kernels
  eager runs too; step x their share), the ratio meta would reach if all else cost nothing;
- inference at batch 1 and 32 (eval mode): meta planned against onnxruntime (graph
  optimisations on, 1 intra-op thread), time of onnxruntime / meta (> 1: meta faster) with a
  95 % bootstrap interval, and the largest output difference.

Acceptance (issue 41): Python <= 2 % of a step; training >= 1.5x eager and >= 1.2x
torch.compile; inference >= 1.0x onnxruntime at batch 1 and 32.

    python benchmarks/architectures.py                                  # all, about 15 min
    python benchmarks/architectures.py --models gpt2,vit --repeats 3
    python benchmarks/architectures.py --json docs/results/architectures.json
    python benchmarks/architectures.py --inference-only --models mobilenetv3 --batches 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from harness import OtherLoad, environment, interleaved_blocks, print_environment, torch
from inference import session
from train_step import LR, MOMENTUM, paired_ratio

from meta import lv2
from meta.bench.stats import ratio_of_medians
from meta.common.files import write_text
from meta.common.threads import set_threads
from meta.lv1 import PlannedExecutor
from meta.lv1.onnx_io import ONNXLoadError
from meta.lv1.onnx_model import onnx_model
from meta.lv1.plan import profile_share

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pytorch"
PAUSE_S = 0.2
INFERENCE_BATCHES = (1, 32)


def fixtures_module():
    """``make_architecture_fixtures`` (the model classes and sizes), which needs torch."""
    sys.path.insert(0, str(FIXTURES))
    import make_architecture_fixtures
    return make_architecture_fixtures


def save(proto: onnx.ModelProto, folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    onnx.save(proto, str(path))
    return path


def load(path: Path, as_exported: bool = False):
    """The file as the ``onnx`` model component loads a user's file (plus a loss)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx_model((), 0, 0, np.float32, str(path), as_exported=as_exported)


def timed_blocks(fns: dict, calls: int, repeats: int) -> tuple[dict, dict]:
    """``harness.interleaved_blocks``'s wall seconds per call of each block, and the CPU
    seconds this process spent per call in the same blocks (every variant runs at 1 thread
    on the calling thread: meta's plan, onnxruntime with 1 intra-op thread, PyTorch eager and
    compiled). On a loaded 2-core machine a block's wall time is mostly how often other
    processes took the core; its CPU time is what the calls cost, so ratios of CPU times
    move far less from run to run (both are reported; the bounds are judged on wall time)."""
    spent: dict[str, list[float]] = {k: [] for k in fns}

    def timed(name, fn):
        def call():
            start = time.process_time()
            out = fn()
            spent[name].append(time.process_time() - start)
            return out
        return call
    wall = interleaved_blocks({k: timed(k, f) for k, f in fns.items()}, calls, repeats, PAUSE_S)
    # each block is one untimed call, then ``calls`` timed ones
    cpu = {k: [sum(v[b * (calls + 1) + 1:(b + 1) * (calls + 1)]) / calls
               for b in range(repeats)] for k, v in spent.items()}
    return wall, cpu


def trainable_export(fx, model, args: tuple, folder: Path, name: str):
    """The default export, or where meta refuses it as unable to train as PyTorch does (folded
    BatchNorm, a gathered table), the remedy that refusal names: dynamo without the optimizer.
    Returns (proto, graph, which export)."""
    proto = fx.export(model, args)
    try:
        return proto, load(save(proto, folder, f"{name}_train")), "default"
    except ONNXLoadError as err:
        if "cannot train as its source did" not in str(err):
            raise
        print(f"{name}: {str(err).split(': ', 1)[1][:160]}...: trained from the export "
              "without the optimizer", flush=True)
    proto = fx.export(model, args, optimize=False)
    return proto, load(save(proto, folder, f"{name}_train")), "dynamo optimize=False"


def training(fx, name: str, folder: Path, args) -> dict:
    """Training step: meta planned, PyTorch eager, torch.compile; Python's share of meta's."""
    build, spec, classes, batch = fx.BENCH[name]
    torch.manual_seed(0)
    model = build().train()
    x, y = fx.example(spec, classes, batch, name in fx.LANGUAGE, np.random.default_rng(0))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    proto, graph, how = trainable_export(fx, model, (xt,), folder, name)
    feeds = {proto.graph.input[0].name: x, "labels": y}
    executor = PlannedExecutor(graph).train()
    executor.python_watch.done = True  # measured below, not said on stderr
    optimizer = lv2.Optimizer(lv2.sgd(LR, MOMENTUM), graph.parameters)

    def meta_step() -> float:
        values, grads = executor.inference_and_backprop(feeds, loss="loss")
        optimizer.step(grads)
        return float(values["loss"])

    def torch_step(compiled: bool):
        net = copy.deepcopy(model)
        opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)

        def loss_of(a, b):
            return torch.nn.functional.cross_entropy(net(a), b)
        # dynamic=False: the same function compiled for the next model made dynamo mark
        # the batch dynamic, where inductor failed on ConvNeXt (32*(s41//4) < 32)
        loss_fn = torch.compile(loss_of, dynamic=False) if compiled else loss_of

        def step() -> float:
            opt.zero_grad()
            loss = loss_fn(xt, yt)
            loss.backward()
            opt.step()
            return loss.item()
        return step

    steps = {"meta planned": meta_step, "pytorch": torch_step(False)}
    if not args.no_compile:
        torch._dynamo.reset()  # each model compiled afresh, none seeing the last one's
        steps["torch.compile"] = torch_step(True)  # compiles on its first call
    first, failed = {}, {}
    for k, step in list(steps.items()):
        try:
            first[k] = step()
        except Exception as err:  # torch.compile's own failure: said, and left out
            if k != "torch.compile":
                raise
            failed[k] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            print(f"{name}: {k} failed, left out: {failed[k]}", flush=True)
            del steps[k]
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    with OtherLoad() as load_:
        blocks, cpu = timed_blocks(steps, args.steps, args.repeats)
    share = profile_share.measure(executor, feeds, "loss", steps=3)
    placement = executor.placement()
    ops = {n.name: n.op_type for n in graph.nodes}
    python = sorted(f"{ops.get(n, '?')} {n} ({w})" for n, w in placement.items()
                    if profile_share.python_placement(w))
    rates = {k: [1 / t for t in v] for k, v in blocks.items()}
    out = {"batch": batch, "parameters": sum(p.numel() for p in model.parameters()),
           "export": how,
           "first_loss": first, "failed": failed, "ms_per_step": {k: statistics.median(v) * 1e3
                                               for k, v in blocks.items()},
           "seconds": blocks, "cpu_ms_per_step": {k: statistics.median(v) * 1e3
                                                  for k, v in cpu.items()},
           "cpu_seconds": cpu, "python_share": share.python_share, "python_nodes": python,
           "python_top": [(t.node, t.op_type, share.share(t)) for t in share.top_python(5)],
           "step_split": step_split(share, placement, ops),
           "other_processes_cores": load_.cores, "load_average": os.getloadavg()[0],
           "vs": {}}
    # what eager / meta would be if everything in meta's step but the products and
    # convolutions (kernels eager runs too; the fused attention not counted) cost nothing
    products = out["ms_per_step"]["meta planned"] * products_share(share, placement, ops)
    out["eager_bound"] = out["ms_per_step"]["pytorch"] / products if products else None
    for base in ("pytorch", "torch.compile"):
        if base in rates:
            out["vs"][base] = {"ratio": statistics.median(rates["meta planned"])
                               / statistics.median(rates[base]),
                               "paired": paired_ratio(rates["meta planned"], rates[base]),
                               "cpu_ratio": statistics.median(cpu[base])
                               / statistics.median(cpu["meta planned"])}
    return out


PRODUCTS = ("MatMul", "Gemm", "Conv")  # op types whose kernels eager runs as well


def fused_attention(placement: dict[str, str], ops: dict[str, str]) -> set[str]:
    """The fused attention nodes: the MatMuls a Softmax was fused into."""
    return {w.removeprefix("fused into ") for n, w in placement.items()
            if ops.get(n) == "Softmax" and w.startswith("fused into ")}


def products_share(share, placement: dict[str, str], ops: dict[str, str]) -> float:
    """The share of meta's step in PRODUCTS nodes, the fused attention left out."""
    attention = fused_attention(placement, ops)
    return sum(share.share(t) for t in share.nodes
               if t.op_type in PRODUCTS and t.node not in attention)


def step_split(share, placement: dict[str, str], ops: dict[str, str]) -> dict[str, float]:
    """Where meta's training step goes (``share``: each node's time in the plan): the fused
    attention nodes (a MatMul that absorbed a Softmax), then by op type, largest first, the
    rest as 'other' after the first four; shares of the step."""
    attention = fused_attention(placement, ops)
    split: dict[str, float] = {}
    for t in share.nodes:
        key = "attention (fused)" if t.node in attention else t.op_type
        split[key] = split.get(key, 0.0) + share.share(t)
    ranked = sorted(split.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:4])
    if len(ranked) > 4:
        out["other"] = sum(v for _, v in ranked[4:])
    return out


def ort_over_meta(seconds: dict[str, list[float]]):
    """median(onnxruntime's s/call) / median(meta's), with its bootstrap interval
    (``ratio_of_medians(a, b)`` is median(b) / median(a))."""
    return ratio_of_medians(seconds["meta planned"], seconds["onnxruntime"], seed=0)


def inference(fx, name: str, folder: Path, batch: int, args) -> dict:
    """Eval-mode inference at ``batch``: meta planned against onnxruntime, one file."""
    build, spec, classes, _ = fx.BENCH[name]
    torch.manual_seed(0)
    model = build().eval()
    x, _ = fx.example(spec, classes, batch, False, np.random.default_rng(1))
    proto = fx.export(model, (torch.from_numpy(x),))
    path = save(proto, folder, f"{name}_infer_{batch}")
    graph = load(path, as_exported=True)  # inference: a folded BatchNorm is what it runs
    input_name, output = proto.graph.input[0].name, proto.graph.output[0].name
    executor = PlannedExecutor(graph).eval()
    ort = session(path, 1, optimise=True)
    calls = {"meta planned": lambda: executor.inference({input_name: x}, [output]),
             "onnxruntime": lambda: ort.run([output], {input_name: x})}
    diff = float(np.max(np.abs(calls["meta planned"]()[output] - calls["onnxruntime"]()[0])))
    for fn in calls.values():
        for _ in range(args.warmup):
            fn()
    n = max(1, args.calls // batch)
    with OtherLoad() as load_:
        seconds, cpu = timed_blocks(calls, n, args.repeats)
    r, rc = ort_over_meta(seconds), ort_over_meta(cpu)
    placement = executor.placement()
    ops = {n.name: n.op_type for n in graph.nodes}
    return {"batch": batch, "ms_per_call": {k: statistics.median(v) * 1e3
                                            for k, v in seconds.items()},
            "seconds": seconds, "ort_over_meta": {"ratio": r.ratio, "low": r.ci_low,
                                                  "high": r.ci_high},
            "cpu_ms_per_call": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
            "cpu_seconds": cpu, "ort_over_meta_cpu": {"ratio": rc.ratio, "low": rc.ci_low,
                                                      "high": rc.ci_high},
            "max_abs_difference": diff,
            "python_nodes": sorted(f"{ops.get(k, '?')} {k} ({w})" for k, w in placement.items()
                                   if profile_share.python_placement(w)),
            "other_processes_cores": load_.cores, "load_average": os.getloadavg()[0]}


def verdict(value: float, bound: float) -> str:
    return "ok" if value >= bound else "BELOW"


def table(results: dict) -> None:
    print(f"\n{'model':<13} {'params':>8} {'batch':>5} {'meta ms':>8} {'eager':>7} "
          f"{'compile':>8} {'/eager':>13} {'/compile':>13} {'Python':>7} "
          f"{'ORT/meta b1':>12} {'ORT/meta b32':>13}")
    for name, r in results.items():
        t = r["train"]
        ms = t["ms_per_step"]
        vs = t["vs"]
        eager = vs.get("pytorch", {})
        comp = vs.get("torch.compile", {})
        inf = {i["batch"]: i["ort_over_meta"]["ratio"] for i in r["inference"]}
        print(f"{name:<13} {t['parameters'] / 1e6:>7.2f}M {t['batch']:>5} "
              f"{ms['meta planned']:>8.1f} {ms['pytorch']:>7.1f} "
              f"{ms.get('torch.compile', float('nan')):>8.1f} "
              f"{eager.get('ratio', float('nan')):>5.2f} [{eager.get('paired', float('nan')):.2f}]"
              f" {comp.get('ratio', float('nan')):>5.2f} [{comp.get('paired', float('nan')):.2f}]"
              f" {t['python_share']:>6.1%} "
              f"{inf.get(1, float('nan')):>12.2f} {inf.get(32, float('nan')):>13.2f}")
    print("\nagainst issue 41's bounds (training >= 1.5x eager, >= 1.2x torch.compile; "
          "Python <= 2 %; inference ORT/meta >= 1.0 at batch 1 and 32), judged on wall time; "
          "in brackets the same ratio of CPU times:")
    for name, r in results.items():
        t = r["train"]
        vs = t["vs"]
        parts = [f"eager {verdict(vs['pytorch']['ratio'], 1.5)} (cpu "
                 f"{vs['pytorch']['cpu_ratio']:.2f})"]
        if "torch.compile" in vs:
            parts.append(f"compile {verdict(vs['torch.compile']['ratio'], 1.2)} (cpu "
                         f"{vs['torch.compile']['cpu_ratio']:.2f})")
        parts.append(f"Python {'ok' if t['python_share'] <= 0.02 else 'ABOVE'}")
        parts += [f"ORT b{i['batch']} {verdict(i['ort_over_meta']['ratio'], 1.0)} (cpu "
                  f"{i['ort_over_meta_cpu']['ratio']:.2f})" for i in r["inference"]]
        off = sorted({*t["python_nodes"], *(n for i in r["inference"] for n in i["python_nodes"])})
        print(f"  {name:<13} {', '.join(parts)}" + (f"; Python steps: {off}" if off else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed block")
    parser.add_argument("--calls", type=int, default=32, help="inference images or sequences "
                        "per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--inference-only", action="store_true",
                        help="time inference only (no training step, no torch.compile)")
    parser.add_argument("--batches", default=",".join(map(str, INFERENCE_BATCHES)),
                        help="comma-separated inference batch sizes (default: 1,32)")
    args = parser.parse_args()
    if torch is None:
        print("benchmarks/architectures.py needs torch (pip install torch==2.13.0 onnxscript)",
              file=sys.stderr)
        return 2
    fx = fixtures_module()
    names = args.models.split(",") if args.models else list(fx.BENCH)
    unknown = sorted(set(names) - set(fx.BENCH))
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {sorted(fx.BENCH)}", file=sys.stderr)
        return 2
    set_threads(1)
    torch.set_num_threads(1)
    env = environment()
    print_environment(env)
    print(f"1 thread; SGD lr {LR} momentum {MOMENTUM}; {args.warmup} warm-up steps, "
          f"{args.repeats} blocks of {args.steps} training steps per variant")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        print(f"--batches {args.batches!r}: comma-separated integers", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp())
    results = {}
    for name in names:
        start = time.perf_counter()
        train = None if args.inference_only else training(fx, name, folder, args)
        infer = [inference(fx, name, folder, b, args) for b in batches]
        if train is None:
            results[name] = {"inference": infer}
            print(f"{name}: " + "; ".join(
                f"batch {i['batch']} ORT/meta {i['ort_over_meta']['ratio']:.2f} "
                f"[{i['ort_over_meta']['low']:.2f}, {i['ort_over_meta']['high']:.2f}] (cpu "
                f"{i['ort_over_meta_cpu']['ratio']:.2f}), meta "
                f"{i['ms_per_call']['meta planned']:.3f} ms, ORT "
                f"{i['ms_per_call']['onnxruntime']:.3f} ms, max |meta - ORT| "
                f"{i['max_abs_difference']:.2g}, load {i['load_average']:.2f}, other "
                f"processes {i['other_processes_cores']:.2f} cores" for i in infer), flush=True)
        else:
            results[name] = {"train": train, "inference": infer}
            first = ", ".join(f"{k} {v:.5f}" for k, v in train["first_loss"].items())
            print(f"{name}: {train['parameters'] / 1e6:.2f} M parameters, batch "
                  f"{train['batch']}, export {train['export']}; first loss {first}; Python "
                  f"{train['python_share']:.1%};"
                  f" inference max |meta - ORT| "
                  f"{max(i['max_abs_difference'] for i in infer):.2g}; meta's step: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in train["step_split"].items())
                  + (f" (eager / meta at most {train['eager_bound']:.2f} were all but products "
                     "and convolutions free)"
                     if train["eager_bound"] else "")
                  + "; load average "
                  f"{os.getloadavg()[0]:.2f}, other processes "
                  f"{train['other_processes_cores']:.2f} cores; "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
        if args.json:  # after each model: a long run cut short keeps what it measured
            write_text(args.json, json.dumps({"environment": env, "args": {
                k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "inputs": {n: repr(fx.BENCH[n][1]) for n in results},
                "load_average_end": os.getloadavg(), "results": results}, indent=1) + "\n")
    if not args.inference_only:
        table(results)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
