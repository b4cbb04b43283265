"""The planned executor's precision policy (issue 42): which steps of a plan compute in bf16,
and which of its tensors it keeps in bf16.

Precision is a property of a plan step, decided at lowering (``Context.precision``). With
``precision="bf16"`` the matrix products (MatMul and Gemm, forward and both backward
products), the fused attention's products and the convolutions read their operands in bf16
and accumulate in float32, as PyTorch's CPU autocast does. Softmax, losses, normalizations'
statistics, reductions and the optimizer compute in float32; the parameters and the
optimizer's state are float32 masters, which the float32 update moves.

Like autocast, the plan keeps tensors in bf16 between the ops that read bf16:

* **One bf16 copy per tensor** (``bf16_operand``): a float32 tensor that bf16 products read
  (an activation, a weight, an activation's gradient) is converted once, into a bf16 value of
  the plan, which every product reading it uses, forward and backward: a linear layer's input
  and weight are converted once a step, not once per product (forward, and each backward
  product again), and what the backward reads of them is saved in bf16. The float32 original
  is then free as soon as nothing float32 reads it.
* **bf16 outputs** (``keeps_bf16``, ``bf16_holder``): a tensor whose every reader is a bf16
  product (or a Gelu that writes bf16, ``lowering.eltwise.gelu_reads_bf16``: the MLP's
  first product's output, as autocast's GELU reads its linear's bf16 output) is written in
  bf16 by the op producing it (LayerNorm, Gelu, a matrix product or the attention: each
  computes in float32 and rounds its output once), and never exists in float32:
  autocast's bf16 activations between its bf16 ops. Its gradient stays float32
  where several products add into it (a LayerNorm read by Q, K and V), as autocast's
  gradient of its float32 input is; a Gelu kept in bf16 keeps its derivative in bf16 too, as
  autocast saves Gelu's bf16 input.
* **bf16 gradients** (``gradient_target``): the gradient of a tensor autocast has in bf16 (a
  product's or Gelu's output) is written in bf16 where it has one contribution and its
  producer's backward reads it in bf16 (``takes_bf16_gradient``): the MLP's gradients
  between its products and Gelu, the largest tensors of a transformer's backward. A bias's
  gradient sums the bf16 dy its products read, as autocast's does
  (``lowering.matmul.bias_gradient``).
* **Through identity views** (``passes_through``): an Identity, or a Dropout that passes its
  input (ratio 0, or not training: PyTorch's encoder layers export one after their
  activation), between a bf16 output and the products reading it keeps it bf16: the view's
  readers take a bf16 view of the holder, and its gradient stays the bf16 holder it aliases.
* **The attention's probabilities** (``lowering.attention``): the softmax and its backward
  compute in float32 and also write their output's bf16 copy into the arena, which the
  products after them read (P . V, P^T . dY, dS . K, dS^T . Q): as PyTorch's CPU
  scaled-dot-product attention under autocast keeps P and dS in float32 and multiplies
  their bf16 copies. No product converts a float32 operand itself, so the process-wide
  staging buffer of those conversions is never allocated (1 MiB resident at the GPT's
  sequence 256).
* **Written over what only they read**: a bf16 Gelu's backward writes dx over gelu'(x)
  (``lowering.eltwise``), a LayerNorm's backward d(x) over its dy (``lowering.norm``, in
  float32 plans too): the element-wise products and oneDNN's layer normalization backward
  compute in place.
* **No bytes for what is never written**: the float32 value a bf16 holder stands for is
  declared for its shape and gradient only (storage "none", ``memory.Value``): no arena
  space, no array (in the GPT at sequence 256 the shared buffer of such values held 8 MiB
  of the bf16 step's memory for nothing).

bf16 pays only where the CPU multiplies it natively (``avx512_bf16``, AMX): elsewhere oneDNN
would emulate it, slower than float32. Such a CPU (or ``META_NO_NATIVE_BF16=1``, which
simulates one) gets one line on stderr saying so and runs float32 instead, never a silent
slowdown.
"""

from __future__ import annotations

import os
import sys
from math import prod

import ml_dtypes  # onnx's dependency: numpy's bf16 element type
import numpy as np

from meta.lv1.plan.lowering.views import dropout_is_identity
from meta.lv1.plan.memory import root

PRECISIONS = ("f32", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a native bf16 product
SIMULATE_ENV = "META_NO_NATIVE_BF16"

BF16 = np.dtype(ml_dtypes.bfloat16)  # how the plan stores a bf16 tensor (2 bytes)
COPIES = "bf16 copies"  # Context.objects: float32 value -> the bf16 value holding it
ONLY = "bf16 only"  # Context.objects: float32 values never written (their bf16 holder is)
GRADIENTS = "bf16 gradients"  # Context.objects: values whose producer reads dy in bf16

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


def bf16_operand(ctx, name: str, phase: str = "forward") -> str:
    """The bf16 value a bf16 product reads for ``name``: ``name`` itself when the plan stores
    it in bf16, its bf16 holder or copy when it has one (or, for a view of a value that has
    one, the same view of that holder), else a copy made now by one conversion step in
    ``phase`` and kept for every later reader (the backward's products read the forward's
    copy). A channels-last copy keeps that layout; a blocked layout is left to the product
    to convert."""
    pb = ctx.pb
    v = pb.value(name)
    if v.dtype == BF16:
        return name
    copies = ctx.objects.setdefault(COPIES, {})
    if name in copies:
        return copies[name]
    if v.layout not in ("plain", "nhwc") or v.dtype != np.float32:
        return name
    held = _held_view(ctx, name)
    if held is not None:
        return held
    copy = pb.output(pb.fresh(f"{name}@bf16"), v.shape, BF16)
    # channels-last is as dense as plain: converted element by element it keeps its layout
    # (declared plain first: PlanBuilder.output would size a channels-last value as float32)
    pb.value(copy).layout = v.layout
    n = prod(v.shape)
    pb.step("to bf16", [name], [copy], lambda a: [pb.rt.convert(a(name), a(copy), n)], phase)
    copies[name] = copy
    return copy


def _held_view(ctx, name: str) -> str | None:
    """For a plain view (Reshape, an identity Dropout: ``view_node``) of a value that has a
    bf16 holder or copy, the same view of that bf16 value (made once); else None. A view of
    a value kept in bf16 only must be read so: its own float32 bytes are never written."""
    pb = ctx.pb
    v = pb.value(name)
    copies = ctx.objects.setdefault(COPIES, {})
    if v.storage != "view" or v.layout != "plain" or root(pb.values, name) not in copies:
        return None
    base = copies[v.base] if v.base in copies else _held_view(ctx, v.base)
    if base is None or pb.value(base).layout != "plain":
        return None
    held = pb.view(pb.fresh(f"{name}@bf16"), base, v.shape, v.offset)
    copies[name] = held
    return held


def bf16_operands(ctx, phase: str, *names: str) -> list[str]:
    """``names`` as a product reads them: their bf16 copies (``bf16_operand``) in a bf16
    plan, else themselves ("" stays "")."""
    return [bf16_operand(ctx, n, phase) if ctx.bf16 and n else n for n in names]


# Whether a lowering reads a tensor as a bf16 operand of its node, one predicate per lowering
# that can (``lowering.matmul`` enters ``reads_bf16`` when it is imported, with the kernel
# table): precision asks them without importing the lowerings, which import precision.
BF16_READERS: list = []


def keeps_bf16(ctx, name: str) -> bool:
    """Whether the plan keeps ``name`` in bf16 only: a bf16 plan, ``name`` neither fetched nor
    fed, and every node reading it a bf16 product reading it as an operand
    (``lowering.matmul.reads_bf16``, entered in ``BF16_READERS``), or an identity view whose
    output the plan keeps in bf16 only (``passes_through``)."""
    readers = ctx.consumers.get(name, [])
    return bool(ctx.bf16 and readers and name not in ctx.protected
                and all(any(reads(ctx, node, name) for reads in BF16_READERS)
                        or passes_through(ctx, node, name) and keeps_bf16(ctx, node.outputs[0])
                        for node in readers))


def passes_through(ctx, node, name: str) -> bool:
    """Whether ``node`` is a view of ``name`` that adds nothing (Identity; a Dropout passing
    its input, its mask unused): ``lowering.views.view_node`` lowers it to ``name``'s bytes,
    and its backward aliases the gradient when it is ``name``'s only reader."""
    if node.name in ctx.absorbed or not node.inputs or node.inputs[0] != name \
            or ctx.shape(node.outputs[0]) != ctx.shape(name):
        return False
    if node.op_type == "Identity":
        return True
    return node.op_type == "Dropout" and dropout_is_identity(ctx, node, ctx.ops[node.name]) \
        and not any(ctx.used(o) for o in node.outputs[1:])


def bf16_holder(ctx, name: str) -> str:
    """The bf16 value a producer writes instead of the float32 value ``name`` (declared,
    never written: its readers take the holder through ``bf16_operand``; its gradient keeps
    the float32 name)."""
    pb = ctx.pb
    v = pb.value(name)
    holder = pb.output(pb.fresh(f"{name}@bf16"), v.shape, BF16)
    if v.layout == "nhwc":  # as dense as plain: the holder keeps it (sized as bf16's)
        pb.value(holder).layout = v.layout
    ctx.objects.setdefault(COPIES, {})[name] = holder
    ctx.objects.setdefault(ONLY, set()).add(name)
    v.storage = "none"  # never written: no bytes (memory.Value)
    return holder


def takes_bf16_gradient(ctx, name: str) -> None:
    """Say that ``name``'s producer reads its gradient in bf16 (through ``stored``), so its
    one contribution may be written in bf16 (``gradient_target``); a fetched or fed tensor
    keeps a float32 gradient (a stage's seed is copied into it)."""
    if not ctx.bf16 or name in ctx.protected:
        return
    ctx.objects.setdefault(GRADIENTS, set()).add(name)
    readers = ctx.consumers.get(name, [])
    if len(readers) == 1 and passes_through(ctx, readers[0], name):
        # the view's backward aliases name's gradient to the view's (its only reader): the
        # view's one contribution may be bf16 too, read through ``stored``
        takes_bf16_gradient(ctx, readers[0].outputs[0])


def gradient_target(ctx, name: str) -> tuple[str, bool] | None:
    """Where a step writes its contribution to ``name``'s gradient and whether it adds
    (``PlanBuilder.grad_target`` with accumulation), or a bf16 holder of the gradient when
    ``name`` takes a bf16 gradient and this is its only contribution."""
    pb = ctx.pb
    single = pb.consumers.get(name) == 1 and pb.grad(name) is None
    target = pb.grad_target(name, can_accumulate=True)
    if target is None or not single or name not in ctx.objects.get(GRADIENTS, ()):
        return target
    return bf16_holder(ctx, target[0]), False


def stored(ctx, name: str) -> str:
    """The value holding ``name``'s bytes: its bf16 holder when the plan keeps it in bf16
    only (for a view of such a value, that view of the holder), else ``name``."""
    if name in ctx.objects.get(ONLY, ()):
        return ctx.objects[COPIES][name]
    if root(ctx.pb.values, name) in ctx.objects.get(ONLY, ()):
        held = _held_view(ctx, name)
        if held is not None:
            return held
    return name


def check_unwritten(ctx) -> None:
    """No step reads or writes a float32 value the plan keeps only in bf16 (it has no bytes),
    nor a view of one: a lowering that read it anyway would compute on garbage, so the plan
    is refused instead. The views of such values then get no bytes either (storage "none")."""
    only = ctx.objects.get(ONLY, set())
    values = getattr(ctx.pb, "values", {})

    def unwritten(name: str) -> bool:
        return name in only or name in values and values[root(values, name)].storage == "none"

    for step in ctx.pb.steps:
        for verb, names in (("reads", step.reads), ("writes", step.writes)):
            wrong = sorted(n for n in names if unwritten(n))
            if wrong:
                raise AssertionError(f"step {step.name!r} of node {step.node!r} {verb} "
                                     f"{wrong[0]!r}, which the plan keeps in bf16 only")
    for name, v in values.items():
        if v.storage == "view" and unwritten(name):
            v.storage = "none"
