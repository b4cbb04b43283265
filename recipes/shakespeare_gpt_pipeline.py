"""The Shakespeare GPT (``shakespeare_gpt.py``'s model and data) trained over 2 pipeline
stages: the blocks cut between the stages, every batch split into micro-batches that flow
through them forward and back (1F1B).

Run:  mpiexec -n 2 meta run recipes/shakespeare_gpt_pipeline.py

Stage 0 holds the token and position embeddings and block 0, stage 1 block 1, the final
LayerNorm and the output head. The head is tied to the token embedding (``wte``), which both
stages therefore read: each holds a copy, their gradients are summed over the stages every
step (one allreduce of the embedding) and both copies take the same update (``Partition.tied``
in ``meta.lv3.pipeline``). The causal mask is a Constant node that each stage computes.
The stages run the one-process recipe's planned executor: each stage a compiled plan, one
executor (plan and arena) per micro-batch the schedule holds in flight (stage 0: 2 under 1F1B),
the activations and their gradients sent between the plans' calls by MPI.
"""

from meta.recipe import AtMost
from recipes.shakespeare_gpt import FIXED as SINGLE
from recipes.shakespeare_gpt import MUTABLE as SINGLE_MUTABLE

FIXED = SINGLE  # the planned executor

MUTABLE = {
    **SINGLE_MUTABLE,
    "distributed": {"name": "pipeline", "stages": 2, "micro_batches": 4, "schedule": "1f1b",
                    "cuts": ["h0.mlp.residual"]},  # after block 0 (with 2 layers)
}

METRICS = {
    # nats per character, the one-process recipe's bound; measured 2.006 (seed 0, full run,
    # 122 s training on a busy 2-core machine, load 12-14; on the native executor 991 s;
    # one process: 1.999)
    "test_loss": AtMost(2.1),
}
