"""A larger character-level GPT on Tiny Shakespeare that does not fit its per-rank memory budget
unsharded and is meant to train fully sharded (ZeRO-3): 8 pre-LayerNorm blocks of 8-head
causal attention and a GELU MLP, width 512, a context of 64 characters (25.3 M parameters,
101 MB in float32), AdamW.

``memory_limit_gb`` 0.25 caps each rank's model state at 256 MB (meta's memory model,
``meta plan``'s): a replica under allreduce needs 482 MB (parameters 96, gradients 96, AdamW's
moments 193, the flat gradient buffer 96), ZeRO-2 at 4 ranks 265 MB, ZeRO-3 at 4 ranks 119 MB
(its 1/4 of each, two of its 13 layer groups gathered and one group's gradients). So:

    mpiexec -n 4 meta run recipes/shakespeare_gpt_large.py        # trains, zero3
    meta run recipes/shakespeare_gpt_large.py --set distributed=allreduce   # refused, exit 2

A full epoch is hours on two CPU cores: ``--set dataset.train_samples=256`` for a quick check.
"""

from meta.recipe import AtMost

FIXED = {
    "dataset": {"name": "text", "context": 64},  # Tiny Shakespeare, characters, 90/10 split
    "model": {"name": "gpt", "layers": 8, "heads": 8, "width": 512},
    "optimizer": "adamw",
    "executor": "planned",
    "memory_limit_gb": 0.25,  # per rank: the unsharded model state (482 MB) is refused
}

MUTABLE = {
    "epochs": 1,
    "batch_size": 16,
    "lr": 6e-4,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "lr_schedule": "cosine",
    "dataset.train_samples": 0,  # train on the first n blocks only (0: all); a quick check
    "dataset.validation": 0.1,
    "eval_batch_size": 32,
    "seed": 0,
    "distributed": "zero3",  # at mpiexec -n 4 (2 ranks fit too; one process does not)
}

METRICS = {
    "test_loss": AtMost(2.1),  # nats per character; not measured here (a long run)
}
