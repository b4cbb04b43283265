"""MkDocs hooks of the documentation site (``mkdocs.yml``): the API reference as pages of it.

The reference is pdoc's HTML, built from the docstrings by ``tools/build_api_docs.py`` (why pdoc
and not a second docstring renderer: the docs extra in ``pyproject.toml`` and the guide's
Dependencies page). Here it is built into a temporary folder before MkDocs collects the site's
files and added to them under ``api/``, so the guide's links to ``api/meta.html`` are checked
as any other link, and every warning pdoc raises is logged as a MkDocs warning: under
``mkdocs build --strict`` (CI) a docstring that stops rendering fails the build.

``META_DOCS_NO_API=1`` leaves the reference out (a quicker ``mkdocs serve`` while writing the
guide); the links to it then warn, so a strict build refuses that setting's output.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.plugins.meta_api")
TOOLS = Path(__file__).resolve().parent
_BUILT: list[Path] = []


def on_files(files, config):
    """Add pdoc's pages (built now, once per build) to the site's files, under ``api/``."""
    if os.environ.get("META_DOCS_NO_API") == "1":
        log.warning("META_DOCS_NO_API=1: the API reference is left out of this build")
        return files
    sys.path.insert(0, str(TOOLS))
    try:
        import build_api_docs
    finally:
        sys.path.remove(str(TOOLS))
    root = Path(tempfile.mkdtemp(prefix="meta-site-api-"))
    _BUILT.append(root)
    for line in build_api_docs.build(root / "api"):
        log.warning("API reference (pdoc): %s", line)
    for path in sorted((root / "api").rglob("*")):
        if path.is_file():
            files.append(File(path.relative_to(root).as_posix(), str(root), config["site_dir"],
                              config["use_directory_urls"]))
    return files


def on_post_build(config):
    """Remove the temporary folders pdoc wrote into (their pages are copied into the site)."""
    while _BUILT:
        shutil.rmtree(_BUILT.pop(), ignore_errors=True)
