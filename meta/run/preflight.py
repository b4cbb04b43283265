"""Checks before training: the recipe, the ranks, the model and the data against each other.

A model that cannot take the data (an input of another shape, a batch dimension fixed at 1 by
an export made with one example, fewer logits than the data has classes, labels the loss
cannot read) and a strategy that cannot run on this many ranks (as many servers as ranks)
would otherwise fail at the first step, or after the data is loaded, with a traceback from
deep inside. Here they are found before any step, every problem at once, each naming both
sides (Keras' ``model.fit`` and Lightning's sanity checks do the same).

``check_ranks`` reads only a strategy's declared options (``servers``, ``stages``), so Level 3
stays as it is; ``check_model_and_data`` reads the graph's declared inputs and outputs and
frees a fixed batch dimension where the network runs with another batch size;
``check_events`` asks the recipe's events that have a ``check(data)`` (``sample_text``: the
prompt against the vocabulary).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from meta.common.component import Component, ComponentError
from meta.lv1.onnx_io import CANNOT_TRAIN


def _join(problems: list[str]) -> str:
    """Several problems in one line, numbered, so one message says everything."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems: " + "; ".join(f"({i}) {p}"
                                                    for i, p in enumerate(problems, 1))


def check_ranks(recipe: str, strategy: Component, values: Mapping[str, Any], size: int) -> None:
    """The strategy's ``servers`` and ``stages`` against the job's ``size`` ranks, before any
    data is loaded; a ComponentError naming the option, its value and the ranks."""
    if size <= 1:
        return  # one process runs every strategy alone
    problems = []
    servers = values.get("servers")
    workers = size
    if isinstance(servers, int) and not isinstance(servers, bool) and servers > 0:
        workers = size - servers
        if workers < 1:
            problems.append(f"distributed {strategy.name!r}: servers={servers} leaves no rank to "
                            f"train among the job's {size} (mpiexec -n {size}); run with at "
                            f"least {servers + 1} ranks or set fewer servers")
    stages = values.get("stages")
    if isinstance(stages, int) and not isinstance(stages, bool) and stages > workers >= 1:
        problems.append(f"distributed {strategy.name!r}: stages={stages} needs {stages} ranks "
                        f"that train, the job has {workers} (mpiexec -n {size}"
                        f"{f' with {servers} server(s)' if workers != size else ''})")
    if problems:
        raise ComponentError(_join(problems))


def check_events(recipe: str, dataset: str, events: list[tuple[str, Any]], train: Any) -> None:
    """Each recipe event that can say so (a ``check(data)`` method answering a problem or "")
    against the training data, before any step: ``sample_text`` with a prompt outside the
    vocabulary, or on a dataset without one, failed only after a whole epoch."""
    problems = []
    for name, event in events:
        problem = getattr(event, "check", lambda data: "")(train)
        if problem:
            problems.append(f"event {name!r} on dataset {dataset!r}: {problem}")
    if problems:
        raise ComponentError(_join(problems))


def _dims(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_model_and_data(recipe: str, model: str, dataset: str, graph: Any, train: Any,
                         test: Any, batch_size: int, names: Mapping[str, str]) -> list[str]:
    """The model's declared data input, logits and parameters against the dataset's examples,
    classes and labels. Returns notes (a batch dimension freed); raises a ComponentError with
    every problem, each naming the model's side and the data's."""
    problems, notes = [], []
    feeds = [t for t in graph.inputs if t.name not in graph.initializers and t.name != "labels"]
    if len(feeds) > 1:
        problems.append(f"model {model!r} has {len(feeds)} data inputs "
                        f"{[t.name for t in feeds]}; dataset {dataset!r} feeds one")
    fed = next((t for t in feeds if t.name == names.get("input")), None)
    example = tuple(train.inputs.shape[1:])
    if fed is not None and fed.shape is not None:
        shape = tuple(fed.shape)
        if len(shape) != len(example) + 1:
            problems.append(f"model {model!r} input {fed.name!r} takes {_dims(shape)} (a batch "
                            f"and {len(shape) - 1} dims), dataset {dataset!r} gives examples "
                            f"of {_dims(example)} (batches of {_dims(('N', *example))})")
        else:
            if any(isinstance(d, int) and d != s for d, s in zip(shape[1:], example)):
                problems.append(f"model {model!r} input {fed.name!r} takes {_dims(shape)}, "
                                f"dataset {dataset!r} gives batches of "
                                f"{_dims(('N', *example))}")
            elif isinstance(shape[0], int) and not isinstance(shape[0], bool):
                problem = _free_batch(graph, fed, train, names)
                if problem:
                    problems.append(f"model {model!r} input {fed.name!r} has its batch "
                                    f"dimension fixed: {_dims(shape)}, and {problem}; batches "
                                    f"are {batch_size} examples (export the model with a "
                                    f"dynamic batch axis, e.g. torch.onnx.export(..., "
                                    f"dynamic_axes={{{fed.name!r}: {{0: 'N'}}}}))")
                else:
                    notes.append(f"model {model!r} input {fed.name!r}: batch dimension "
                                 f"{shape[0]} freed ({_dims(shape)} -> "
                                 f"{_dims(('N', *shape[1:]))})")
    classes = int(max(int(d.labels.max(initial=0)) for d in (train, test))) + 1
    logits = next((t for t in graph.outputs if t.name == names.get("logits")), None)
    if logits is not None and logits.shape is not None and len(logits.shape) >= 2:
        problems += _logits_problems(model, dataset, logits, train.labels, classes)
    labels = next((t for t in graph.inputs if t.name == "labels"), None)
    if labels is not None and labels.dtype is not None and \
            not np.issubdtype(labels.dtype, np.integer):
        problems.append(f"model {model!r} takes labels as {labels.dtype}, its loss as class "
                        f"indices; dataset {dataset!r} gives {train.labels.dtype} class indices")
    if not getattr(graph, "role_overrides", None):  # the user chose what trains: their call
        problems += [f"model {model!r} {note}, or choose what trains with the model's "
                     f"'trainable'/'frozen' patterns" for note in getattr(graph, "notes", ())
                     if note.startswith(CANNOT_TRAIN)]
    if not graph.parameters:
        frozen = len(getattr(graph, "frozen", {}))
        problems.append(f"model {model!r} has no trainable parameter ({frozen} frozen, "
                        f"{len(graph.initializers)} initializers in all): training would "
                        f"change nothing; set the model's 'trainable' patterns")
    if problems:
        raise ComponentError(f"model {model!r} and dataset {dataset!r} do not fit: "
                             f"{_join(problems)}" if len(problems) > 1 else problems[0])
    return notes


def _logits_problems(model: str, dataset: str, logits: Any, labels: np.ndarray,
                     classes: int) -> list[str]:
    """The logits' shape against the labels the loss reads with them: the class axis the last
    of (N, C) and the second of per-position (N, C, T, ...), as ONNX's SoftmaxCrossEntropyLoss
    and PyTorch's cross_entropy read them; the positions' dims equal to the labels'. Logits
    written (N, T, C), as a model's last Linear gives them, are named with the remedy."""
    shape, name = tuple(logits.shape), f"model {model!r} logits {logits.name!r}"
    positions = tuple(labels.shape[1:])
    width = shape[1] if positions else shape[-1]
    labelled = f"dataset {dataset!r} has labels 0..{classes - 1} ({classes} classes)"
    if not positions:
        if len(shape) > 2:
            return [f"{name} are {_dims(shape)}, a prediction per position, dataset "
                    f"{dataset!r} gives one label per example {_dims(labels.shape[:1])}"]
        if isinstance(width, int) and width < classes:
            return [f"{name} give {width} classes ({_dims(shape)}), {labelled}"]
        return []
    fits = len(shape) == len(positions) + 2 and all(
        not isinstance(d, int) or d == t for d, t in zip(shape[2:], positions))
    if fits and not (isinstance(width, int) and width < classes):
        return []
    per_position = f"per-position labels {_dims(('N', *positions))}"
    if len(shape) == len(positions) + 2 and isinstance(shape[-1], int) and \
            shape[-1] >= classes and all(not isinstance(d, int) or d == t
                                         for d, t in zip(shape[1:-1], positions)):
        return [f"{name} are {_dims(shape)}, (N, T, C) with the classes last; for {per_position} "
                f"({dataset!r}) the loss reads the class axis second, (N, C, T), as PyTorch's "
                f"cross_entropy does: return logits.transpose(1, 2) from the model and export "
                f"it again"]
    if not fits:
        return [f"{name} are {_dims(shape)}, dataset {dataset!r} gives {per_position}: "
                f"per-position logits are (N, C, {', '.join(map(str, positions))}), the class "
                f"axis second"]
    return [f"{name} give {width} classes ({_dims(shape)}), {labelled}"]


def _free_batch(graph: Any, fed: Any, train: Any, names: Mapping[str, str]) -> str:
    """Declare ``fed``'s batch dimension free and run two examples through the network (the
    reference executor, in inference mode: nothing is updated); on failure the declaration
    is put back and the reason returned, else ""."""
    from meta.lv1 import GraphError
    from meta.lv1.executor import ExecutionError, ReferenceExecutor

    fixed = tuple(fed.shape)
    fed.shape = ("N", *fixed[1:])
    count = min(2, len(train)) if fixed[0] != 2 else min(3, len(train))
    x, y = train.batch(np.arange(count))
    try:
        ReferenceExecutor(graph).inference({fed.name: x, "labels": y}, [names["logits"]])
    except (GraphError, ExecutionError, ValueError, IndexError, TypeError) as err:
        fed.shape = fixed
        return f"the network does not run a batch of {count} ({' '.join(str(err).split())})"
    return ""
