"""Scan (ONNX opsets 8, 9+): run ``body`` over slices of the scan inputs, threading states.

Opset 9+: inputs are the initial states then ``num_scan_inputs`` scan inputs; each
iteration the body takes (states..., one slice of each scan input along its
``scan_input_axes`` entry, backwards where ``scan_input_directions`` says 1) and returns
(states..., scan output slices...). Outputs: the final states, then each scan output stacked
along its ``scan_output_axes`` entry (reversed where ``scan_output_directions`` says 1).
Opset 8 has a batch axis 0 on every input and output and an optional ``sequence_lens``
first input (per-batch lengths; outputs past a length are zero).

The body reads enclosing tensors through the executor's scope (``ctx.subgraphs``); backward
runs the iterations' records in reverse, scattering each slice's gradient back into its scan
input.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def _axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


@register("Scan", since=9)
class Scan(Operator):
    """ONNX Scan-9: Scan can be used to iterate over one or more scan_input tensors,
    constructing zero or more scan_output tensors."""
    attributes = {"body": None, "num_scan_inputs": 1, "scan_input_axes": None,
                  "scan_input_directions": None, "scan_output_axes": None,
                  "scan_output_directions": None}

    def layout(self, scans):
        m = self.num_scan_inputs
        axes = [_axis(a, x.ndim) for a, x in zip(self.scan_input_axes or [0] * m, scans)]
        dirs = list(self.scan_input_directions or [0] * m)
        return axes, dirs

    def forward(self, ctx, *inputs):
        m = self.num_scan_inputs
        states, scans = list(inputs[:len(inputs) - m]), inputs[len(inputs) - m:]
        n = len(states)
        axes, dirs = self.layout(scans)
        lengths = {x.shape[a] for x, a in zip(scans, axes)}
        if len(lengths) != 1:
            raise ValueError(f"Scan: scan inputs disagree on the sequence length: "
                             f"{[list(x.shape) for x in scans]} along axes {axes}")
        steps = lengths.pop()
        outs: list[list[np.ndarray]] = []
        records = []
        for t in range(steps):
            slices = [np.take(x, steps - 1 - t if d else t, axis=a)
                      for x, a, d in zip(scans, axes, dirs)]
            outputs, record = ctx.subgraphs.run(self.body, [*states, *slices])
            records.append(record)
            states = list(outputs[:n])
            outs.append(outputs[n:])
        k = len(self.body.outputs) - n
        out_axes = list(self.scan_output_axes or [0] * k)
        out_dirs = list(self.scan_output_directions or [0] * k)
        stacked = []
        for j in range(k):
            seq = [o[j] for o in outs][::-1 if out_dirs[j] else 1]
            if not seq:
                info = self.body.outputs[n + j]
                dims = [d if isinstance(d, int) else 0 for d in (info.shape or ())]
                stacked.append(np.zeros((0, *dims), info.dtype or np.float32))
                continue
            stacked.append(np.stack(seq, axis=_axis(out_axes[j], seq[0].ndim + 1)))
        ctx.save(records=records, n=n, axes=axes, dirs=dirs, out_axes=out_axes,
                 out_dirs=out_dirs, steps=steps,
                 like=[np.asarray(x) for x in inputs])
        return (*states, *stacked)

    def backward(self, ctx, *grad_outputs):
        n, steps = ctx.n, ctx.steps
        dstates = list(grad_outputs[:n])
        dscan_out = grad_outputs[n:]
        scans_like = ctx.like[n:]
        dscans = [np.zeros(x.shape, x.dtype) if np.issubdtype(x.dtype, np.floating) else None
                  for x in scans_like]
        for t in reversed(range(steps)):
            douts = []
            for j, d in enumerate(dscan_out):
                if d is None:
                    douts.append(None)
                    continue
                axis = _axis(ctx.out_axes[j], d.ndim)
                douts.append(np.take(d, steps - 1 - t if ctx.out_dirs[j] else t, axis=axis))
            grads = ctx.subgraphs.backward(ctx.records[t], [*dstates, *douts])
            dstates = list(grads[:n])
            for g, dx, a, d in zip(grads[n:], dscans, ctx.axes, ctx.dirs):
                if g is not None and dx is not None:
                    index = [slice(None)] * dx.ndim
                    index[a] = steps - 1 - t if d else t
                    dx[tuple(index)] += g
        dinitial = [None if g is None or not np.issubdtype(like.dtype, np.floating)
                    else np.broadcast_to(g, like.shape).astype(like.dtype, copy=False)
                    for g, like in zip(dstates, ctx.like[:n])]
        return (*dinitial, *dscans)


@register("Scan", since=8)
class Scan8(Scan):
    """Opset 8: batch axis 0 everywhere, ``sequence_lens`` first, ``directions``."""

    attributes = {"body": None, "num_scan_inputs": 1, "directions": None}
    scan_input_axes = scan_output_axes = scan_output_directions = None
    no_grad_inputs = (0,)

    def forward(self, ctx, sequence_lens=None, *inputs):
        m = self.num_scan_inputs
        states, scans = inputs[:len(inputs) - m], inputs[len(inputs) - m:]
        batch = (states or scans)[0].shape[0]
        steps = scans[0].shape[1]
        lens = [steps] * batch if sequence_lens is None or not np.size(sequence_lens) \
            else [int(v) for v in np.reshape(sequence_lens, -1)]
        self.scan_input_directions = self.directions
        per_batch, contexts = [], []
        for b in range(batch):
            sub = type(ctx).__new__(type(ctx))
            sub.__dict__.update(ctx.__dict__)
            out = super().forward(sub, *(s[b] for s in states),
                                  *(x[b, :lens[b]] for x in scans))
            per_batch.append(out)
            contexts.append(sub)
        ctx.save(contexts=contexts, lens=lens, steps=steps)
        n = len(states)
        results = [np.stack([o[i] for o in per_batch]) for i in range(n)]
        for j in range(n, len(per_batch[0])):
            padded = []
            for o in per_batch:
                pad = [(0, steps - o[j].shape[0])] + [(0, 0)] * (o[j].ndim - 1)
                padded.append(np.pad(o[j], pad))
            results.append(np.stack(padded))
        return tuple(results)

    def backward(self, ctx, *grad_outputs):
        per_batch = []
        for b, (sub, length) in enumerate(zip(ctx.contexts, ctx.lens)):
            douts = [None if g is None else g[b] if i < sub.n else g[b, :length]
                     for i, g in enumerate(grad_outputs)]
            per_batch.append(super().backward(sub, *douts))
        grads = [None]
        for i in range(len(per_batch[0])):
            parts = [g[i] for g in per_batch]
            if any(p is None for p in parts):
                grads.append(None)
                continue
            if i >= ctx.contexts[0].n:  # a scan input: pad each batch's slice back to steps
                parts = [np.pad(p, [(0, ctx.steps - p.shape[0])] + [(0, 0)] * (p.ndim - 1))
                         for p in parts]
            grads.append(np.stack(parts))
        return tuple(grads)
