"""SequenceMap (ONNX opset 17+): run ``body`` on each position of the input sequence; the
additional inputs are sequences (read at the same position) or tensors (given whole); each
body output is collected into a sequence. The body reads enclosing tensors through the
executor's scope (``ctx.subgraphs``). Forward only."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._sequence import check_sequence


@register("SequenceMap", since=17)
class SequenceMap(Operator):
    """ONNX SequenceMap-17: applies a sub-graph to each sample in the input sequence(s)."""
    attributes = {"body": None}
    no_grad_inputs = tuple(range(256))

    def forward(self, ctx, sequence, *additional):
        seq = check_sequence(sequence, "SequenceMap")
        for extra in additional:
            if isinstance(extra, list) and len(extra) != len(seq):
                raise ValueError(f"SequenceMap: sequences of {len(seq)} and {len(extra)}")
        outputs = [[] for _ in self.body.outputs]
        for i, item in enumerate(seq):
            args = [item, *(e[i] if isinstance(e, list) else e for e in additional)]
            results, _ = ctx.subgraphs.run(self.body, args)
            for collected, value in zip(outputs, results):
                collected.append(value)
        return tuple(outputs)
