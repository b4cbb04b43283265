"""meta's operator library: one ONNX operator per file, registered on import.

Every public module of this package is imported here, so adding ``ops/<snake_name>.py`` with a
``@register``-ed class is all it takes to add an operator. Modules starting with ``_`` hold
shared helpers (index maths, padding) and are imported by the operators that use them.
"""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_module}")
