"""Level 0: operators, their registry, gradient checking and native kernels."""

from meta.lv0 import native
from meta.lv0.broadcast import unbroadcast
from meta.lv0.gradcheck import GradCheckReport, check_gradients
from meta.lv0.operator import BackwardError, Context, InferenceContext, Operator, check_backward
from meta.lv0.registry import (
    UnknownOperatorError,
    entries,
    load_library,
    lookup,
    register,
    unregister,
)
from meta.lv0.validate import ValidationReport, validate_operator

__all__ = [
    "BackwardError",
    "Context",
    "GradCheckReport",
    "InferenceContext",
    "Operator",
    "UnknownOperatorError",
    "check_backward",
    "check_gradients",
    "entries",
    "load_library",
    "lookup",
    "native",
    "register",
    "unbroadcast",
    "unregister",
    "validate_operator",
    "ValidationReport",
]
