"""Build meta's API reference from its docstrings with pdoc, failing on any warning.

Usage: ``python tools/build_api_docs.py [OUTPUT_DIR]`` (default: a temporary folder, removed
afterwards: it only checks that it builds). The documentation site builds the same pages into
itself under ``api/`` (``tools/mkdocs_hooks.py`` calls ``build``; CI runs ``mkdocs build
--strict``, where each warning returned here is a build warning). pdoc reports what it cannot render (a module that
fails to import, a broken cross-reference, a signature it cannot read) as Python warnings and
still writes the pages; here every such warning is printed and the exit status is 1, so a
docstring that stops rendering fails CI as a test would.

The public API is what ``meta`` and its levels re-export (``__all__``); pdoc documents exactly
that for each module that defines ``__all__``, and walks the submodules below it.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

PACKAGE = "meta"
# Left out: the PyTorch executor's op table imports torch at its top (the rest of meta never
# does); its public face is ``meta.lv1.TorchExecutor``, documented.
EXCLUDED = {"meta.lv1.torch_ops"}
# pdoc evaluates the annotations of a NamedTuple's generated ``__init__`` in the wrong
# namespace (its own, not the module's) and warns that a name imported there is undefined;
# the annotations are fine (the module imports the names). These, and only these, are not
# failures.
PDOC_FALSE_ALARMS = ("Error parsing type annotation", "GradientTransformation.__init__",
                     "Evaluation.__init__")


def public_modules(package: str = PACKAGE) -> list[str]:
    """Every module of ``package`` without a private (underscored) part in its name, the
    package first. pdoc would stop at ``meta``'s ``__all__``; the reference covers each
    level, its modules and the operator library (``meta.ops``). Modules kept under their old
    names after a move are aliases, not files, so the walk does not meet them."""
    import importlib
    import pkgutil

    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name not in EXCLUDED and \
                not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _specs(names: list[str]) -> list[str]:
    """``names`` less those pdoc reaches by walking an earlier one (it walks a package's
    submodules unless its ``__all__`` stops it; naming one twice is a warning), then the
    exclusions as pdoc's ``!`` patterns."""
    import pkgutil

    from pdoc.extract import walk_packages2

    covered: set[str] = set()
    specs = []
    for name in names:
        if name in covered:
            continue
        specs.append(name)
        info = pkgutil.ModuleInfo(None, name, ispkg=True)  # type: ignore[arg-type]
        covered.update(m.name for m in walk_packages2([info]))
    return [*specs, *(f"!{name.replace('.', '[.]')}$" for name in sorted(EXCLUDED))]


def _false_alarm(message: str) -> bool:
    return message.startswith(PDOC_FALSE_ALARMS[0]) and \
        any(f"{where} " in message or message.endswith(where) or f"{where}." in message
            for where in PDOC_FALSE_ALARMS[1:])


def build(output: Path) -> list[str]:
    """Write the HTML reference into ``output``; return the warnings pdoc raised (empty when
    the reference is clean)."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="restructuredtext", show_source=False,
                          search=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*_specs(public_modules()), output_directory=output)
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if not _false_alarm(str(w.message))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        import pdoc  # noqa: F401
    except ImportError:
        print("build_api_docs: pdoc is not installed (pip install -e '.[docs]')",
              file=sys.stderr)
        return 2
    if argv:
        found = build(Path(argv[0]))
        where = argv[0]
    else:
        with tempfile.TemporaryDirectory(prefix="meta-api-") as tmp:
            found = build(Path(tmp))
            pages = sum(1 for _ in Path(tmp).rglob("*.html"))
        where = f"a temporary folder ({pages} pages)"
    for line in found:
        print(f"build_api_docs: warning: {line}", file=sys.stderr)
    if found:
        print(f"build_api_docs: {len(found)} warning(s): FAIL", file=sys.stderr)
        return 1
    print(f"build_api_docs: built the API reference in {where} without warnings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
