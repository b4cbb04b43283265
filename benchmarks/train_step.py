"""Training-step throughput and peak memory: meta's executors against PyTorch, same network.

Models (``--models``): meta's MLP 784-512-512-10 (batch 128), LeNet-5 (batch 64) and the wide
CNN conv3x3(32), conv3x3(64), maxpool, fc128, fc10 (batch 64) on 28x28 inputs, which PyTorch
runs node by node from meta's graph; and, written in PyTorch (``torch_models.py``: needs
torch), a MobileNetV2 and a ResNet-18 for 32x32 images, a transformer encoder (batch 32) and
a BERT-style encoder over token ids (batch 32 x 64 tokens), which meta runs as PyTorch's
exporter writes them; and the language models meta builds, the GPT (2 layers, width 128, 4
heads, batch 16 x 128 tokens) and the LSTM LM (256 units, batch 32 x 64 tokens), which
PyTorch runs as their twins in ``torch_models`` holding the same weights (nanoGPT's module).
``--seq`` sets every sequence model's length. A step is forward + backward + SGD-momentum
update on one synthetic batch made once, from the same initial weights (the first-step losses
printed agree). Variants: meta's reference executor (numpy; the three small models only),
native executor (C++ kernels per node) and planned executor (the graph compiled into oneDNN
steps), PyTorch eager and ``torch.compile`` of the same module and loss (compiled during the
warm-up: about a minute per model; ``--no-compile`` leaves it out). Each variant runs
warm-up steps, then ``--repeats`` timed blocks of ``--steps`` steps; the variants' blocks
alternate (each after a short pause and one untimed step) so background noise hits them
alike. Thread counts run in the order given (1 first): on a
small machine two-thread timings collapse when anything else runs, so compare only ratios from
one run, and check the "other processes busy" figure.

Beside the ratios each model's step prints its floating-point work (``harness.graph_flops``:
the MatMul, Gemm, Conv and recurrent products of the graph, x3 for forward + backward), the
GFLOP/s each
variant achieved and that rate's fraction of this machine's float32 matrix-product peak,
measured just before that model's blocks at each thread count (``harness.gemm_peak``: on a
shared machine the load, and so the peak, moves within a run).

``--precision f32,bf16`` adds the mixed-precision variants (issue 42): meta's planned executor
with ``precision="bf16"`` (matrix products and convolutions read bf16, accumulate float32),
and PyTorch eager and ``torch.compile`` under ``torch.autocast("cpu", dtype=torch.bfloat16)``;
it prints meta bf16 over meta f32 and over the autocast variants, each model's bf16 GEMM
peak (PyTorch's bf16 ``mm``, measured beside its blocks) and the fraction of it meta's bf16
step reaches, and the load average (the machine may be shared).

``--memory`` measures instead the peak resident memory a training step adds over the process
before its first step (parameters, data and imports already there), each variant in a fresh
process with 1 thread (with ``--precision f32,bf16`` also meta's bf16 plan and PyTorch
under autocast, and bf16's figure over float32's): Linux's peak-RSS counter is reset after the first step, so what that
step leaves (meta's plan and arena, gradients, optimizer state) counts but not its one-time
transients (meta's compile traces a forward on numpy; PyTorch's lazy set-up).

    python benchmarks/train_step.py                          # all models, threads 1,2
    python benchmarks/train_step.py --models lenet5 --steps 20 --repeats 3 --json out.json
    python benchmarks/train_step.py --memory                 # peak memory of every model
    python benchmarks/train_step.py --models gpt,transformer --threads 1 --precision f32,bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

import numpy as np
from harness import (OtherLoad, bf16_gemm_peak, environment, gemm_peak, graph_flops,
                     interleaved_blocks, print_environment, torch)

from meta import lv1, lv2
from meta.common.threads import set_threads

if torch is not None:
    import torch.nn.functional as F

LR, MOMENTUM = 0.01, 0.9
PAUSE_S = 0.3  # before each timed block, see measure()
MODELS = {  # name -> (graph builder, batch size)
    "mlp": (lambda: lv1.mlp(seed=0), 128),
    "lenet5": (lambda: lv1.lenet5(seed=0), 64),
    "wide_cnn": (lambda: lv1.wide_cnn(seed=0), 64),
}
if torch is not None:
    import torch_models

    MODELS.update({name: (None, batch) for name, (_, _, batch) in
                   torch_models.TORCH_MODELS.items()})
    # Language models: meta's builder; PyTorch runs their twin. The LSTM rows: "lstm_lm".
    MODELS.update({name: (builder, batch) for name, (builder, batch, _) in
                   torch_models.LANGUAGE_MODELS.items()})
Step = Callable[[], float]  # one training step; returns the loss


def language_model(model: str) -> bool:
    return model in getattr(globals().get("torch_models"), "LANGUAGE_MODELS", {})


def example_shape(model: str) -> tuple[int, ...]:
    if model in getattr(globals().get("torch_models"), "TORCH_MODELS", {}):
        return torch_models.TORCH_MODELS[model][1]
    if language_model(model):
        return MODELS[model][0]().inputs[0].shape[1:]
    return (1, 28, 28)


def synthetic_batch(batch: int, model: str = "mlp") -> tuple[np.ndarray, np.ndarray]:
    """Random inputs (token ids for the models reading them) and labels: one per example,
    or one next token per position for a language model."""
    rng = np.random.default_rng(0)
    shape = (batch, *example_shape(model))
    if language_model(model):
        weights = MODELS[model][0]().initializers
        size = (weights["wte"] if "wte" in weights else weights["embedding"]).shape[0]
        return rng.integers(0, size, shape), rng.integers(0, size, shape)
    if model in getattr(globals().get("torch_models"), "TOKEN_INPUTS", {}):
        x = rng.integers(0, torch_models.TOKEN_INPUTS[model], shape)
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
    return x, rng.integers(0, 10, batch, dtype=np.int64)


EXPORTS: dict[str, str] = {}  # model written in PyTorch -> its export, made by the parent


def graph_of(model: str) -> lv1.Graph:
    builder = MODELS[model][0]
    if builder is not None:
        return builder()
    if model in EXPORTS:  # a memory child: no exporter's garbage in its heap
        return torch_models.with_loss(EXPORTS[model])
    return torch_models.build(model)[1]


def meta_step(model: str, executor_name: str, x: np.ndarray, y: np.ndarray,
              **executor_options: object) -> Step:
    """One training step of ``model`` on meta's executor ``executor_name`` (its options, e.g.
    ``device`` of ``pytorch``), updated by meta's SGD."""
    graph = graph_of(model)
    executor = lv1.EXECUTORS[executor_name](graph, **executor_options).train()
    optimizer = lv2.Optimizer(lv2.sgd(LR, MOMENTUM), graph.parameters)
    feeds = {"input": x, "labels": y}

    def step() -> float:
        values, grads = executor.inference_and_backprop(feeds, loss="loss")
        optimizer.step(grads)
        return float(values["loss"])
    return step


def torch_forward(graph: lv1.Graph, params: dict, output: str = "loss") -> Callable:
    """PyTorch eager ops running ``graph``'s nodes (the ops these models use), up to
    ``output``."""
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

    nodes = graph.nodes_for([output])

    def forward(x, labels=None):
        values = {**params, "input": x, "labels": labels}
        for node in nodes:
            values[node.outputs[0]] = ops[node.op_type](node, *(values[i] for i in node.inputs))
        return values[output]
    return forward


def torch_step(model: str, x: np.ndarray, y: np.ndarray, compiled: bool = False,
               autocast: bool = False) -> Step:
    """PyTorch's step of ``model`` (eager, or with the module and loss under
    ``torch.compile``), updated by PyTorch's SGD; ``autocast``: the forward under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` (float32 master weights)."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    if MODELS[model][0] is None or language_model(model):  # a module: written in PyTorch,
        if language_model(model):                        # or the twin of meta's graph
            net = torch_models.LANGUAGE_MODELS[model][2](MODELS[model][0]()).train()

            def loss_of(xt, yt):  # (N, T, vocab) scores, one target per token
                return F.cross_entropy(net(xt).flatten(0, 1), yt.flatten())
        else:
            net = torch_models.module(model).train()

            def loss_of(xt, yt):
                return F.cross_entropy(net(xt), yt)
        parameters = list(net.parameters())
    else:
        graph = MODELS[model][0]()  # meta's graph and initial weights
        params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in
                  graph.parameters.items()}
        loss_of = torch_forward(graph, params)
        parameters = list(params.values())
    optimizer = torch.optim.SGD(parameters, lr=LR, momentum=MOMENTUM)
    if compiled:
        loss_of = torch.compile(loss_of)

    def step() -> float:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(xt, yt)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


VARIANTS = ("meta reference", "meta native", "meta planned", "pytorch", "torch.compile")
BF16_VARIANTS = ("meta planned bf16", "pytorch autocast", "torch.compile autocast")


def make_steps(model: str, x: np.ndarray, y: np.ndarray, compiled: bool = True,
               slow: bool = True, precisions: tuple[str, ...] = ("f32",)) -> dict[str, Step]:
    """The variants' steps; ``slow``: also the reference (numpy) and native executors, on the
    small networks (numpy on the large ones takes minutes per block); ``precisions``: "f32"
    (the float32 variants), "bf16" (the mixed-precision ones, ``BF16_VARIANTS``)."""
    steps = {}
    if "f32" in precisions:
        steps.update(float32_steps(model, x, y, compiled, slow))
    if "bf16" in precisions:
        steps["meta planned bf16"] = meta_step(model, "planned", x, y, precision="bf16")
        if torch is not None:
            steps["pytorch autocast"] = torch_step(model, x, y, autocast=True)
            if compiled:
                steps["torch.compile autocast"] = torch_step(model, x, y, compiled=True,
                                                             autocast=True)
    return steps


def float32_steps(model: str, x: np.ndarray, y: np.ndarray, compiled: bool,
                  slow: bool) -> dict[str, Step]:
    steps = {}
    if slow and MODELS[model][0] is not None and not language_model(model):
        steps["meta reference"] = meta_step(model, "reference", x, y)
    if slow:
        steps["meta native"] = meta_step(model, "native", x, y)
    steps["meta planned"] = meta_step(model, "planned", x, y)
    if torch is not None:
        steps["pytorch"] = torch_step(model, x, y)
        if compiled:
            steps["torch.compile"] = torch_step(model, x, y, compiled=True)
    return steps


def model_graph_flops(model: str, x: np.ndarray, y: np.ndarray) -> int:
    """The training step's FLOPs, counted on meta's graph of ``model``."""
    return graph_flops(graph_of(model), {"input": x, "labels": y}, training=True)


def measure(steps: dict[str, Step], batch: int, n_steps: int, repeats: int,
            warmup: int) -> dict[str, list[float]]:
    """Samples/s of each timed block, the variants' blocks interleaved."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    blocks = interleaved_blocks(steps, n_steps, repeats, PAUSE_S)
    return {name: [batch / t for t in times] for name, times in blocks.items()}


def paired_ratio(rates: list[float], base: list[float]) -> float:
    """The median over rounds of a variant's block against the base's block of the same round
    (taken next to each other): a slow spell of the machine (this VM's two vCPUs were at
    times worth one core for seconds: BERT's 2-thread step 50 ms, not 33) moves both blocks
    of a round, so it cancels here where it can move one variant's median and not the other's."""
    return statistics.median(a / b for a, b in zip(rates, base))


def throughput(args: argparse.Namespace) -> dict:
    threads = [int(t) for t in args.threads.split(",")]
    precisions = tuple(args.precision.split(","))
    results, others, first, flops = [], {}, {}, {}
    bf16_peaks: dict[tuple[str, int], tuple[float, str]] = {}
    peaks: dict[tuple[str, int], tuple[float, str]] = {}  # measured beside each model's
    for model in args.models.split(","):
        batch = MODELS[model][1]
        x, y = synthetic_batch(batch, model)
        flops[model] = model_graph_flops(model, x, y)
        set_threads(threads[0])
        if torch is not None:
            torch.set_num_threads(threads[0])
        steps = make_steps(model, x, y, compiled=not args.no_compile, slow=not args.fast,
                           precisions=precisions)
        first[model] = {name: step() for name, step in steps.items()}  # same model: same loss
        print(f"{model}, batch {batch}, {flops[model] / 1e9:.3f} GFLOP per step, first-step "
              "loss: " + ", ".join(f"{n} {v:.5f}" for n, v in first[model].items()), flush=True)
        for n in threads:
            peaks[model, n] = peak = gemm_peak(n)  # sets the threads
            print(f"float32 GEMM peak at {n} thread(s), before {model}'s blocks: "
                  f"{peak[0]:.1f} GFLOP/s ({peak[1]})", flush=True)
            if "bf16" in precisions:
                bf16_peaks[model, n] = bf = bf16_gemm_peak(n)
                print(f"bf16 GEMM peak at {n} thread(s): {bf[0]:.1f} GFLOP/s ({bf[1]}); "
                      f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs",
                      flush=True)
            with OtherLoad() as load:
                rates = measure(steps, batch, args.steps, args.repeats, args.warmup)
            others[f"{model}/{n}"] = load
            results += [{"model": model, "batch": batch, "threads": n, "variant": name,
                         "median": statistics.median(r), "min": min(r), "max": max(r),
                         "samples_per_s": r,
                         "gflops": flops[model] * statistics.median(r) / batch / 1e9,
                         "peak_fraction": flops[model] * statistics.median(r) / batch / 1e9
                         / peak[0]} for name, r in rates.items()]

    print(f"\n{'model':<12} {'threads':>7}  {'variant':<22} {'samples/s':>10} {'min-max':>17} "
          f"{'ms/step':>8} {'GFLOP/s':>8} {'of peak':>7}")
    for r in results:
        print(f"{r['model']:<12} {r['threads']:>7}  {r['variant']:<22} {r['median']:>10.0f} "
              f"{r['min']:>8.0f}-{r['max']:<8.0f} {1e3 * r['batch'] / r['median']:>8.2f} "
              f"{r['gflops']:>8.1f} {r['peak_fraction']:>7.1%}")
    median = {(r["model"], r["threads"], r["variant"]): r["median"] for r in results}
    blocks = {(r["model"], r["threads"], r["variant"]): r["samples_per_s"] for r in results}
    print("\nratios of medians, this run (throughput; > 1 means meta is faster), and in "
          "brackets the median of paired ratios (each round's adjacent blocks):")
    for model in args.models.split(","):
        for n in threads:
            m = {v: median[model, n, v] for v in VARIANTS if (model, n, v) in median}
            bases = [b for b in ("pytorch", "torch.compile") if b in m] or ["meta native"]
            vs = [f"{v.split()[-1]}/{b.split()[-1]} {m[v] / m[b]:.2f} "
                  f"[{paired_ratio(blocks[model, n, v], blocks[model, n, b]):.2f}]"
                  for b in bases for v in VARIANTS if v in m and v.startswith("meta") and v != b]
            if "meta planned" in m:
                planned = m["meta planned"] * flops[model] / MODELS[model][1] / 1e9
                print(f"  {model:<12} {n} thread(s): {', '.join(vs)}; planned {planned:.1f} "
                      f"GFLOP/s, {planned / peaks[model, n][0]:.1%} of the GEMM peak "
                      f"({others[f'{model}/{n}'].describe()})")
            if "bf16" in precisions:
                print_bf16_ratios(model, n, median, blocks, flops[model] / MODELS[model][1],
                                  bf16_peaks[model, n][0])
    return {"first_loss": first, "results": results, "flops_per_step": flops,
            "bf16_gemm_peak_gflops": {f"{m}/{n}": p[0] for (m, n), p in bf16_peaks.items()},
            "load_average": os.getloadavg(),
            "gemm_peak_gflops": {f"{m}/{n}": p[0] for (m, n), p in peaks.items()},
            "gemm_peak_source": {f"{m}/{n}": p[1] for (m, n), p in peaks.items()},
            "other_processes_cores": {k: v.cores for k, v in others.items()}}


def print_bf16_ratios(model: str, n: int, median: dict, blocks: dict, flops_per_sample: float,
                      peak: float) -> None:
    """meta bf16 over meta float32 and over PyTorch's autocast variants (issue 42's
    acceptance: >= 1.6, >= 1.3, >= 1.1), and the fraction of the bf16 GEMM peak."""
    key = (model, n, "meta planned bf16")
    if key not in median:
        return
    parts = []
    for base, label in (("meta planned", "meta f32"), ("pytorch autocast", "eager autocast"),
                        ("torch.compile autocast", "compile autocast"),
                        ("pytorch", "eager f32")):
        if (model, n, base) in median:
            parts.append(f"over {label} {median[key] / median[model, n, base]:.2f} "
                         f"[{paired_ratio(blocks[key], blocks[model, n, base]):.2f}]")
    rate = median[key] * flops_per_sample / 1e9
    fraction = f", {rate / peak:.1%} of the bf16 GEMM peak" if peak else ""
    print(f"  {model:<12} {n} thread(s): meta bf16 {', '.join(parts)}; {rate:.1f} GFLOP/s"
          f"{fraction}; load average now {os.getloadavg()[0]:.2f}")


def memory_child(model: str, variant: str, steps: int) -> None:
    """Runs in a fresh process: prints the peak RSS (bytes) the steps after the first added
    over the process before the first."""
    set_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    x, y = synthetic_batch(MODELS[model][1], model)
    if variant == "pytorch":
        step = torch_step(model, x, y)
    elif variant == "pytorch autocast":
        step = torch_step(model, x, y, autocast=True)
    elif variant == "meta planned bf16":
        step = meta_step(model, "planned", x, y, precision="bf16")
    else:
        step = meta_step(model, variant.split()[1], x, y)
    with open("/proc/self/status") as f:
        before = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) * 1024
    step()  # what lasts (plan arena, gradients, optimizer state) counts: RSS is read before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    for _ in range(steps):
        step()
    with open("/proc/self/status") as f:
        peak = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) * 1024
    print(json.dumps({"before": before, "peak": peak}))


def memory(args: argparse.Namespace) -> dict:
    """Each variant in a fresh process; a network written in PyTorch is exported here, once,
    so that no child's heap holds what the exporter left (a child reusing freed heap for its
    tensors would look smaller than it is)."""
    import tempfile

    results: dict[str, dict] = {}
    folder = tempfile.mkdtemp()
    for model in args.models.split(","):
        onnx_args = []
        if MODELS[model][0] is None:
            path = f"{folder}/{model}.onnx"
            with open(path, "wb") as f:
                f.write(torch_models.export_bytes(torch_models.module(model),
                                                  torch_models.example(model)))
            onnx_args = ["--onnx", path]
        if args.seq:
            onnx_args += ["--seq", str(args.seq)]
        # torch.compile's first step compiles: its peak would be the compiler's
        variants = [v for v in VARIANTS if v != "torch.compile"
                    and (v != "pytorch" or torch is not None)]
        if MODELS[model][0] is None or language_model(model):
            variants.remove("meta reference")
        if "f32" not in args.precision.split(","):
            variants = ["pytorch"] if torch is not None else []
        if "bf16" in args.precision.split(","):  # beside the float32 variants' figures
            variants[-1:-1] = ["meta planned bf16", *(["meta planned"] if "meta planned"
                                                      not in variants else [])]
            if torch is not None:
                variants.append("pytorch autocast")
        results[model] = {}
        for variant in variants:
            out = subprocess.run([sys.executable, __file__, "--memory-child", variant, "--models",
                                  model, "--steps", str(args.memory_steps), *onnx_args],
                                 check=True,
                                 capture_output=True, text=True).stdout
            results[model][variant] = json.loads(out.strip().splitlines()[-1])
        seq = f", sequence {example_shape(model)[0]}" if torch is not None \
            and model in torch_models.SEQUENCE_MODELS \
            else ""
        print(f"\n{model}, batch {MODELS[model][1]}{seq}, {args.memory_steps} steps, 1 thread, "
              "each "
              f"variant in a fresh process:")
        print(f"{'variant':<22} {'RSS before MiB':>15} {'step peak adds MiB':>19}")
        for variant, r in results[model].items():
            mib = (r["peak"] - r["before"]) / 2**20
            print(f"{variant:<22} {r['before'] / 2**20:>15.1f} {mib:>19.1f}")
        def added(variant: str) -> int:
            return results[model][variant]["peak"] - results[model][variant]["before"]
        if torch is not None:
            for variant in variants:
                if not variant.startswith("meta"):
                    continue
                print(f"  {variant}/pytorch peak added by a step: "
                      f"{added(variant) / added('pytorch'):.2f}x")
        if "meta planned bf16" in variants:  # issue 42: <= 0.65x float32's
            ratio = added("meta planned bf16") / added("meta planned")
            results[model]["bf16_over_f32_added"] = ratio
            print(f"  meta planned bf16 / meta planned (float32) peak added by a step: "
                  f"{ratio:.2f}x")
            if torch is not None:
                print(f"  pytorch autocast / pytorch peak added by a step: "
                      f"{added('pytorch autocast') / added('pytorch'):.2f}x")
    return {"memory": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                        + ", ".join(MODELS))
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated, run in this order")
    parser.add_argument("--seq", type=int, default=0, help="sequence length of the sequence "
                        "models (transformer, bert, gpt, lstm_lm); 0: their own")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--fast", action="store_true",
                        help="only meta planned and PyTorch (no reference / native executor)")
    parser.add_argument("--memory", action="store_true", help="peak memory of a step instead")
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--onnx", help=argparse.SUPPRESS)  # a memory child's exported model
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--precision", default="f32", help="comma-separated: f32 (the float32 "
                        "variants), bf16 (meta's precision=bf16, PyTorch's autocast bf16)")
    args = parser.parse_args()
    bad = set(args.precision.split(",")) - {"f32", "bf16"}
    if bad:
        parser.error(f"--precision: unknown {sorted(bad)}; choose from f32, bf16")
    if args.seq and torch is not None:
        torch_models.set_sequence(args.seq)
        MODELS.update({name: (builder, batch) for name, (builder, batch, _) in
                       torch_models.LANGUAGE_MODELS.items()})
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {sorted(MODELS)}")
    if args.onnx:
        EXPORTS[args.models.split(",")[0]] = args.onnx
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
