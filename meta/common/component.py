"""Components that declare their own options: one registry mechanism for every level.

A model builder, dataset, optimizer, executor, distributed strategy, event or metric is a
*component*: a callable registered under a name, with the options it takes declared where it is
defined, as operators declare their ``attributes``. Recipes name components and set their
options; the recipe schema is derived from these declarations (``meta.run.recipe``), so a mistyped
option, an option of another component or a value out of bounds is found before anything runs.

>>> models = Registry("example")
>>> @models.register("wide", width=Option(16, "channels of the first layer", low=1))
... def wide(width):
...     return f"a net {width} wide"
>>> models["wide"].build(width=32)
'a net 32 wide'
>>> models["wide"].check({"width": 0})
["example 'wide': option 'width' must be at least 1, got 0"]

A class declares its options in a class attribute ``options`` (``Strategy``, ``Event``,
``Metric`` subclasses do); a plain function without declarations offers the parameters that
have defaults (their type is the default's). ``context`` names what the caller passes besides
the options (a model builder gets the input shape, a strategy the optimizer): never options.
"""

from __future__ import annotations

import difflib
import inspect
import re
import textwrap
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()


class ComponentError(ValueError):
    """An unknown component, or options it does not take (the message names them)."""


@dataclass(frozen=True)
class Option:
    """One option: its default (``REQUIRED`` for none), a one-line doc, its type (from the
    default unless given: bool, int, float, str, tuple[int, ...], tuple[float, ...],
    tuple[str, ...], or ``Any``), inclusive bounds, an exclusive upper bound, or choices."""

    default: Any = REQUIRED
    doc: str = ""
    type: Any = None
    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] | None = None
    aliases: tuple[str, ...] = ()
    """Former names of the option, still read with a FutureWarning naming this one (shown to
    a recipe's user, where a DeprecationWarning is hidden outside ``__main__``): one name
    per concept across components, ``average_every``, not ``every`` in one strategy and
    ``average_every`` in another."""
    path: bool = False
    """Whether the value names input files or folders (a str, or a list of them): a recipe
    reads a relative one beside the recipe file first, then in the working directory
    (``meta.common.files.find_input``), and names every place it looked when it is in none."""

    @property
    def kind(self) -> Any:
        """The option's value type: the declared ``type``, else inferred from the default (a list
        default gives a tuple of its items' type)."""
        if self.type is not None:
            return self.type
        default = self.default
        if isinstance(default, (list, tuple)):
            items = {type(v) for v in default}
            item = items.pop() if len(items) == 1 else (float if items <= {int, float} and items
                                                         else str)
            return tuple[item, ...]  # type: ignore[valid-type]
        if default is REQUIRED or default is None:
            return Any
        return type(default)

    def type_name(self) -> str:
        """The value type in words, for ``meta components`` (``int``, ``list of float``, ``any
        value``)."""
        kind = self.kind
        if typing.get_origin(kind) is tuple:
            return f"list of {typing.get_args(kind)[0].__name__}"
        return "any value" if kind is Any else kind.__name__

    def convert(self, name: str, value: Any) -> Any:
        """``value`` checked against the type, bounds and choices; returns it normalised
        (lists become tuples, ints floats where a float is declared). Raises ComponentError."""
        kind = self.kind
        ok = True
        if kind is Any or (value is None and self.default is None):
            pass
        elif kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            numbers = (int, float) if item is float else (item,)
            ok = isinstance(value, (list, tuple)) and all(
                isinstance(v, numbers) and not isinstance(v, bool) for v in value)
            value = tuple(item(v) for v in value) if ok else value
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ComponentError(f"option {name!r} must be {self.type_name()}, got "
                                 f"{type(value).__name__} {value!r}")
        if self.choices is not None and isinstance(value, tuple):
            wrong = [v for v in value if v not in self.choices]
            if wrong:
                raise ComponentError(f"option {name!r} may list "
                                     f"{', '.join(map(str, self.choices))}, got {wrong}")
        elif self.choices is not None and value not in self.choices:
            raise ComponentError(f"option {name!r} must be one of "
                                 f"{', '.join(map(str, self.choices))}, got {value!r}")
        for item in (value if isinstance(value, tuple) else (value,)):
            if not isinstance(item, (int, float)) or isinstance(item, bool):
                continue
            if item != item:  # NaN passes no bound
                raise ComponentError(f"option {name!r} must be a number, got {item!r}")
            if self.low is not None and item < self.low:
                raise ComponentError(f"option {name!r} must be at least {self.low:g}, got {item!r}")
            if self.high is not None and item > self.high:
                raise ComponentError(f"option {name!r} must be at most {self.high:g}, got {item!r}")
            if self.above is not None and item <= self.above:
                raise ComponentError(f"option {name!r} must be above {self.above:g}, got {item!r}")
            if self.below is not None and item >= self.below:
                raise ComponentError(f"option {name!r} must be below {self.below:g}, got {item!r}")
        return value

    def parse(self, name: str, text: str) -> Any:
        """A command-line string (``--set``) read by the declared type, then checked; a value
        already typed (``Recipe.with_overrides`` called from Python) is only checked."""
        if not isinstance(text, str):
            return self.convert(name, text)
        kind = self.kind
        try:
            if kind is bool:
                lowered = text.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                value: Any = lowered in ("true", "1", "yes")
            elif kind in (int, float, str):
                value = kind(text)
            elif typing.get_origin(kind) is tuple:
                item = typing.get_args(kind)[0]
                value = tuple(item(v.strip().strip("'\"")) for v in
                              text.strip("[]() ").split(",") if v.strip())
            else:
                value = text
        except ValueError as err:
            raise ComponentError(f"option {name!r}: cannot read {text!r} as "
                                 f"{self.type_name()}") from err
        return self.convert(name, value)


class CheckedOptions(Mapping[str, Any]):
    """Options a component has checked and converted (``Component.checked``), read-only.

    Resolving them again for the same component takes them as they are: a recipe's value is
    validated once, when the recipe is read or ``--set``, however often the run then asks
    for its options (the schema, the build, the checkpoint's definitions)."""

    def __init__(self, component: Component, values: Mapping[str, Any]) -> None:
        self.component, self._values = component, dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(self._values)


def _origin(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))


@dataclass
class Component:
    """A registered callable and its declared options."""

    kind: str
    name: str
    factory: Callable[..., Any]
    options: dict[str, Option]
    doc: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # what a registry keeps beside

    def check(self, given: Mapping[str, Any]) -> list[str]:
        """Every problem with ``given`` options, one line each (empty: fine)."""
        return self.checked(given)[1]

    def checked(self, given: Mapping[str, Any]) -> tuple[CheckedOptions, list[str]]:
        """(``given`` converted, every problem with it, one line each): each value converted
        and bounded once, then the options together (``meta["validate"]``)."""
        problems, converted = [], {}
        given = self._renamed(given, problems)
        for key, value in given.items():
            if key not in self.options:
                problems.append(f"{self.label}: {unknown(key, self.options, 'option')}")
                continue
            try:
                converted[key] = self.options[key].convert(key, value)
            except ComponentError as err:
                problems.append(f"{self.label}: {err}")
        missing = [k for k, o in self.options.items() if o.default is REQUIRED and k not in given]
        problems += [f"{self.label}: option {k!r} is required ({self.options[k].doc})"
                     for k in missing]
        if not problems:
            problems += self.check_together(converted)
        return CheckedOptions(self, converted), problems

    def _renamed(self, given: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
        """``given`` with each option's former name (``Option.aliases``) read as its current
        one, with a FutureWarning; both names given is a problem."""
        former = {alias: key for key, o in self.options.items() for alias in o.aliases}
        out: dict[str, Any] = {}
        for key, value in given.items():
            if key in former and key not in self.options:
                current = former[key]
                if current in given:
                    problems.append(f"{self.label}: options {key!r} and {current!r} are one "
                                    f"option ({key!r} is its former name): give {current!r} "
                                    f"only")
                    continue
                warnings.warn(f"{self.label}: option {key!r} is now {current!r}; the old name "
                              f"will be removed", FutureWarning, stacklevel=4)
                key = current
            out[key] = value
        return out

    def check_together(self, converted: Mapping[str, Any]) -> list[str]:
        """Problems of converted options taken together (the component's ``validate``, e.g.
        one option bounded by another); empty without one."""
        validate = self.meta.get("validate")
        if validate is None:
            return []
        values = {k: o.default for k, o in self.options.items()}
        values.update(converted)
        return [f"{self.label}: {p}" for p in validate(values)]

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The full options: defaults, overridden by ``given`` (checked first, unless this
        component checked them already: ``CheckedOptions``)."""
        if not (isinstance(given, CheckedOptions) and given.component is self):
            given, problems = self.checked(given)
            if problems:
                raise ComponentError("; ".join(problems))
        values = {k: o.default for k, o in self.options.items()}
        values.update(given)
        return values

    def build(self, *context: Any, **given: Any) -> Any:
        """Call the factory with ``context`` and the resolved options."""
        return self.factory(*context, **self.resolve(given))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.factory(*args, **kwargs)

    @property
    def label(self) -> str:
        """The component as messages name it, e.g. ``optimizer 'adam'``."""
        return f"{self.kind} {self.name!r}"

    def describe(self, width: int = 100) -> str:
        """The component for ``meta components``, in plain text a terminal shows as it is:
        its whole summary (the docstring's first paragraph where ``doc`` is its first
        sentence), then one entry per option (type, default, what it does), wrapped to
        ``width`` columns; reStructuredText markup (````x````, ``:class:`X```) removed."""
        summary = plain(self.doc)
        source = getattr(self.meta.get("cls"), "__doc__", None) or \
            getattr(self.factory, "__doc__", None) or ""
        paragraph = plain(first_paragraph(inspect.cleandoc(source)))
        if summary and paragraph.startswith(summary.rstrip(".")):
            summary = paragraph
        head = f"{self.kind} {self.name}" + (f": {summary}" if summary else "")
        lines = textwrap.wrap(head, width, subsequent_indent="    ", break_on_hyphens=False)
        if self.options:
            column = min(max(len(k) for k in self.options) + 2, 26)
            for key, option in self.options.items():
                default = "required" if option.default is REQUIRED else \
                    f"default {option.default!r}"
                former = f"; formerly {', '.join(option.aliases)}" if option.aliases else ""
                lines.append(f"  {key:<{column}}{option.type_name()}, {default}{former}")
                lines += textwrap.wrap(plain(option.doc), width, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6, break_on_hyphens=False)
        return "\n".join(lines)


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain(text: str) -> str:
    """``text`` without reStructuredText markup, for a terminal: ````x```` and ```x``` as
    x, ``:class:`~a.B``` as B (``:role:`text <target>``` as text), ```text`_`` as text."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(0).find("~") > 0
                     else m.group(1), text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_?", r"\1", text)
    return text


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def declared_options(factory: Callable[..., Any], context: Iterable[str] = ()) -> dict[str, Option]:
    """A class's ``options``, or a function's parameters with defaults (not ``context``)."""
    declared = getattr(factory, "options", None)
    if isinstance(declared, Mapping):
        return dict(declared)
    skip = set(context)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: Option(p.default if p.default is not p.empty else REQUIRED)
            for p in parameters if p.name not in skip
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


REGISTRIES: dict[str, Registry] = {}


class Registry:
    """Components of one kind by name. ``common`` options are offered by every component of
    the kind (an optimizer's learning rate and schedule); ``context`` names the arguments the
    caller passes itself."""

    def __init__(self, kind: str, common: Mapping[str, Option] | None = None,
                 context: Iterable[str] = (),
                 validate: Callable[[dict[str, Any]], list[str]] | None = None) -> None:
        self.kind = kind
        self.common = dict(common or {})
        self.validate = validate  # problems with a component's options taken together
        self.context = tuple(context)
        self.entries: dict[str, Component] = {}
        REGISTRIES[kind] = self

    def add(self, name: str, factory: Callable[..., Any], options: Mapping[str, Option] | None
            = None, doc: str | None = None, inherit: bool = True, **meta: Any) -> Component:
        """Register ``factory`` as ``name``; the same definition registered again (a recipe
        loaded twice) replaces itself, another one under a taken name is refused.
        ``inherit=False``: this one does not take the kind's common options."""
        existing = self.entries.get(name)
        if existing is not None and _origin(existing.factory) != _origin(factory):
            module, qualname = _origin(existing.factory)
            raise ComponentError(f"{self.kind} {name!r} is already registered by "
                                 f"{module}.{qualname}")
        found = declared_options(factory, self.context)
        explicit = isinstance(getattr(factory, "options", None), Mapping)
        # A class's own declarations win over the kind's common options; a function's
        # inferred parameters (no doc, maybe no default) do not.
        common = self.common if inherit else {}
        declared = {**common, **found} if explicit else {**found, **common}
        declared.update(options or {})
        for former in {a for o in declared.values() for a in o.aliases}:
            declared.pop(former, None)  # a parameter kept for an option's former name
        text = doc if doc is not None else first_sentence(inspect.getdoc(factory) or "")
        if inherit and self.validate is not None:
            meta.setdefault("validate", self.validate)
        component = Component(self.kind, name, factory, declared, text, dict(meta))
        self.entries[name] = component
        return component

    def register(self, name: str | None = None, **options: Option) -> Callable[[Any], Any]:
        """Decorator: ``@registry.register("name", option=Option(...))``."""

        def decorate(factory: Any) -> Any:
            self.add(name or getattr(factory, "name", "") or factory.__name__, factory, options)
            return factory

        return decorate

    def from_object(self, obj: Any) -> Component:
        """A class or function given directly in a recipe, registered under its own name."""
        name = getattr(obj, "name", "") or getattr(obj, "__name__", "")
        if not name or not callable(obj):
            raise ComponentError(f"a {self.kind} must be a name or a class/function, got {obj!r}")
        return self.add(name, obj)

    def __getitem__(self, name: str) -> Component:
        if name not in self.entries:
            raise ComponentError(unknown(name, self.entries, self.kind))
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __delitem__(self, name: str) -> None:
        del self.entries[name]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self.entries)


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, on one line (its first paragraph up to a full stop that
    ends a sentence: not the one of "et al.", "e.g.", "i.e." or "cf.", where "ResNet-20 (He
    et al." was cut)."""
    paragraph = first_paragraph(doc)
    match = _SENTENCE.match(paragraph)
    return match.group(1) if match else paragraph


_SENTENCE = re.compile(r"(.+?(?<! al)(?<!e\.g)(?<!i\.e)(?<! cf)(?<! vs)\.)(\s|$)")


def unknown(key: str, known: Iterable[str], what: str) -> str:
    """``unknown option 'lrr' (did you mean 'lr'?)``: the message for a name not found."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else \
        f" (known: {', '.join(known) or 'none'})"
    return f"unknown {what} {key!r}{hint}"
