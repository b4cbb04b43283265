"""The planned executor's precision policy (issue 42): which steps of a plan compute in bf16.

Precision is a property of a plan step, decided at lowering (``Context.precision``). With
``precision="bf16"`` the matrix products (MatMul and Gemm, forward and both backward
products) and the convolutions (forward, backward-data, backward-weights) read their operands
in bf16 and accumulate and write float32, as PyTorch's CPU autocast does: each step converts
its float32 operands into shared bf16 staging buffers just before its oneDNN primitive
(``cpp/plan/runtime.cpp``, ``Bf16Step``). Everything else (softmax, losses, normalizations,
reductions, the optimizer) stays float32, and so do the plan's buffers, the parameters and
the optimizer's state: they are the float32 masters, which the float32 update moves.

bf16 pays only where the CPU multiplies it natively (``avx512_bf16``, AMX): elsewhere oneDNN
would emulate it, slower than float32. Such a CPU (or ``META_NO_NATIVE_BF16=1``, which
simulates one) gets one line on stderr saying so and runs float32 instead, never a silent
slowdown.
"""

from __future__ import annotations

import os
import sys

PRECISIONS = ("f32", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a native bf16 product
SIMULATE_ENV = "META_NO_NATIVE_BF16"

_said: set[str] = set()


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16() -> tuple[bool, str]:
    """(whether this CPU multiplies bf16 natively, why not when it does not)."""
    if os.environ.get(SIMULATE_ENV, "") not in ("", "0"):
        return False, f"{SIMULATE_ENV} is set"
    flags = cpu_flags()
    if not flags:
        return False, "this CPU's feature flags are unknown (no /proc/cpuinfo)"
    found = [f for f in BF16_FLAGS if f in flags]
    if not found:
        return False, f"this CPU has neither {' nor '.join(BF16_FLAGS)}"
    return True, ""


def check(precision: str) -> str:
    """``precision`` checked (ValueError naming the choices when it is none of them)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    return precision


def effective(precision: str) -> str:
    """The precision a plan runs in when ``precision`` is asked for: "bf16" falls back to
    "f32" where bf16 is not native, said once per process on stderr."""
    check(precision)
    if precision != "bf16":
        return precision
    native, why = native_bf16()
    if native:
        return "bf16"
    say_once(f"meta: precision bf16 asked for, but {why}: bf16 would run emulated, slower "
             f"than float32; the planned executor runs float32 instead")
    return "f32"


def say_once(line: str) -> None:
    """``line`` on stderr, the first time this process says it."""
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def native_line() -> str:
    """One line: whether this CPU multiplies bf16 natively and what ``precision="bf16"`` runs
    as here (``meta --version`` prints it; the same test as the executor's fallback)."""
    native, why = native_bf16()
    if native:
        found = " and ".join(f for f in BF16_FLAGS if f in cpu_flags())
        return (f"bf16: native on this CPU ({found}): precision=bf16 runs matrix products and "
                f"convolutions in bf16 (float32 accumulation and masters)")
    return f"bf16: not native here ({why}): precision=bf16 runs float32"


def of_placement(where: str) -> str:
    """The precision a node computes in, from its ``placement()`` entry: "bf16" for a step
    whose products read bf16 ("onednn bf16"), "" where the node computes nothing of its own
    (a view, folded, fused into another node's step, not run), else "f32"."""
    if where.endswith(" bf16"):
        return "bf16"
    if where in ("view", "folded", "not run") or where.startswith("fused into"):
        return ""
    return "f32"
