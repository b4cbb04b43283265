"""A character-level GPT on Tiny Shakespeare (nanoGPT's shakespeare_char, made small enough for
two CPU cores): 2 pre-LayerNorm blocks of 4-head causal attention and a GELU MLP, width 128,
a context of 64 characters, the output head tied to the token embedding; AdamW with a cosine
schedule. A sample of its text is printed after every epoch.

Run:  meta run recipes/shakespeare_gpt.py
"""

from meta.recipe import AtMost

FIXED = {
    "dataset": {"name": "text", "context": 64},  # Tiny Shakespeare, characters, 90/10 split
    "model": {"name": "gpt", "layers": 2, "heads": 4, "width": 128},
    "optimizer": "adamw",
    "executor": "planned",
    "events": [{"name": "sample_text", "length": 200, "temperature": 0.8}],
}

MUTABLE = {
    "epochs": 1,  # 490 steps of 32 blocks: about 5 minutes on 2 idle cores
    "batch_size": 32,
    "lr": 2e-3,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "lr_schedule": "cosine",
    "dataset.train_samples": 0,  # train on the first n blocks only (0: all); a quick check
    "dataset.validation": 0.1,  # share of the blocks held out for validation
    "model.dropout": 0.0,
    "eval_batch_size": 64,  # 256 held 650 MB of activations at once (64: about 210 MB)
    "seed": 0,
    "precision": "f32",  # bf16: products in bf16, float32 accumulation and masters (issue 42)
    "recompute": "",  # blocks: keep only the residual blocks' inputs, recompute in the backward
    "distributed": "allreduce",  # under mpiexec: --set distributed=zero2|zero3 shards the model
}

METRICS = {
    "test_loss": AtMost(2.1),  # nats per character; measured 1.999 (seed 0, full run)
}
