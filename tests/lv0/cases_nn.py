"""Test cases for the nn operators (see cases.py for the format)."""

from __future__ import annotations

from typing import Callable

import numpy as np

CASES: dict[str, Callable[[np.random.Generator], list]] = {}
