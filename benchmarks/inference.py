"""Inference of ONNX's model-zoo networks: meta's planned executor against onnxruntime, ratios
from one run.

The networks are the "light" models the ``onnx`` wheel ships (squeezenet, resnet50,
densenet121, vgg19, shufflenet, inception_v1: the real architectures, opset 9, their weights
made by ConstantOfShape nodes), the recurrent classifiers of ``torch_models.py`` (``lstm``,
``bilstm``, ``gru``: exported by PyTorch's TorchScript exporter in eval mode; needs torch), and
the sequence models of ``torch_models`` (needs torch): ``gpt`` (meta's GPT builder, batch 16 x
128 tokens, saved with ``lv1.save_onnx``), ``bert`` (the BERT-style encoder exported from
PyTorch, batch 32 x 64 tokens) and ``lstm_lm`` (meta's LSTM language model, batch 32 x 64
tokens); their ``--batches`` is their own batch. Each zoo model is materialised once into an
ordinary model: every such weight becomes an initializer with random values of a realistic
scale (He-normal for convolution and matrix weights; BatchNorm with unit scale and variance,
zero mean and shift; small random biases), and initializers are no longer listed as graph
inputs (onnxruntime will not fold or pre-pack an input it may be fed). The same file goes to
both frameworks.

Variants at each thread count and batch: ``meta planned`` (``PlannedExecutor`` in eval mode:
the plan compiled on the first call and reused), ``onnxruntime`` with its graph optimisations
on (ORT_ENABLE_ALL) and off (ORT_DISABLE_ALL), intra-op threads set to the thread count.
The variants' timed blocks alternate (``harness.interleaved_blocks``); a ratio is
``median(meta s/call) / median(onnxruntime s/call)`` with a 95 % bootstrap interval, so below
1 meta is faster. The outputs are compared (max abs difference printed). Each line also
gives the call's floating-point work (``harness.graph_flops``: MatMul, Gemm, Conv and
recurrent gate products),
the GFLOP/s meta achieved and its fraction of this machine's float32 matrix-product peak,
measured in the same run at that thread count (``harness.gemm_peak``).

``--precision f32,bf16`` adds ``meta planned bf16`` (``PlannedExecutor(precision="bf16")``:
matrix products and convolutions read bf16 and accumulate float32; issue 42) beside the
float32 variants, in the same interleaved blocks: its time over meta float32's and over
onnxruntime's (which computes float32), its largest difference from onnxruntime's outputs
(float32 where onnxruntime is not installed), and its GFLOP/s as a fraction of this machine's
bf16 matrix-product peak (``harness.bf16_gemm_peak``, PyTorch's bf16 ``mm``). Where bf16 is
not native, the executor says so in one line and runs float32. ``--precision bf16`` alone
leaves meta's float32 variant out.

    python benchmarks/inference.py                                 # batch 1, 1 thread
    python benchmarks/inference.py --models resnet50 --batches 1,32 --threads 1,2 --json out.json
    python benchmarks/inference.py --models gpt,bert,lstm_lm --threads 1,2
    python benchmarks/inference.py --models resnet50,gpt,bert --precision f32,bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
from harness import (OtherLoad, bf16_gemm_peak, environment, gemm_peak, graph_flops,
                     interleaved_blocks, print_environment)
from onnx import numpy_helper

from meta import lv1
from meta.common.threads import set_threads
from meta.bench.stats import ratio_of_medians
from meta.common.files import write_text

try:
    import onnxruntime
except ImportError:  # a measuring stick, never a code path of meta
    onnxruntime = None

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RECURRENT = ("lstm", "bilstm", "gru")
MODELS = ("squeezenet", "resnet50", "densenet121", "vgg19", "shufflenet", "inception_v1",
          *RECURRENT)
SEQUENCE = ("gpt", "bert", "lstm_lm")  # token-id models of torch_models
META = {"f32": "meta planned", "bf16": "meta planned bf16"}  # variant of each precision


def sequence_model(name: str, folder: Path) -> tuple[Path, str, np.ndarray]:
    """A token-id model saved as ONNX in ``folder``: the path, its input's name and a batch of
    token ids (the model's own batch size)."""
    import torch_models

    path = folder / f"{name}.onnx"
    rng = np.random.default_rng(1)
    if name in torch_models.LANGUAGE_MODELS:
        builder, batch, _ = torch_models.LANGUAGE_MODELS[name]
        graph = builder()
        lv1.save_onnx(graph, path, outputs=["logits"])
        weights = graph.initializers
        vocab = (weights["wte"] if "wte" in weights else weights["embedding"]).shape[0]
        ids = rng.integers(0, vocab, (batch, graph.inputs[0].shape[1]))
    else:
        path.write_bytes(torch_models.export_bytes(torch_models.module(name),
                                                   torch_models.example(name)))
        ids = rng.integers(0, torch_models.TOKEN_INPUTS[name], torch_models.example(name).shape)
    return path, "input", ids


PAUSE_S = 0.2


def materialise(name: str, folder: Path) -> tuple[Path, str, tuple[int, ...]]:
    """The light model ``name`` with real initializers, saved in ``folder``; returns the path,
    the data input's name and its shape."""
    path = folder / f"{name}.onnx"
    if name in RECURRENT:
        return exported_recurrent(name, path)
    model = onnx.load(LIGHT / f"light_{name}.onnx")
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, x in enumerate(node.input):
            readers.setdefault(x, []).append((node, i))
    rng = np.random.default_rng(0)
    made, keep = {}, []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            keep.append(node)
            continue
        shape = tuple(int(d) for d in inits[node.input[0]])
        out = node.output[0]
        users = readers.get(out, [])
        if len(shape) >= 2:  # convolution or matrix weights
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[-1]
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif any(n.op_type == "BatchNormalization" and i in (1, 4) for n, i in users):
            value = np.ones(shape)  # scale, variance
        elif any(n.op_type == "BatchNormalization" for n, _ in users):
            value = np.zeros(shape)  # shift, mean
        elif any(n.op_type == "Mul" for n, _ in users):
            value = np.ones(shape)  # densenet's scale after its BatchNorm
        else:
            value = rng.standard_normal(shape) * 0.01
        made[out] = value.astype(np.float32)
    del graph.node[:]
    graph.node.extend(keep)
    shapes = {n for n in inits if n.endswith("__SHAPE")}
    used = {x for n in graph.node for x in n.input}
    tensors = [t for t in graph.initializer if t.name not in shapes and t.name in used]
    tensors += [numpy_helper.from_array(v, k) for k, v in made.items()]
    del graph.initializer[:]
    graph.initializer.extend(tensors)
    names = {t.name for t in tensors}
    data = [i for i in graph.input if i.name not in names and i.name in used]
    del graph.input[:]
    graph.input.extend(data)
    # any batch: the data input's first dimension symbolic, Reshapes to (1, ...) as (0, ...)
    graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    for out in graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "N"
    reshapes = {n.input[1] for n in graph.node if n.op_type == "Reshape" and len(n.input) > 1}
    for i, t in enumerate(graph.initializer):
        value = numpy_helper.to_array(t)
        if t.name in reshapes and value.ndim == 1 and value.size and value[0] == 1:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(
                np.concatenate([[0], value[1:]]).astype(value.dtype), t.name))
    model.ir_version = max(model.ir_version, 4)  # initializers need not be inputs from IR 4
    onnx.save(model, path)
    dims = tuple(d.dim_value or 1 for d in graph.input[0].type.tensor_type.shape.dim)
    return path, graph.input[0].name, dims


def exported_recurrent(name: str, path: Path) -> tuple[Path, str, tuple[int, ...]]:
    """A recurrent classifier of ``torch_models`` exported for inference (weights folded into
    initializers, as a deployed model has them)."""
    import torch
    import torch_models

    _, shape, _ = torch_models.TORCH_MODELS[name]
    net = torch_models.module(name).eval()
    torch.onnx.export(net, (torch.zeros(1, *shape),), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    return path, "input", (1, *shape)


def session(path: Path, threads: int, optimise: bool):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = (onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
                                        if optimise else
                                        onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(name: str, folder: Path, batch: int, threads: int, args, peak: float,
            bf16_peak: float = 0.0) -> dict:
    if name in SEQUENCE:
        path, input_name, x = sequence_model(name, folder)
        batch = len(x)
    else:
        path, input_name, dims = materialise(name, folder)
        x = np.random.default_rng(1).standard_normal((batch, *dims[1:])).astype(np.float32)
    graph = lv1.from_onnx(path)
    output = graph.outputs[0].name
    flops = graph_flops(graph, {input_name: x}, training=False)
    precisions = args.precision.split(",")
    executors = {META[p]: lv1.PlannedExecutor(graph, precision=p).eval() for p in precisions}
    calls = {label: (lambda ex=ex: ex.inference({input_name: x}, [output]))
             for label, ex in executors.items()}
    first = next(iter(executors))  # meta float32 where it runs, else bf16
    outs = {label: call()[output] for label, call in calls.items()}
    ours = outs[first]
    diffs = {}
    if onnxruntime is not None:
        for label, optimise in (("onnxruntime", True), ("onnxruntime no-opt", False)):
            s = session(path, threads, optimise)
            calls[label] = lambda s=s: s.run([output], {input_name: x})
            diffs[label] = float(np.max(np.abs(calls[label]()[0] - ours)))
        reference = calls["onnxruntime"]()[0]
    else:
        reference = outs.get(META["f32"])
    for fn in calls.values():
        for _ in range(args.warmup):
            fn()
    n = max(1, args.calls // batch)
    with OtherLoad() as load:
        seconds = interleaved_blocks(calls, n, args.repeats, PAUSE_S)
    result = {"model": name, "batch": batch, "threads": threads,
              "ms_per_call": {k: statistics.median(v) * 1e3 for k, v in seconds.items()},
              "seconds": seconds, "max_abs_difference": diffs,
              "other_processes_cores": load.cores, "load": load.describe(),
              "placement": sorted({where for where in executors[first].placement().values()}),
              "flops": flops, "gflops": flops / statistics.median(seconds[first]) / 1e9,
              "meta_vs": {}, "load_average": os.getloadavg()[0]}
    result["peak_fraction"] = result["gflops"] / peak
    for label in diffs:
        r = ratio_of_medians(seconds[label], seconds[first], seed=0)
        result["meta_vs"][label] = {"ratio": r.ratio, "low": r.ci_low, "high": r.ci_high}
    if META["bf16"] in executors:
        result["bf16"] = bf16_result(executors[META["bf16"]], seconds, flops, bf16_peak,
                                     outs[META["bf16"]], reference, list(diffs))
    return result


def bf16_result(executor, seconds: dict, flops: int, bf16_peak: float, out: np.ndarray,
                reference: np.ndarray | None, others: list[str]) -> dict:
    """meta bf16's time over meta float32's and onnxruntime's (a ratio of medians, below 1
    bf16 is faster), its largest difference from the float32 reference, its placement, rate
    and fraction of the bf16 GEMM peak."""
    bf16 = META["bf16"]
    vs = {}
    for label in [META["f32"], *others]:
        if label in seconds:
            r = ratio_of_medians(seconds[label], seconds[bf16], seed=0)
            vs[label] = {"ratio": r.ratio, "low": r.ci_low, "high": r.ci_high}
    gflops = flops / statistics.median(seconds[bf16]) / 1e9
    return {"vs": vs, "runs_as": executor.plan_precision,
            "max_abs_difference": None if reference is None else
            float(np.max(np.abs(out - reference))),
            "placement": sorted({where for where in executor.placement().values()}),
            "gflops": gflops, "bf16_peak_gflops": bf16_peak,
            "bf16_peak_fraction": gflops / bf16_peak if bf16_peak else None}


def bf16_line(r: dict) -> str:
    """The bf16 variant's line below a model's line."""
    b = r["bf16"]
    vs = ", ".join(f"bf16/{'meta f32' if k == META['f32'] else k} "
                   f"{v['ratio']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"
                   for k, v in b["vs"].items())
    diff = "" if b["max_abs_difference"] is None else \
        f"; max |bf16 - {'onnxruntime' if r['max_abs_difference'] else 'meta f32'}| " \
        f"{b['max_abs_difference']:.2g}"
    peak = f", {b['bf16_peak_fraction']:.1%} of the bf16 GEMM peak" \
        if b["bf16_peak_fraction"] is not None else ""
    runs = "" if b["runs_as"] == "bf16" else " (runs float32: bf16 is not native here)"
    return (f"{'':<12} bf16{runs}: {r['ms_per_call'][META['bf16']]:.2f} ms; time {vs}{diff}; "
            f"{b['gflops']:.1f} GFLOP/s{peak}; load average {r['load_average']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="squeezenet,resnet50,densenet121,vgg19")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--calls", type=int, default=10, help="images per timed block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--precision", default="f32", help="comma-separated: f32 (meta's "
                        "float32 plan), bf16 (meta's precision=bf16 plan); see the module")
    args = parser.parse_args()
    bad = set(args.precision.split(",")) - set(META)
    if bad:
        parser.error(f"--precision: unknown {sorted(bad)}; choose from {', '.join(META)}")
    unknown = set(args.models.split(",")) - set(MODELS)
    unknown -= set(SEQUENCE)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from "
                     f"{list(MODELS) + list(SEQUENCE)}")
    env = environment()
    env["onnxruntime"] = onnxruntime.__version__ if onnxruntime else None
    print_environment(env)
    print(f"onnxruntime {env['onnxruntime'] or 'not installed'}")
    folder = Path(tempfile.mkdtemp())
    results = []
    peaks = {}
    for threads in (int(t) for t in args.threads.split(",")):
        peak, source = gemm_peak(threads)
        peaks[threads] = peak
        print(f"float32 GEMM peak at {threads} thread(s): {peak:.1f} GFLOP/s ({source})")
        bf16_peak = 0.0
        if "bf16" in args.precision.split(","):
            bf16_peak, bf16_source = bf16_gemm_peak(threads)
            peaks[f"bf16/{threads}"] = bf16_peak
            print(f"bf16 GEMM peak at {threads} thread(s): {bf16_peak:.1f} GFLOP/s "
                  f"({bf16_source})")
        set_threads(threads)
        for batch in (int(b) for b in args.batches.split(",")):
            for name in args.models.split(","):
                if name in SEQUENCE and batch != int(args.batches.split(",")[0]):
                    continue  # their own batch: once per thread count
                r = measure(name, folder, batch, threads, args, peak, bf16_peak)
                batch_shown = r["batch"]
                results.append(r)
                ms = ", ".join(f"{k} {v:.2f} ms" for k, v in r["ms_per_call"].items())
                vs = ", ".join(f"meta/{k} {v['ratio']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"
                               for k, v in r["meta_vs"].items())
                worst = max(r["max_abs_difference"].values(), default=0)
                print(f"{name:<12} batch {batch_shown:>2}, {threads} thread(s): {ms}; {vs}; "
                      f"max |meta - onnxruntime| {worst:.2g}; meta {r['gflops']:.1f} GFLOP/s, "
                      f"{r['peak_fraction']:.1%} of the GEMM peak ({r['load']})", flush=True)
                if "bf16" in r:
                    print(bf16_line(r), flush=True)
    if args.json:
        write_text(args.json, json.dumps({"environment": env, "args": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": results, "gemm_peak_gflops": peaks}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
