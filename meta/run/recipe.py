"""Recipes: fixed definitions, mutable definitions and acceptable metrics, validated up front.

A recipe is a plain Python file with three dicts. A definition names a component of a level
(``model``, ``dataset``, ``optimizer``, ``executor``, ``distributed``, ``events``), built in or
the user's, and sets its options; a few keys belong to the run itself (``epochs``,
``batch_size``, ``seed``, ``eval_batch_size``, ``timeline``, ``ema_decay``, ``log_every``,
``tensorboard``, ``memory_limit_gb``)::

    from meta.run.recipe import AtLeast, AtMost

    FIXED = {"dataset": "mnist", "model": {"name": "mlp", "hidden": [512, 512]}}
    MUTABLE = {"epochs": 4, "batch_size": 128, "lr": 0.05, "momentum": 0.9, "seed": 0}
    METRICS = {"test_accuracy": AtLeast(0.975), "test_loss": AtMost(0.1)}

An option is written inside its component's dict, dotted (``"optimizer.lr"``) or, where one
chosen component declares it, plainly (``"lr"``). The schema is the components' own
declarations (``meta.common.component``): an unknown component, an unknown or mistyped option, an
option of a component the recipe did not choose, a value out of bounds and a key in both FIXED
and MUTABLE are all reported at once, naming the key and the nearest valid name, before any
data is loaded. ``--set KEY=VALUE`` changes MUTABLE definitions, dotted keys included.
"""

from __future__ import annotations

import difflib
import os
import runpy
import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from meta.common.component import (
    REGISTRIES,
    CheckedOptions,
    Component,
    ComponentError,
    Option,
    Registry,
    unknown,
)
from meta.common.files import MissingInput, find_input


class RecipeError(ValueError):
    """A recipe that cannot be run; the message lists every problem found."""


RUN_OPTIONS: dict[str, Option] = {
    "epochs": Option(4, "passes over the training data", low=1),
    "batch_size": Option(128, "examples per step (per rank under MPI, as in Horovod and DDP)",
                         low=1),
    "seed": Option(0, "seeds the weights, the sampler and the augmentation"),
    "eval_batch_size": Option(1000, "examples per evaluation batch", low=1),
    "timeline": Option(False, "write the step phases as a Chrome trace to the output dir"),
    "ema_decay": Option(0.0, "evaluate and export an exponential moving average of the weights "
                             "with this decay per optimizer step, e.g. 0.999 (0: off)", low=0.0,
                        below=1.0),
    "log_every": Option(0, "a step line (loss, steps/s) every this many steps (0: per epoch "
                           "only); also how often TensorBoard gets the step loss", low=0),
    "tensorboard": Option(False, "write a TensorBoard event file to the output folder's "
                                 "tensorboard/ (the optional 'tensorboard' extra)"),
    "memory_limit_gb": Option(0.0, "refuse the run before training when a rank's model state "
                                   "(parameters, gradients, optimizer state, buffers: meta "
                                   "plan's memory model) exceeds this many GB (2^30 bytes; "
                                   "0: no limit)", low=0.0),
}
# The component kinds a recipe chooses, each with its default; "events" lists any number.
DEFAULTS = {"model": "mlp", "dataset": "mnist", "optimizer": "sgd", "executor": "reference",
            "distributed": "allreduce"}
LISTS = {"events": "event"}
SECTIONS = ("FIXED", "MUTABLE", "METRICS")
# Shown in the table of every run, bounded or not: wall-clock time is reported, and a recipe
# that checks correctness leaves it unbounded (a busy machine must not FAIL a right answer).
REPORTED = ("train_time_s", "eval_time_s")
RUN_METRICS = ("test_accuracy", "test_loss", "train_accuracy", "train_loss", "train_time_s",
               "eval_time_s", "samples_per_s", "bytes_sent_per_step", "pretrain_time_s")


def parse_sets(pairs: Sequence[str], flag: str = "--set") -> dict[str, str]:
    """``KEY=VALUE`` pairs of ``flag`` (``--set``, ``--variant``, ``--attr``) as a dict: the
    recipe's overrides as the command line gives them (``Recipe.with_overrides`` validates
    them). A pair without ``=`` or a key is a ValueError naming the flag (the commands word it
    in one line, exit status 2)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def registry(kind: str) -> Registry:
    """The registry of a component kind; importing the levels fills them."""
    import meta.lv1
    import meta.lv2
    import meta.lv3  # noqa: F401  (registers the strategies)

    return REGISTRIES[kind]


@dataclass(frozen=True)
class Threshold:
    """An acceptable metric: ``value`` must be at least (or at most) ``bound``; ``options``
    configure a metric component (``AtLeast(0.9, k=5)`` for top-5 accuracy)."""

    bound: float
    direction: str = "at least"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.direction not in ("at least", "at most"):
            raise RecipeError(f"threshold direction must be 'at least' or 'at most', "
                              f"got {self.direction!r}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)):
            raise RecipeError(f"threshold bound must be a number, got {self.bound!r}")

    def accepts(self, value: float) -> bool:
        """Whether a metric's ``value`` meets the bound."""
        return value >= self.bound if self.direction == "at least" else value <= self.bound

    def __str__(self) -> str:
        return f"{'>=' if self.direction == 'at least' else '<='} {self.bound:g}"


def AtLeast(bound: float, **options: Any) -> Threshold:  # noqa: N802 - reads as a word
    """A bound a metric must reach: ``METRICS = {"test_accuracy": AtLeast(0.97)}``.

        >>> AtLeast(0.97).accepts(0.98)
        True
    """
    return Threshold(bound, "at least", options)


def AtMost(bound: float, **options: Any) -> Threshold:  # noqa: N802
    """A bound a metric must not exceed: ``METRICS = {"test_loss": AtMost(0.1)}``.

        >>> AtMost(0.1).accepts(0.2)
        False
    """
    return Threshold(bound, "at most", options)


@dataclass(frozen=True)
class Choice:
    """A chosen component and the options the recipe gave it (defaults come from it)."""

    component: Component
    options: dict[str, Any]

    @property
    def name(self) -> str:
        """The chosen component's registered name."""
        return self.component.name

    def values(self) -> dict[str, Any]:
        """The component's options with the recipe's values filled in over the defaults
        (checked when the recipe was read: not again)."""
        return self.component.resolve(self.options)

    def build(self, *context: Any) -> Any:
        """The component built with ``context`` and the recipe's options."""
        return self.component.factory(*context, **self.values())


@dataclass(frozen=True)
class Definitions:
    """What a validated recipe defines: the run's own options and the chosen components."""

    run: dict[str, Any]
    choices: dict[str, Choice]
    events: list[Choice]

    def __getattr__(self, key: str) -> Any:  # d.epochs, d.seed
        run = self.__dict__.get("run", {})
        if key in run:
            return run[key]
        raise AttributeError(key)

    def as_dict(self) -> dict[str, Any]:
        """Every definition, defaults included, as flat JSON-able keys (``optimizer.lr``)."""
        out: dict[str, Any] = dict(self.run)
        for kind, choice in self.choices.items():
            out[kind] = choice.name
            out.update({f"{kind}.{k}": v for k, v in choice.values().items()})
        out["events"] = [{"name": e.name, **e.values()} for e in self.events]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path | None
    fixed: Mapping[str, Any]
    mutable: Mapping[str, Any]
    metrics: Mapping[str, Threshold]
    definitions: Definitions
    # Where each key belongs, read from the components the recipe chose: built once, when
    # the recipe is read, and reused by ``with_overrides`` while the choices stay the same.
    schema: _Schema | None = field(default=None, compare=False, repr=False)

    def with_overrides(self, overrides: Mapping[str, str]) -> Recipe:
        """A copy with MUTABLE definitions set from ``key=value`` strings (``lr=0.1``,
        ``optimizer.lr=0.1``, ``distributed=downpour``); FIXED ones are refused. Each value is
        parsed and validated once, here; the recipe's schema is reused unless a component
        is chosen anew (its options are then other ones)."""
        errors, mutable = [], dict(self.mutable)
        schema = self.schema or _Schema(self.fixed, self.mutable)
        fixed = {schema.canonical(k)[0] for k in self.fixed}

        def refuse(key: str, canonical: str) -> None:
            where = "FIXED" if canonical in fixed or canonical.partition(".")[0] in self.fixed \
                else "not MUTABLE"
            errors.append(f"{key!r} is {where} in this recipe; only MUTABLE keys can be set "
                          f"({', '.join(sorted(self.mutable)) or 'none'})")

        # Components first (one named anew starts from its own defaults), then the options,
        # read against the components as they are now.
        for key, text in overrides.items():
            if key in DEFAULTS:
                if key in self.mutable:
                    mutable[key] = text
                else:
                    refuse(key, key)
        chosen_anew = any(mutable.get(k) is not self.mutable.get(k) for k in DEFAULTS)
        if chosen_anew:
            schema = _Schema(self.fixed, mutable)
        read = dict(mutable)  # the sections as the schema read them
        written = {schema.canonical(k)[0]: k for k in mutable}
        parsed: dict[str, Any] = {}  # canonical key -> its value, parsed and validated
        for key, text in overrides.items():
            if key in DEFAULTS:
                continue
            canonical, option, problem = schema.canonical(key)
            kind, _, name = canonical.partition(".")
            inside = canonical not in written and kind in (*DEFAULTS, *LISTS) and kind in mutable
            if problem or (canonical not in written and not inside):
                errors.append(problem) if problem else refuse(key, canonical)
                continue
            try:
                value = option.parse(key, text) if option else text
            except ComponentError as err:
                errors.append(str(err))
                continue
            parsed[canonical] = value
            if inside and kind in LISTS:  # ``events.<name>.<option>``: inside that event
                event, _, name = name.partition(".")
                mutable[kind] = [{**(e if isinstance(e, Mapping) else {"name": e}), name: value}
                                 if (e.get("name") if isinstance(e, Mapping) else e) == event
                                 else e for e in mutable[kind]]
            elif inside:  # an option of a MUTABLE component: set inside its definition
                spec = mutable[kind]
                mutable[kind] = {**(spec if isinstance(spec, Mapping) else {"name": spec}),
                                 name: value}
            else:
                mutable[written[canonical]] = value
        if errors:
            raise RecipeError(_report(self.name, errors, "--set"))
        if any(k in LISTS for k in parsed):  # another list of events: read anew
            chosen_anew, schema = True, _Schema(self.fixed, mutable)
        if chosen_anew:  # other components: every definition read again, against them (with
            # the schema just read, unless an option was then written inside a component's dict)
            rewritten = any(mutable[k] is not read.get(k) for k in mutable
                            if k in LISTS or k in DEFAULTS)
            return make_recipe(self.name, self.fixed, mutable, self.metrics, self.path,
                               None if rewritten else schema)
        return replace(self, mutable=mutable,
                       definitions=self._set(parsed))

    def _set(self, parsed: Mapping[str, Any]) -> Definitions:
        """The definitions with ``parsed`` values (canonical keys, already validated one by
        one) set; the components they change checked together again (``validate``)."""
        d = self.definitions
        run, choices, events = dict(d.run), dict(d.choices), list(d.events)
        for canonical, value in parsed.items():
            kind, dot, rest = canonical.partition(".")
            if not dot:
                run[canonical] = value
            elif kind in LISTS:
                event, _, name = rest.partition(".")
                events = [Choice(e.component, CheckedOptions(e.component,
                                                             {**e.options, name: value}))
                          if e.name == event else e for e in events]
            else:
                c = choices[kind]
                choices[kind] = Choice(c.component, CheckedOptions(c.component,
                                                                   {**c.options, rest: value}))
        errors = [p for c in [*choices.values(), *events]
                  if c not in d.choices.values() and c not in d.events
                  for p in c.component.check_together(c.options)]
        choices, events, errors = _found(self.path, choices, events, errors)
        if errors:
            raise RecipeError(_report(self.name, errors, "--set"))
        return Definitions(run, choices, events)


class _Schema:
    """Reads the two definition sections: which component each kind is, and where each key
    belongs (``canonical``); problems are collected in ``errors``."""

    def __init__(self, fixed: Mapping[str, Any], mutable: Mapping[str, Any]) -> None:
        self.errors: list[str] = []
        self.choices: dict[str, Choice] = {}
        self.nested: dict[str, dict[str, Any]] = {}  # options written inside a component dict
        self.events: list[Choice] = []
        merged = {**fixed, **mutable}
        for kind, default in DEFAULTS.items():
            spec = merged.get(kind, default)
            component, options = self._component(kind, registry(REGISTRY_OF.get(kind, kind)),
                                                 spec)
            if component is not None:
                self.choices[kind] = Choice(component, {})
                self.nested[kind] = options
        events = merged.get("events", ())
        if not isinstance(events, (list, tuple)):
            self.errors.append(f"'events' must be a list of event names, dicts or classes, "
                               f"got {type(events).__name__}")
            events = ()
        for spec in events:
            component, options = self._component("events", registry("event"), spec)
            if component is not None:
                self.events.append(Choice(component, options))

    def _component(self, kind: str, reg: Registry, spec: Any) -> tuple[Component | None, dict]:
        options: dict[str, Any] = {}
        if isinstance(spec, Mapping):
            options = {k: v for k, v in spec.items() if k != "name"}
            spec = spec.get("name")
            if spec is None:
                self.errors.append(f"{kind!r}: a component dict needs a 'name'")
                return None, {}
        try:
            component = reg[spec] if isinstance(spec, str) else reg.from_object(spec)
        except ComponentError as err:
            self.errors.append(f"{kind!r}: {err}")
            return None, {}
        return component, options

    def canonical(self, key: str) -> tuple[str, Option | None, str]:
        """(canonical key, its Option or None for a component choice, problem or "")."""
        if key in RUN_OPTIONS:
            return key, RUN_OPTIONS[key], ""
        if key in DEFAULTS or key in LISTS:
            return key, None, ""
        kind, dot, option = key.partition(".")
        if dot and kind in self.choices:
            component = self.choices[kind].component
            if option in component.options:
                return key, component.options[option], ""
            renamed = self._renamed(option, [kind])
            if renamed is not None:
                return renamed
            return key, None, f"{key!r}: {component.label} has no such option " \
                f"({unknown(option, component.options, 'option')})"
        if dot and kind in LISTS:
            name, _, option = option.partition(".")
            for event in self.events:
                if event.name == name and option in event.component.options:
                    return key, event.component.options[option], ""
            return key, None, f"{key!r}: no chosen event {name!r} with option {option!r}"
        if dot:
            return key, None, unknown(kind, [*DEFAULTS, *LISTS], "component kind")
        owners = [kind for kind, c in self.choices.items() if key in c.component.options]
        if len(owners) == 1:
            kind = owners[0]
            return f"{kind}.{key}", self.choices[kind].component.options[key], ""
        if len(owners) > 1:
            spelled = " or ".join(f"'{k}.{key}'" for k in owners)
            return key, None, f"{key!r} is an option of several chosen components: write {spelled}"
        renamed = self._renamed(key, list(self.choices))
        if renamed is not None:
            return renamed
        return key, None, self._misplaced(key)

    def _renamed(self, key: str, kinds: list[str]) -> tuple[str, Option, str] | None:
        """Where ``key`` is the former name of one chosen component's option
        (``Option.aliases``): its canonical key and Option, with a FutureWarning."""
        found = [(kind, name, o) for kind in kinds
                 for name, o in self.choices[kind].component.options.items() if key in o.aliases]
        if len(found) != 1:
            return None
        kind, name, option = found[0]
        warnings.warn(f"{self.choices[kind].component.label}: option {key!r} is now {name!r}; "
                      f"the old name will be removed", FutureWarning, stacklevel=4)
        return f"{kind}.{name}", option, ""

    def _misplaced(self, key: str) -> str:
        """The message for a key no chosen component takes: another component's option, or
        unknown (with the nearest valid key)."""
        for kind in DEFAULTS:
            holders = [c.name for c in registry(REGISTRY_OF.get(kind, kind)).entries.values()
                       if key in c.options]
            if holders:
                chosen = self.choices.get(kind)
                return (f"{key!r} is an option of {kind} {', '.join(map(repr, holders[:4]))}, "
                        f"not of the chosen {kind} {chosen.name if chosen else '?'!r}")
        valid = [*RUN_OPTIONS, *DEFAULTS, *LISTS,
                 *(o for c in self.choices.values() for o in c.component.options)]
        return unknown(key, valid, "key")


REGISTRY_OF = {"distributed": "strategy"}


def _report(name: str, errors: list[str], where: str = "") -> str:
    """One line for one problem; a head line and one line each for several."""
    head = f"recipe {name!r}{' ' + where if where else ''}"
    if len(errors) == 1:
        return f"{head}: {errors[0]}"
    return "\n".join([f"{head}: {len(errors)} problem(s)", *(f"  - {e}" for e in errors)])


def make_recipe(name: str, fixed: Mapping[str, Any], mutable: Mapping[str, Any],
                metrics: Mapping[str, Any], path: Path | None = None,
                schema: _Schema | None = None) -> Recipe:
    """Validate the three sections into a Recipe; every problem is reported at once.
    ``schema``: the one ``with_overrides`` just read these sections with (else built here)."""
    errors: list[str] = []
    sections = {"FIXED": fixed, "MUTABLE": mutable}
    for section, items in sections.items():
        if not isinstance(items, Mapping):
            errors.append(f"{section} must be a dict, got {type(items).__name__}")
    if errors:
        raise RecipeError(_report(name, errors))
    schema = schema or _Schema(fixed, mutable)
    errors += schema.errors
    run = {k: o.default for k, o in RUN_OPTIONS.items()}
    options: dict[str, dict[str, Any]] = {kind: dict(o) for kind, o in schema.nested.items()}
    seen: dict[str, str] = {}
    for section, items in sections.items():
        for key, value in items.items():
            canonical, option, problem = schema.canonical(key)
            if problem:
                errors.append(f"{section}: {problem}")
                continue
            if canonical in seen:
                errors.append(f"{key!r} is in both FIXED and MUTABLE; a key is one or the other"
                              if seen[canonical] != section else
                              f"{section}: {key!r} is given twice")
                continue
            seen[canonical] = section
            if option is None:
                continue  # a component choice, read by the schema
            try:
                value = option.convert(key, value)
            except ComponentError as err:
                errors.append(f"{section}: {err}")
                continue
            kind, dot, rest = canonical.partition(".")
            if not dot:
                run[canonical] = value
            elif kind in LISTS:
                event, _, opt = rest.partition(".")
                next(e for e in schema.events if e.name == event).options[opt] = value
            else:
                options.setdefault(kind, {})[rest] = value
    choices, events = {}, []
    for kind, c in schema.choices.items():  # converted and checked once, kept so
        checked, problems = c.component.checked(options.get(kind, {}))
        choices[kind], errors = Choice(c.component, checked), errors + problems
    for e in schema.events:
        checked, problems = e.component.checked(e.options)
        events.append(Choice(e.component, checked))
        errors += problems
    choices, events, errors = _found(path, choices, events, errors)
    for kind, choice in choices.items():
        for other, allowed in choice.component.meta.get("requires", {}).items():
            if other in choices and choices[other].name not in allowed:
                errors.append(f"{kind} {choice.name!r} needs {other} "
                              f"{' or '.join(map(repr, allowed))}, not {choices[other].name!r}")
    errors += _metric_problems(metrics)
    if errors:
        raise RecipeError(_report(name, errors))
    return Recipe(name, path, dict(fixed), dict(mutable), dict(metrics),
                  Definitions(run, choices, events), schema)


def _found(recipe: Path | None, choices: dict[str, Choice], events: list[Choice],
           errors: list[str]) -> tuple[dict[str, Choice], list[Choice], list[str]]:
    """The choices with their input paths (options declared ``path=True``) found beside the
    ``recipe`` file first, then in the working directory (``find_input``); a path in neither
    adds an error naming each place looked at."""
    folders = ([(recipe.resolve().parent, "beside the recipe")] if recipe else []) + \
        [(Path.cwd(), "in the working directory")]
    errors = list(errors)

    def found(c: Choice) -> Choice:
        values = dict(c.options)
        for key, option in c.component.options.items():
            if not option.path or not values.get(key):
                continue
            given = values[key]
            paths = []
            for item in given if isinstance(given, tuple) else (given,):
                try:
                    paths.append(str(find_input(item, folders)))
                except MissingInput as err:
                    errors.append(f"{c.component.label}: option {key!r}: {err}")
                    paths.append(item)
            values[key] = tuple(paths) if isinstance(given, tuple) else paths[0]
        if values == dict(c.options):
            return c
        return Choice(c.component, CheckedOptions(c.component, values))

    return ({k: found(c) for k, c in choices.items()}, [found(e) for e in events], errors)


def _metric_problems(metrics: Any) -> list[str]:
    if not isinstance(metrics, Mapping) or not metrics:
        return ["METRICS must be a non-empty dict of metric name to AtLeast(..)/AtMost(..)"]
    problems = []
    measured = registry("metric")
    for key, threshold in metrics.items():
        if not isinstance(threshold, Threshold):
            problems.append(f"METRICS: {key!r} must be AtLeast(x) or AtMost(x), got "
                            f"{threshold!r}")
        elif key in measured:
            problems += [f"METRICS: {p}" for p in measured[key].check(threshold.options)]
        elif key not in RUN_METRICS:
            problems.append(f"METRICS: {unknown(key, [*RUN_METRICS, *measured], 'metric')}")
        elif threshold.options:
            problems.append(f"METRICS: {key!r} takes no options, got {dict(threshold.options)}")
    return problems


SHIPPED = Path(__file__).parents[1] / "recipes"  # the repository's recipes/, installed with meta


def shipped_recipes() -> dict[str, Path]:
    """The recipes that come with meta, by name: ``meta run mnist_mlp`` from any folder."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.py"))}


def find_recipe(text: str | os.PathLike) -> Path:
    """The recipe file ``text`` names: a path as given, else a bare name (``mnist_mlp`` or
    ``mnist_mlp.py``) of a shipped recipe. A file of that name in the current folder wins, as
    a script's path does."""
    path = Path(text)
    if path.is_dir():
        raise RecipeError(f"recipe {str(path)!r} is a directory; give a recipe file in it "
                          f"(e.g. {str(path / 'mnist_mlp.py')!r})")
    if path.is_file():
        return path
    shipped = shipped_recipes()
    name = path.stem if path.suffix == ".py" else path.name
    if path.parent != Path():
        raise RecipeError(f"recipe file {str(path)!r} does not exist")
    if name not in shipped:
        raise RecipeError(f"{unknown(name, shipped, 'recipe')}: no file {str(path)!r} here and "
                          f"no shipped recipe of that name (`meta recipes` lists them)")
    return shipped[name]


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and validate a recipe file (which may register its own components first); a bare
    name is a shipped recipe (``find_recipe``)."""
    path = find_recipe(path)
    not_a_recipe = f"recipe {str(path)!r} is not a recipe: a recipe is a Python file " \
        f"defining {', '.join(SECTIONS)}"
    if path.suffix != ".py":
        raise RecipeError(f"{not_a_recipe} (this file is not .py)")
    try:
        if b"\0" in path.read_bytes():
            raise RecipeError(f"{not_a_recipe} (this file holds binary data)")
    except OSError as err:
        raise RecipeError(f"recipe file {str(path)!r} cannot be read ({err})") from err
    folder = str(path.resolve().parent)  # the recipe may import its neighbours, as a script can
    sys.path.insert(0, folder)
    try:
        namespace = runpy.run_path(str(path))
    except (RecipeError, ComponentError):
        raise
    except SystemExit as err:  # sys.exit() on import would end meta with its status
        raise RecipeError(f"recipe {str(path)!r} called sys.exit({err.code!r}) while loading; "
                          f"a recipe only defines {', '.join(SECTIONS)}") from err
    except Exception as err:
        raise RecipeError(f"recipe {str(path)!r} failed to load: {type(err).__name__}: "
                          f"{' '.join(str(err).split())}") from err
    finally:
        sys.path.remove(folder)
    name = path.stem
    errors = []
    # Only FIXED, MUTABLE and METRICS are sections: a recipe's other names, constants in
    # capitals and imported registries (MODELS) included, are its own. A name close to a
    # section the recipe lacks is taken for a misspelling of it.
    missing = [s for s in SECTIONS if s not in namespace]
    for key in namespace:
        if key.isupper() and not key.startswith("_") and difflib.get_close_matches(key, missing):
            errors.append(unknown(key, missing, "section"))
    for section in missing:
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
        """Whether every metric met its bound."""
        return all(self.checks.values())

    def table(self) -> str:
        """The metrics against their bounds as the text table ``meta run`` prints."""
        rows = [("metric", "value", "required", "")]
        for key, threshold in self.recipe.metrics.items():
            value = self.metrics.get(key)
            shown = "-" if value is None else f"{value:.4f}"
            rows.append((key, shown, str(threshold), "ok" if self.checks[key] else "FAIL"))
        for key in REPORTED:  # measured on every run; a bound on it is the recipe's choice
            if key not in self.recipe.metrics and key in self.metrics:
                rows.append((key, f"{self.metrics[key]:.4f}", "(none)", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"{self.recipe.name}: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)


def judge(recipe: Recipe, metrics: dict[str, float], history: list,
          parameters: dict[str, Any] | None = None) -> Outcome:
    """The outcome of a run: each of the recipe's ``METRICS`` checked against the measured
    ``metrics``."""
    checks = {k: k in metrics and t.accepts(metrics[k]) for k, t in recipe.metrics.items()}
    return Outcome(recipe, metrics, checks, history, dict(parameters or {}))
