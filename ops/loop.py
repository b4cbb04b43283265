"""Loop (ONNX opsets 1+): run ``body`` while the trip count and the condition allow.

Inputs: M (optional maximum trip count), cond (optional), then the initial loop-carried
values. The body takes (iteration number, condition, carried values...) and returns
(condition, carried values..., scan outputs...); the node outputs the final carried values,
then each scan output stacked over the iterations. The body reads enclosing tensors through
the executor's scope (``ctx.subgraphs``). Backward runs the iterations' records in reverse:
each carried gradient passes back through the body, the scan outputs' slices join in, and
the enclosing tensors the body read collect theirs in the scope.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Loop", since=1)
class Loop(Operator):
    """ONNX Loop-1: generic Looping construct."""
    attributes = {"body": None}
    no_grad_inputs = (0, 1)

    def forward(self, ctx, trip_count=None, cond=None, *initial):
        body = self.body
        n_carried = len(initial)
        n_scan = len(body.outputs) - 1 - n_carried
        if n_scan < 0:
            raise ValueError(f"Loop: the body returns {len(body.outputs)} values for "
                             f"{n_carried} loop-carried ones (plus the condition)")
        limit = None if trip_count is None else int(np.reshape(trip_count, -1)[0])
        going = True if cond is None else bool(np.reshape(cond, -1)[0])
        if limit is None and cond is None:
            raise ValueError("Loop: neither a trip count nor a condition: it would not end")
        carried = list(initial)
        scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
        records = []
        i = 0
        while going and (limit is None or i < limit):
            outputs, record = ctx.subgraphs.run(
                body, [np.array(i, np.int64), np.array(going), *carried])
            records.append(record)
            going = bool(np.reshape(outputs[0], -1)[0])
            carried = list(outputs[1:1 + n_carried])
            for k, value in enumerate(outputs[1 + n_carried:]):
                scans[k].append(value)
            i += 1
        stacked = [np.stack(s) if s else self.empty(body.outputs[1 + n_carried + k])
                   for k, s in enumerate(scans)]
        ctx.save(records=records, n_carried=n_carried, carried_like=list(initial))
        return (*carried, *stacked)

    @staticmethod
    def empty(info) -> np.ndarray:
        """A scan output of a loop that ran no iteration: (0, ...) of the declared type."""
        dims = [d if isinstance(d, int) else 0 for d in (info.shape or ())]
        return np.zeros((0, *dims), info.dtype or np.float32)

    def backward(self, ctx, *grad_outputs):
        n = ctx.n_carried
        dcarried = list(grad_outputs[:n])
        dscans = grad_outputs[n:]
        for i in reversed(range(len(ctx.records))):
            douts = [None, *dcarried, *(None if d is None else d[i] for d in dscans)]
            if all(d is None for d in douts):
                break
            grads = ctx.subgraphs.backward(ctx.records[i], douts)
            dcarried = list(grads[2:2 + n])
        dinitial = [None if g is None or not isinstance(like, np.ndarray)
                    or not np.issubdtype(like.dtype, np.floating)
                    else np.broadcast_to(g, like.shape).astype(like.dtype, copy=False)
                    for g, like in zip(dcarried, ctx.carried_like)]
        return (None, None, *dinitial)
