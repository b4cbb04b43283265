"""What the benchmark scripts share: the environment header, the machine's other load, and
interleaved timed blocks (so background noise hits every variant alike)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np
import threadpoolctl

from meta._threads import cores
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
