"""Zero-size and integer tensors through every native twin: the numpy result, never a crash.

Each case runs in a child process, so a kernel that kills its process (a SIGFPE from a loop
over an empty tensor did) fails this test with the case's name instead of ending the run.
"""

from __future__ import annotations

import subprocess
import sys

from meta.lv0 import entries

CHILD = r'''
import warnings
import numpy as np
from meta.lv0 import Context, lookup

warnings.simplefilter("ignore")  # means of empty tensors: NaN, as numpy says
f32, i32 = np.float32, np.int32
pool = {"kernel_shape": [2, 2]}
CASES = [
    ("Add", {}, [np.zeros((0,), f32), np.zeros((0,), f32)]),
    ("Sub", {}, [np.zeros((0, 3), f32), np.zeros((3,), f32)]),
    ("Mul", {}, [np.zeros((2, 0), f32), np.zeros((2, 0), f32)]),
    ("Div", {}, [np.zeros((0,), f32), np.ones((1,), f32)]),
    ("Add", {}, [np.arange(6, dtype=i32).reshape(2, 3), np.ones(3, i32)]),
    ("Mul", {}, [np.arange(6, dtype=i32), np.full(6, 3, i32)]),
    ("Div", {}, [np.arange(6, dtype=i32) * 7, np.full(6, 2, i32)]),
    ("Relu", {}, [np.zeros((0, 4), f32)]),
    ("Relu", {}, [np.arange(-3, 3, dtype=i32)]),
    ("LeakyRelu", {}, [np.zeros((0, 4), f32)]),
    ("Sigmoid", {}, [np.zeros((0, 4), f32)]),
    ("Tanh", {}, [np.zeros((0, 4), f32)]),
    ("Softmax", {}, [np.zeros((0, 4), f32)]),
    ("LogSoftmax", {}, [np.zeros((0, 4), f32)]),
    ("Gemm", {}, [np.zeros((0, 3), f32), np.ones((3, 2), f32)]),
    ("Gemm", {}, [np.ones((2, 3), i32), np.ones((3, 2), i32)]),
    ("MatMul", {}, [np.zeros((0, 3), f32), np.ones((3, 2), f32)]),
    ("MatMul", {}, [np.ones((2, 3), i32), np.ones((3, 4), i32)]),
    ("Conv", {}, [np.zeros((0, 1, 5, 5), f32), np.ones((2, 1, 3, 3), f32)]),
    ("MaxPool", pool, [np.zeros((0, 1, 4, 4), f32)]),
    ("AveragePool", pool, [np.zeros((0, 1, 4, 4), f32)]),
    ("BatchNormalization", {}, [np.zeros((0, 3, 2, 2), f32), *(np.ones(3, f32),) * 4]),
    ("SoftmaxCrossEntropyLoss", {}, [np.zeros((0, 4), f32), np.zeros((0,), np.int64)]),
]
for op, attrs, inputs in CASES:
    native = lookup(op, 17, backends=("native",))(**attrs)
    numpy_op = lookup(op, 17, backends=("numpy",))(**attrs)
    ctx = Context()
    got = native.apply(ctx, *inputs)
    want = numpy_op.apply(Context(), *inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (op, g.dtype, g.shape, w.dtype, w.shape)
        assert np.array_equal(g, w, equal_nan=True), (op, g, w)
    if all(np.issubdtype(a.dtype, np.floating) for a in inputs[:1]):
        grads = native.backward(ctx, *[np.ones_like(g) for g in got[:1]])
        for grad, x in zip(grads, inputs):
            assert grad is None or grad.shape == x.shape, (op, "backward", grad.shape, x.shape)
    print("ok", op, [str(a.dtype) + str(list(a.shape)) for a in inputs], flush=True)
print("all", len(CASES))
'''


def test_every_native_twin_takes_empty_and_integer_tensors():
    twins = {e.op_type for e in entries() if e.backend == "native"}
    covered = {line.split('"')[1] for line in CHILD.splitlines() if line.strip().startswith('("')}
    assert twins <= covered, f"native twins without an edge case here: {sorted(twins - covered)}"
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=120)
    last = done.stdout.strip().splitlines()[-1:] or ["nothing ran"]
    assert done.returncode == 0 and last[0].startswith("all"), (
        f"exit {done.returncode} after: {last[0]}\n{done.stderr[-2000:]}")
