"""Recipes: fixed definitions, mutable definitions and acceptable metrics, validated up front.

A recipe is a plain Python file with three dicts::

    from meta.recipe import AtLeast, AtMost

    FIXED = {"dataset": "mnist", "model": "mlp", "hidden": [512, 512]}
    MUTABLE = {"epochs": 4, "batch_size": 128, "lr": 0.05, "momentum": 0.9, "seed": 0}
    METRICS = {"test_accuracy": AtLeast(0.975), "train_time_s": AtMost(120)}

FIXED keys define the experiment; MUTABLE keys may be changed (``meta run --set lr=0.1``)
without changing what is measured; METRICS say what a passing run must reach. Unknown keys,
keys in both sections, wrong types and impossible values are reported together, before any
training starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import runpy
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


class RecipeError(ValueError):
    """A recipe that cannot be run; the message lists every problem found."""


@dataclass(frozen=True)
class Definitions:
    """Every key a recipe may define, with its type and default."""

    dataset: str = "mnist"
    model: str = "mlp"
    hidden: tuple[int, ...] = (512, 512)
    epochs: int = 4
    batch_size: int = 128  # per rank under MPI, as in Horovod and DDP
    optimizer: str = "sgd"  # a name in meta.lv2.OPTIMIZERS (yours too), or lbfgs / cg
    lr: float = 0.05
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    weight_decay: float = 0.0
    grad_clip: float = 0.0  # clip gradients to this global L2 norm; 0: off
    lr_schedule: str = "constant"
    lr_decay_epochs: tuple[int, ...] = ()  # lr_schedule "step": epochs where lr is multiplied
    lr_decay_factor: float = 0.1  # ... by this factor
    warmup_epochs: int = 0  # linear learning-rate warm-up
    augmentation: tuple[str, ...] = ()  # any of crop, flip, cutout (for image datasets)
    early_stopping_patience: int = 0  # epochs without a better test loss before stopping; 0: off
    time_budget_s: float = 0.0  # stop training after this many seconds; 0: no limit
    pretrain_epochs: int = 1  # model "dbn": contrastive-divergence epochs per RBM
    pretrain_lr: float = 0.1  # model "dbn": RBM learning rate
    cd_k: int = 1  # model "dbn": Gibbs steps per CD update
    pretrain_batch_size: int = 100  # model "dbn"
    persistent_cd: bool = False  # model "dbn": persistent CD instead of CD-k
    seed: int = 0
    executor: str = "reference"
    distributed: str = "allreduce"
    average_every: int = 1  # model_averaging: steps between averages (H)
    compression: str = "none"  # of the allreduce strategy's gradient exchange
    topk_ratio: float = 0.01  # compression "topk": the fraction of gradient values sent
    servers: int = 1  # downpour: parameter-server shards (the last ranks; they do not train)
    n_fetch: int = 1  # downpour: steps between parameter fetches
    n_push: int = 1  # downpour: steps between pushes of the accrued gradients
    warm_start_steps: int = 0  # downpour: steps worker 0 trains alone before the others join
    portions: int = 8  # sandblaster: pieces each batch evaluation is cut into for the workers
    chunk_bytes: int = 4194304  # = meta.lv3.DEFAULT_CHUNK_BYTES (benchmarks/chunk_sweep.py)
    timeline: bool = False  # write the step phases as a Chrome trace to the output dir
    eval_batch_size: int = 1000
    train_samples: int = 0  # 0: the whole training set; n: its first n examples
    trainable: tuple[str, ...] = ()  # train only the parameters matching these patterns
    frozen: tuple[str, ...] = ()  # parameters (patterns, e.g. "conv1.*") that are not trained


SECOND_ORDER_OPTIMIZERS = ("lbfgs", "cg")
CHOICES: dict[str, tuple[str, ...]] = {
    "dataset": ("mnist", "fashion-mnist", "cifar10", "synthetic"),
    "model": ("mlp", "lenet", "resnet20", "vgg_small", "wide_cnn", "dbn"),
    "lr_schedule": ("constant", "step", "cosine"),
    "executor": ("reference", "native"),
    "distributed": ("allreduce", "parameter_server", "async_parameter_server", "model_averaging",
                    "ring", "async_rma", "downpour", "sandblaster"),
    "compression": ("none", "fp16", "topk", "sign"),
}
POSITIVE = ("epochs", "batch_size", "lr", "eval_batch_size", "average_every", "topk_ratio",
            "chunk_bytes", "lr_decay_factor", "pretrain_lr", "cd_k", "pretrain_batch_size",
            "servers", "n_fetch", "n_push", "portions")
NON_NEGATIVE = ("momentum", "train_samples", "weight_decay", "grad_clip", "warmup_epochs",
                "early_stopping_patience", "time_budget_s", "pretrain_epochs", "warm_start_steps")
AUGMENTATIONS = ("crop", "flip", "cutout")
METRIC_NAMES = ("test_accuracy", "test_loss", "train_accuracy", "train_loss", "train_time_s",
                "samples_per_s", "bytes_sent_per_step", "pretrain_time_s")
SECTIONS = ("FIXED", "MUTABLE", "METRICS")

_TYPES = typing.get_type_hints(Definitions)
KEYS = tuple(f.name for f in dataclasses.fields(Definitions))


@dataclass(frozen=True)
class Threshold:
    """An acceptable metric: ``value`` must be at least (or at most) ``bound``."""

    bound: float
    direction: str = "at least"

    def __post_init__(self) -> None:
        if self.direction not in ("at least", "at most"):
            raise RecipeError(f"threshold direction must be 'at least' or 'at most', "
                              f"got {self.direction!r}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)):
            raise RecipeError(f"threshold bound must be a number, got {self.bound!r}")

    def accepts(self, value: float) -> bool:
        return value >= self.bound if self.direction == "at least" else value <= self.bound

    def __str__(self) -> str:
        return f"{'>=' if self.direction == 'at least' else '<='} {self.bound:g}"


def AtLeast(bound: float) -> Threshold:  # noqa: N802 - reads as a word in recipe files
    return Threshold(bound, "at least")


def AtMost(bound: float) -> Threshold:  # noqa: N802
    return Threshold(bound, "at most")


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path | None
    fixed: Mapping[str, Any]
    mutable: Mapping[str, Any]
    metrics: Mapping[str, Threshold]
    definitions: Definitions = field(default_factory=Definitions)

    def with_overrides(self, overrides: Mapping[str, str]) -> Recipe:
        """A copy with MUTABLE keys set from ``key=value`` strings (FIXED keys are refused)."""
        errors, mutable = [], dict(self.mutable)
        for key, text in overrides.items():
            mutable_keys = ", ".join(sorted(self.mutable)) or "none"
            if key not in KEYS:
                errors.append(_unknown(key, KEYS, "key"))
            elif key not in self.mutable:
                where = "FIXED" if key in self.fixed else "not MUTABLE"
                errors.append(f"{key!r} is {where} in this recipe; only MUTABLE keys can be set "
                              f"({mutable_keys})")
            else:
                try:
                    mutable[key] = parse_value(key, text)
                except RecipeError as err:
                    errors.append(str(err))
        if errors:
            raise RecipeError(_report(self.name, errors, "--set"))
        return make_recipe(self.name, self.fixed, mutable, self.metrics, self.path)


def _unknown(key: str, known: tuple[str, ...], what: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
    return f"unknown {what} {key!r}{hint}"


def _report(name: str, errors: list[str], where: str = "") -> str:
    head = f"recipe {name!r}{' ' + where if where else ''}: {len(errors)} problem(s)"
    return "\n".join([head, *(f"  - {e}" for e in errors)])


def _check_type(key: str, value: Any) -> Any:
    """``value`` converted to the declared type of ``key``, or RecipeError."""
    expected = _TYPES[key]
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif expected is str:
        ok = isinstance(value, str)
    else:  # tuple[int, ...] or tuple[str, ...]
        item = typing.get_args(expected)[0]
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value)
        value = tuple(value) if ok else value
    if not ok:
        raise RecipeError(f"{key!r} must be {_type_name(expected)}, "
                          f"got {type(value).__name__} {value!r}")
    return value


def _type_name(expected: Any) -> str:
    if typing.get_origin(expected) is tuple:
        return f"list of {typing.get_args(expected)[0].__name__}"
    return expected.__name__


def optimizer_names() -> tuple[str, ...]:
    """Registered optimizers (including any a recipe file registered), then line-search ones."""
    from meta.lv2.optimizers import OPTIMIZERS

    return (*sorted(OPTIMIZERS), *SECOND_ORDER_OPTIMIZERS)


def _check_value(key: str, value: Any) -> None:
    choices = optimizer_names() if key == "optimizer" else CHOICES.get(key)
    if choices is not None and value not in choices:
        raise RecipeError(f"{key!r} must be one of {', '.join(choices)}, got {value!r}")
    if key == "augmentation" and set(value) - set(AUGMENTATIONS):
        raise RecipeError(f"'augmentation' may list {', '.join(AUGMENTATIONS)}, got "
                          f"{sorted(set(value) - set(AUGMENTATIONS))}")
    if key in POSITIVE and value <= 0:
        raise RecipeError(f"{key!r} must be positive, got {value!r}")
    if key in NON_NEGATIVE and value < 0:
        raise RecipeError(f"{key!r} must not be negative, got {value!r}")
    if key == "topk_ratio" and value > 1:
        raise RecipeError(f"'topk_ratio' must be at most 1, got {value!r}")
    if key == "momentum" and value >= 1:
        raise RecipeError(f"'momentum' must be below 1, got {value!r}")
    if key == "hidden" and (not value or min(value) <= 0):
        raise RecipeError(f"'hidden' must list positive layer widths, got {list(value)!r}")


def parse_value(key: str, text: str) -> Any:
    """Parse a ``--set`` value by the key's declared type."""
    expected = _TYPES[key]
    try:
        if expected is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            value: Any = lowered in ("true", "1", "yes")
        elif expected in (int, float, str):
            value = expected(text)
        else:
            item = typing.get_args(expected)[0]
            value = tuple(item(v.strip().strip("'\"")) for v in text.strip("[]() ").split(",")
                          if v.strip())
    except ValueError as err:
        raise RecipeError(f"{key!r}: cannot read {text!r} as {_type_name(expected)}") from err
    _check_value(key, value)
    return value


def make_recipe(name: str, fixed: Mapping[str, Any], mutable: Mapping[str, Any],
                metrics: Mapping[str, Any], path: Path | None = None) -> Recipe:
    """Validate the three sections into a Recipe; every problem is reported at once."""
    errors: list[str] = []
    values: dict[str, Any] = {}
    for section, items in (("FIXED", fixed), ("MUTABLE", mutable)):
        if not isinstance(items, Mapping):
            errors.append(f"{section} must be a dict, got {type(items).__name__}")
            continue
        for key, value in items.items():
            if key not in KEYS:
                errors.append(f"{section}: {_unknown(key, KEYS, 'key')}")
                continue
            try:
                values[key] = _check_type(key, value)
                _check_value(key, values[key])
            except RecipeError as err:
                errors.append(f"{section}: {err}")
    if values.get("lr_schedule") == "step" and not values.get("lr_decay_epochs"):
        errors.append("'lr_schedule' 'step' needs 'lr_decay_epochs' (the epochs where the "
                      "learning rate drops)")
    if values.get("compression", "none") != "none" and \
            values.get("distributed", "allreduce") != "allreduce":
        errors.append(f"'compression' {values['compression']!r} applies to distributed "
                      f"'allreduce' only, not {values['distributed']!r}")
    if values.get("distributed") == "sandblaster" and values.get("optimizer", "sgd") != "lbfgs":
        errors.append(f"'distributed' 'sandblaster' is distributed L-BFGS: it needs 'optimizer' "
                      f"'lbfgs', not {values.get('optimizer', 'sgd')!r}")
    if isinstance(fixed, Mapping) and isinstance(mutable, Mapping):
        for key in sorted(set(fixed) & set(mutable)):
            errors.append(f"{key!r} is in both FIXED and MUTABLE; a key is one or the other")
    if not isinstance(metrics, Mapping) or not metrics:
        errors.append("METRICS must be a non-empty dict of metric name to AtLeast(..)/AtMost(..)")
    else:
        for key, threshold in metrics.items():
            if key not in METRIC_NAMES:
                errors.append(f"METRICS: {_unknown(key, METRIC_NAMES, 'metric')}")
            elif not isinstance(threshold, Threshold):
                errors.append(f"METRICS: {key!r} must be AtLeast(x) or AtMost(x), "
                              f"got {threshold!r}")
    if errors:
        raise RecipeError(_report(name, errors))
    return Recipe(name, path, dict(fixed), dict(mutable), dict(metrics), Definitions(**values))


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and validate a recipe file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist")
    try:
        namespace = runpy.run_path(str(path))
    except RecipeError:
        raise
    except Exception as err:
        raise RecipeError(f"recipe {str(path)!r} failed to load: {type(err).__name__}: {err}") \
            from err
    name = path.stem
    errors = []
    upper = [k for k in namespace if k.isupper() and not k.startswith("_")]
    for key in upper:
        if key not in SECTIONS:
            errors.append(_unknown(key, SECTIONS, "section"))
    for section in SECTIONS:
        if section not in namespace:
            errors.append(f"missing section {section} (a recipe defines {', '.join(SECTIONS)})")
    if errors:
        raise RecipeError(_report(name, errors))
    return make_recipe(name, namespace["FIXED"], namespace["MUTABLE"], namespace["METRICS"], path)


@dataclass
class Outcome:
    """A finished run: its metrics and the verdict of each acceptable metric."""

    recipe: Recipe
    metrics: dict[str, float]
    checks: dict[str, bool]
    history: list[dict[str, Any]]
    parameters: dict[str, Any] = field(default_factory=dict)  # the trained network's

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def table(self) -> str:
        rows = [("metric", "value", "required", "")]
        for key, threshold in self.recipe.metrics.items():
            value = self.metrics.get(key)
            shown = "-" if value is None else f"{value:.4f}"
            rows.append((key, shown, str(threshold), "ok" if self.checks[key] else "FAIL"))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"{self.recipe.name}: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)


def judge(recipe: Recipe, metrics: dict[str, float], history: list,
          parameters: dict[str, Any] | None = None) -> Outcome:
    checks = {k: k in metrics and t.accepts(metrics[k]) for k, t in recipe.metrics.items()}
    return Outcome(recipe, metrics, checks, history, dict(parameters or {}))
