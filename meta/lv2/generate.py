"""Text generation from a language model: temperature and top-k sampling from a prompt.

The model is any graph with the language models' contract (``meta.lv1.language_models``):
``input`` (N, context) token ids -> ``logits`` (N, vocab, context). Each new token is drawn
from the logits at the last filled position of a window of the latest ``context`` tokens; the
window is padded on the right while the text is shorter than the context, which a causal model
never reads from an earlier position. It runs through the executor the run trains with, in
inference mode (dropout off), and puts the executor's mode back.

>>> from meta.lv1 import ReferenceExecutor, gpt
>>> ex = ReferenceExecutor(gpt((8,), classes=5, layers=1, heads=1, width=4))
>>> generate(ex, [1, 2], 5, rng=np.random.default_rng(0)).shape
(7,)
"""

from __future__ import annotations

import sys
from typing import Any, Sequence, TextIO

import numpy as np

from meta.common.component import Option
from meta.lv1.executor import Executor
from meta.lv2.events import EVENTS, Event
from meta.lv2.kv_cache import GPTCache, generate_cached
from meta.lv2.sampling import sample_next


def context_of(executor: Executor, input_name: str = "input") -> int:
    """The model's context: the fixed second axis of its ``input``."""
    fed = next((t for t in executor.graph.inputs if t.name == input_name), None)
    shape = getattr(fed, "shape", None)
    if shape is None or len(shape) != 2 or not isinstance(shape[1], int):
        raise ValueError(f"generate: the model's input {input_name!r} must be (N, context) "
                         f"token ids with a fixed context, it is {shape}")
    return int(shape[1])


def generate(executor: Executor, prompt: Sequence[int] | np.ndarray, length: int,
             temperature: float = 1.0, top_k: int = 0, rng: np.random.Generator | None = None,
             names: dict[str, str] | None = None, cache: bool = False) -> np.ndarray:
    """The prompt's ids followed by ``length`` sampled ids (int64). ``cache=True`` decodes
    incrementally with a key/value cache (``meta.lv2.kv_cache``: the same tokens at
    temperature 0, each in one position's work) from the graph's current weights while the
    text fits the context, and with the executor once the window slides; a graph that is not
    meta's GPT is a ``CacheError`` naming why."""
    n = {"input": "input", "logits": "logits", **(names or {})}
    context = context_of(executor, n["input"])
    rng = rng if rng is not None else np.random.default_rng()
    kv = None
    if cache:
        kv = GPTCache(executor.graph, n["logits"])

    def recompute(window: list[int]) -> np.ndarray:
        """The next-token scores after ``window`` (at most ``context`` ids), padded."""
        feed = np.zeros((1, context), np.int64)
        feed[0, :len(window)] = window
        logits = executor.inference({n["input"]: feed}, [n["logits"]])[n["logits"]]
        return logits[0, :, len(window) - 1]

    ids = [int(i) for i in np.asarray(prompt, np.int64).reshape(-1)] or [0]
    was_training = executor.training
    executor.train(False)
    try:
        if kv is not None:
            return generate_cached(kv, ids, length, temperature, top_k, rng, recompute)
        for _ in range(length):
            ids.append(sample_next(recompute(ids[-context:]), temperature, top_k, rng))
    finally:
        if was_training is None:  # each node as written: nothing to switch back to
            executor.training = None
        else:
            executor.train(was_training)
    return np.array(ids, np.int64)


class SampleText(Event):
    """Prints a short sample of the model's text after each epoch (on the first replica): the
    prompt and ``length`` tokens sampled at ``temperature`` from the ``top_k`` most likely,
    decoded with the training data's vocabulary. Every sample is kept in ``samples``."""

    def __init__(self, prompt: str = "\n", length: int = 200, temperature: float = 0.8,
                 top_k: int = 0, seed: int = 0, stream: TextIO | None = None) -> None:
        self.prompt, self.length, self.temperature = prompt, length, temperature
        self.top_k, self.seed, self.stream = top_k, seed, stream
        self.samples: list[str] = []

    def check(self, data: Any) -> str:
        """What would fail at the first epoch's end, found before training (``meta.run.preflight``
        asks): no vocabulary in ``data`` to decode with, or a prompt it cannot encode; "" if
        none."""
        vocabulary = getattr(data, "vocabulary", None)
        if vocabulary is None:
            return ("the training data has no vocabulary to encode the prompt and decode the "
                    "samples with (use the 'text' dataset, or drop the event)")
        try:
            vocabulary.encode(self.prompt)
        except ValueError as err:
            return f"prompt {self.prompt!r}: {err} (choose a prompt of the corpus' characters)"
        return ""

    def on_epoch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        vocabulary = getattr(trainer.train_data, "vocabulary", None)
        if vocabulary is None:
            raise ValueError("sample_text: the training data has no vocabulary to decode "
                             "samples with (use the 'text' dataset)")
        rng = np.random.default_rng([self.seed, len(trainer.history)])
        ids = generate(trainer.executor, vocabulary.encode(self.prompt), self.length,
                       self.temperature, self.top_k, rng, trainer.names)
        text = vocabulary.decode(ids)
        self.samples.append(text)
        if getattr(trainer, "prints", True):  # every rank samples (a pipeline's stages
            # take part), one prints
            print(f"--- sample after epoch {metrics.get('epoch', len(trainer.history))} ---\n"
                  f"{text}\n---", file=self.stream or sys.stdout, flush=True)


EVENTS.add("sample_text", SampleText, {
    "prompt": Option("\n", "text the sample starts from"),
    "length": Option(200, "tokens to sample", low=1),
    "temperature": Option(0.8, "softmax temperature (0: always the most likely)", low=0.0),
    "top_k": Option(0, "sample among the k most likely tokens (0: all)", low=0),
    "seed": Option(0, "seeds the draws (with the epoch)"),
}, doc="print a sample of a language model's text after each epoch")
