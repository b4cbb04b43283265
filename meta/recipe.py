"""The public path of recipes: ``from meta.recipe import AtLeast, AtMost``.

Recipe files, the docs and users import this path; the module itself lives in
``meta.run.recipe`` (where a recipe becomes a run). This name is that same module object, so
its classes, registries and errors are one, and it stays (no deprecation).
"""

import sys

from meta.run import recipe as _home

sys.modules[__name__] = _home
