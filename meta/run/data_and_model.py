"""A recipe's data and network, built by their components and checked against each other
before any step: the dataset's splits, the model the data's shape and classes call for, the
splits cast to what the network's input takes, and the notes ``check_model_and_data`` has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TextIO

from meta.lv1 import Graph, build_model
from meta.lv2 import build_dataset
from meta.lv2.dataset_registry import as_model_input, classes, model_dtype
from meta.run.errors import user_code
from meta.run.preflight import check_model_and_data
from meta.run.recipe import Recipe


def io_names(graph: Graph) -> dict[str, str]:
    """The trainer's tensor names: the data input, the first output (logits) and ``loss``."""
    feeds = [t.name for t in graph.inputs if t.name not in graph.initializers
             and t.name != "labels"]
    logits = [t.name for t in graph.outputs if t.name != "loss"]
    return {"input": feeds[0] if feeds else "input", "logits": logits[0] if logits else "logits"}


@dataclass(frozen=True)
class DataAndModel:
    """What ``build_data_and_model`` built: the splits, the augmentation and the network."""

    train: Any  # the training split, as the network's input takes it
    test: Any
    augment: Callable[..., Any] | None  # the dataset's training transform, or None
    model: Any  # what the model component built (a Graph, or a model holding one)
    graph: Graph


def build_data_and_model(recipe: Recipe, stream: TextIO, prints: bool) -> DataAndModel:
    """The recipe's dataset and model, built (a failure in the user's code named as theirs)
    and checked against each other; ``prints``: the notes on ``stream`` (rank 0)."""
    d = recipe.definitions
    data, model = d.choices["dataset"], d.choices["model"]
    with user_code(f"dataset {data.name!r}", "dataset", "while loading the data"):
        train, test, augment = build_dataset(data.component, data.options, d.seed)
    with user_code(f"model {model.name!r}", "model", "while building the model"):
        built = build_model(model.component, model.options, train.inputs.shape[1:],
                            classes(train, test), d.seed, model_dtype(train))
        getattr(built, "check", lambda data: None)(train)
    graph = getattr(built, "graph", built)
    fed = next((t for t in graph.inputs if t.name == io_names(graph)["input"]), None)
    train, test = (as_model_input(s, getattr(fed, "dtype", None)) for s in (train, test))
    for note in check_model_and_data(recipe.name, model.name, data.name, graph, train, test,
                                     d.batch_size, io_names(graph)):
        if prints:
            print(f"meta: {note}", file=stream, flush=True)
    return DataAndModel(train, test, augment, built, graph)
