"""A character-level LSTM language model on Tiny Shakespeare (char-rnn's task): a 64-wide
token embedding, one LSTM of 256 units over blocks of 64 characters (trained by
backpropagation through time) and a linear head at every step; Adam. A sample of its text is
printed after every epoch.

Run:  meta run recipes/shakespeare_lstm.py
"""

from meta.recipe import AtMost

FIXED = {
    "dataset": {"name": "text", "context": 64},  # Tiny Shakespeare, characters, 90/10 split
    "model": {"name": "lstm_lm", "hidden": 256, "embedding": 64},
    "optimizer": "adam",
    "executor": "planned",
    "events": [{"name": "sample_text", "length": 200, "temperature": 0.8}],
}

MUTABLE = {
    "epochs": 1,
    "batch_size": 32,
    "lr": 3e-3,
    "grad_clip": 1.0,
    "lr_schedule": "cosine",
    "dataset.train_samples": 0,  # train on the first n blocks only (0: all); a quick check
    "dataset.validation": 0.1,  # share of the blocks held out for validation
    "eval_batch_size": 256,
    "seed": 0,
}

METRICS = {
    "test_loss": AtMost(2.2),  # validation loss per character, in nats
}
