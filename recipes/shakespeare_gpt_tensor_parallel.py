"""The Shakespeare GPT (``shakespeare_gpt.py``'s model and data) with every block split over
the ranks in Megatron-LM's way (tensor parallelism: the ``partitioned`` strategy).

Run:  mpiexec -n 2 meta run recipes/shakespeare_gpt_tensor_parallel.py

Each rank holds half of every block's attention heads and of its MLP's hidden features: the
Q, K, V and first MLP weights by columns (column-parallel), the attention and MLP output
projections by rows (row-parallel). The embeddings, LayerNorms, residual adds, the tied
output head and the loss, which every rank would otherwise repeat whole, run on each rank's
share of the batch's rows (Megatron-LM's sequence parallelism, the strategy's default
``distributed.sequence_parallel``): each allreduce of a block's attention and MLP output
becomes a reduce-scatter and an all-gather, the same bytes, forward and backward. Each rank
runs its part on the planned executor, as one compiled plan whose collectives are steps of it
(in place; the backward ones overlapped with the weight gradients: ``meta.lv3.
tensor_parallel.lowering``); every rank takes every batch.
``model.dropout`` must stay 0 (each rank
would draw its own masks for the values all ranks hold alike: refused).
"""

from meta.recipe import AtMost
from recipes.shakespeare_gpt import FIXED as SINGLE
from recipes.shakespeare_gpt import MUTABLE as SINGLE_MUTABLE

FIXED = SINGLE  # the planned executor

MUTABLE = {
    **SINGLE_MUTABLE,
    "distributed": {"name": "partitioned", "param_budget_mb": 0.0},
}

METRICS = {
    # nats per character, the one-process recipe's bound; measured 2.004 (seed 0, full run,
    # 144 s training on a busy 2-core machine, load 13-15; on the native executor 703 s;
    # one process: 1.999)
    "test_loss": AtMost(2.1),
}
