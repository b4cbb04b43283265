"""What the benchmark scripts share: the environment header, the machine's other load, and
interleaved timed blocks (so background noise hits every variant alike)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import threadpoolctl

from meta.common.threads import cores, set_threads
from meta.lv0 import native

try:
    import torch
except ImportError:
    torch = None


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds this process has used)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    own = os.times()
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own.user + own.system


class OtherLoad:
    """Cores other processes kept busy while the block ran: ``with OtherLoad() as load: ...``,
    then ``load.cores``; above 0.1 the figures are unreliable on a small machine."""

    def __enter__(self) -> OtherLoad:
        self.start, (self.busy, self.own) = time.perf_counter(), busy_seconds()
        return self

    def __exit__(self, *exc) -> None:
        busy, own = busy_seconds()
        self.cores = max(0.0, (busy - self.busy) - (own - self.own)) / (
            time.perf_counter() - self.start)

    def describe(self) -> str:
        return (f"other processes busy: {self.cores:.2f} cores"
                + ("; figures unreliable" if self.cores > 0.1 else ""))


def environment() -> dict:
    blas = [f"{p['internal_api']} {p.get('version')} ({p.get('architecture', '?')}, "
            f"{p.get('threading_layer', '?')})"
            for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    cpu = platform.processor() or "unknown"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    return {"python": platform.python_version(), "numpy": np.__version__,
            "blas": ", ".join(blas) or "unknown", "native_blas": native.blas(),
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")},
            "torch": torch.__version__ if torch else None,
            "cpu": cpu, "cores": cores(), "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg()[0]}


def print_environment(env: dict) -> None:
    print(f"python {env['python']}, numpy {env['numpy']}, BLAS {env['blas']}; native kernels' "
          f"BLAS: {env['native_blas']}")
    if env["openblas_env"]:
        print(f"OpenBLAS variables set: {env['openblas_env']} (they pick OpenBLAS's kernels)")
    print(f"torch {env['torch'] or 'not installed'}; CPU {env['cpu']}, {env['cores']} usable "
          f"cores ({env['cpu_count']} online); load average {env['load_average']:.2f}")
    if torch is None:
        print("PyTorch is not installed, so it is left out; to compare: pip install torch==2.13.0")


def interleaved_blocks(fns: dict[str, Callable[[], object]], calls: int, repeats: int,
                       pause_s: float) -> dict[str, list[float]]:
    """Seconds per call of each timed block of ``calls`` calls, ``repeats`` blocks per variant,
    the variants' blocks taking turns. Each block follows a pause (the previous variant's
    OpenBLAS / OpenMP threads spin for a while after its last call; on 2 cores that took a core
    from the next block) and one untimed call."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(pause_s)
            fn()
            start = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter_ns() - start) / calls / 1e9)
    return samples


def graph_flops(graph, feeds: dict[str, np.ndarray], training: bool = True) -> int:
    """Floating-point operations of one step of ``graph`` on ``feeds``, counted from its
    matrix products and convolutions only (MatMul, Gemm, Conv, and the recurrent layers' gate
    products: LSTM, GRU, RNN; 2 per multiply-add; the
    elementwise ops, normalisations and softmax are left out, as MFU counts do). The shapes
    come from one traced forward (the planned executor's trace). A training step counts
    3x the forward: the backward computes two products per forward product (the gradients
    of both operands), the convention of Kaplan et al.'s 6N per token; it overcounts by the
    input gradient of a first layer nobody needs."""
    from meta.lv1.plan.compiler import trace

    nodes = graph.nodes_for([o.name for o in graph.outputs], given=feeds)
    info, _ = trace(graph, feeds, nodes, set(), ("native", "numpy"))
    shape = {**{k: np.shape(v) for k, v in graph.initializers.items()},
             **{k: np.shape(v) for k, v in feeds.items()},
             **{k: tuple(v.shape) for k, v in info.items() if hasattr(v, "shape")}}
    total = 0
    for node in nodes:
        if node.op_type == "MatMul":
            a = shape[node.inputs[0]]
            out = shape[node.outputs[0]]
            total += 2 * int(np.prod(out)) * a[-1]
        elif node.op_type == "Gemm":
            a = shape[node.inputs[0]]
            k = a[0] if node.attrs.get("transA", 0) else a[-1]
            total += 2 * int(np.prod(shape[node.outputs[0]])) * k
        elif node.op_type in ("Conv", "ConvTranspose"):
            w = shape[node.inputs[1]]  # (Cout, Cin / group, kh, kw)
            out = shape[node.outputs[0]] if node.op_type == "Conv" else shape[node.inputs[0]]
            total += 2 * int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type in ("LSTM", "GRU", "RNN"):
            steps, batch, features = shape[node.inputs[0]]  # layout 0: (T, N, E)
            if node.attrs.get("layout", 0):
                batch, steps = steps, batch
            directions, gates_hidden, _ = shape[node.inputs[1]]  # W: (D, G * H, E)
            hidden = shape[node.inputs[2]][-1]  # R: (D, G * H, H)
            total += 2 * steps * batch * directions * gates_hidden * (features + hidden)
    return 3 * total if training else total


def gemm_peak(threads: int, n: int = 2048, repeats: int = 5) -> tuple[float, str]:
    """This machine's float32 matrix-product rate at ``threads`` threads, in GFLOP/s: the best
    of ``repeats`` (n x n) @ (n x n) products, numpy's BLAS and PyTorch's (where installed),
    each timed here; returns (GFLOP/s, which library gave it). The fraction of it a step
    reaches says how far from the machine's limit it runs."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    out = np.empty_like(a)
    candidates = {"numpy": lambda: np.matmul(a, b, out=out)}
    if torch is not None:
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        candidates["torch"] = lambda: torch.mm(ta, tb, out=tout)
    best: dict[str, float] = {}
    set_threads(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    for name, fn in candidates.items():
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        best[name] = 2 * n ** 3 / min(times) / 1e9
    name = max(best, key=best.get)
    each = ", ".join(f"{k} {v:.0f}" for k, v in best.items())
    return best[name], f"{name} sgemm {n}x{n} ({each})"


def bf16_gemm_peak(threads: int, n: int = 1024, repeats: int = 5) -> tuple[float, str]:
    """This machine's bf16 matrix-product rate at ``threads`` threads (GFLOP/s): the best of
    ``repeats`` (n x n) @ (n x n) bf16 products in PyTorch (oneDNN's bf16 GEMM, float32
    accumulation); (0, why) without PyTorch."""
    if torch is None:
        return 0.0, "no PyTorch: not measured"
    torch.set_num_threads(threads)
    a, b = (torch.randn(n, n, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(n, n, dtype=torch.bfloat16)
    torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / min(times) / 1e9, f"torch bf16 mm {n}x{n}"


def child_run(script: str, variant: str, threads: int, *options: str) -> dict:
    """``python script --child VARIANT THREADS *options`` in a fresh process with
    ``OMP_NUM_THREADS=threads`` (two frameworks' thread pools in one process slowed each
    other); its result is the JSON object on the last line it prints."""
    out = subprocess.run([sys.executable, script, "--child", variant, str(threads), *options],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
    return json.loads(out.strip().splitlines()[-1])
