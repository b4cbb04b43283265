"""Second-order and conjugate-direction optimizers for full-batch or large-batch training.

L-BFGS (two-loop recursion over the last ``history`` pairs, Nocedal & Wright Alg. 7.4) and
nonlinear conjugate gradients (Fletcher-Reeves, Hestenes-Stiefel, Polak-Ribiere+; seed 003),
both with a strong-Wolfe line search (Nocedal & Wright Alg. 3.5/3.6). They need the loss at
several points per step, so ``step`` takes a closure that evaluates loss and gradients at the
current parameters (as PyTorch's L-BFGS does); the trainer passes one when
``optimizer.needs_closure`` is true. ``evaluations`` counts closure calls.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Protocol

import numpy as np

from meta.common.component import Option
from meta.lv2.optimizers import OPTIMIZERS, Params

Closure = Callable[[], tuple[float, Params]]


class _Flat:
    """Moves between the parameter dict (updated in place) and one float64 vector."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.names = list(params)
        self.sizes = [params[k].size for k in self.names]

    def get(self, arrays: Params) -> np.ndarray:
        return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in self.names])

    def set(self, vector: np.ndarray) -> None:
        offset = 0
        for name, size in zip(self.names, self.sizes):
            p = self.params[name]
            p[...] = vector[offset : offset + size].reshape(p.shape)
            offset += size


def _cubic_minimizer(a: float, fa: float, da: float, b: float, fb: float, db: float) -> float:
    """Minimizer of the cubic through (a, fa, da) and (b, fb, db), kept inside [a, b] safely."""
    if a == b:
        return a
    d1 = da + db - 3 * (fa - fb) / (a - b)
    square = d1 * d1 - da * db
    lo, hi = min(a, b), max(a, b)
    if square >= 0:
        d2 = np.sign(b - a) * np.sqrt(square)
        t = b - (b - a) * (db + d2 - d1) / (db - da + 2 * d2)
        if lo + 0.1 * (hi - lo) <= t <= hi - 0.1 * (hi - lo):
            return float(t)
    return (lo + hi) / 2  # bisection when the cubic is no help


def strong_wolfe(evaluate: Callable[[float], tuple[float, np.ndarray]], f0: float, g0: np.ndarray,
                 direction: np.ndarray, step: float = 1.0, c1: float = 1e-4, c2: float = 0.9,
                 max_evals: int = 25) -> tuple[float, float, np.ndarray, int]:
    """A step length satisfying the strong Wolfe conditions along ``direction``.

    ``evaluate(alpha)`` returns the loss and gradient at x + alpha * direction. Returns
    (alpha, loss, gradient, evaluations); after ``max_evals`` the best point seen is returned.
    """

    def phi(alpha: float) -> tuple[float, float, np.ndarray]:
        f, g = evaluate(alpha)
        return f, float(g @ direction), g

    return line_search(phi, f0, float(g0 @ direction), g0, step, c1, c2, max_evals)


def line_search(phi: Callable[[float], tuple[float, float, Any]], f0: float, d0: float,
                point0: Any, step: float = 1.0, c1: float = 1e-4, c2: float = 0.9,
                max_evals: int = 25) -> tuple[float, float, Any, int]:
    """Nocedal & Wright Alg. 3.5/3.6 on the scalar function phi(alpha) = f(x + alpha d).

    ``phi(alpha)`` returns (loss, directional derivative, point): the point is opaque here (a
    gradient array, or a handle to one held elsewhere, as Level 3's Sandblaster does). Returns
    (alpha, loss, point, evaluations). The point returned is always either the one of the
    latest ``phi`` call or the one with the lowest loss so far (``point0`` at alpha 0 included,
    ties kept by the earlier): a caller that stores points can keep just those two.
    """
    prev_a, prev_f, prev_d = 0.0, f0, d0
    best = (0.0, f0, point0)
    evals = 0

    def zoom(lo, f_lo, d_lo, hi, f_hi, d_hi):
        nonlocal evals, best
        while evals < max_evals:
            a = _cubic_minimizer(lo, f_lo, d_lo, hi, f_hi, d_hi)
            f, d, g = phi(a)
            evals += 1
            if f < best[1]:
                best = (a, f, g)
            if f > f0 + c1 * a * d0 or f >= f_lo:
                hi, f_hi, d_hi = a, f, d
            else:
                if abs(d) <= -c2 * d0:
                    return a, f, g
                if d * (hi - lo) >= 0:
                    hi, f_hi, d_hi = lo, f_lo, d_lo
                lo, f_lo, d_lo = a, f, d
        return best

    a = step
    while evals < max_evals:
        f, d, g = phi(a)
        evals += 1
        if f < best[1]:
            best = (a, f, g)
        if f > f0 + c1 * a * d0 or (evals > 1 and f >= prev_f):
            a, f, g = zoom(prev_a, prev_f, prev_d, a, f, d)
            return a, f, g, evals
        if abs(d) <= -c2 * d0:
            return a, f, g, evals
        if d >= 0:
            a, f, g = zoom(a, f, d, prev_a, prev_f, prev_d)
            return a, f, g, evals
        prev_a, prev_f, prev_d, a = a, f, d, 2 * a
    a, f, g = best
    return a, f, g, evals


class VectorOps(Protocol):
    """The vector operations the two-loop recursion needs, on vectors it never looks into:
    numpy arrays here, slot numbers of vectors sharded over servers in Level 3's Sandblaster."""

    def copy(self, x: Any) -> Any:
        """A copy of the vector ``x``."""

    def dots(self, pairs: list[tuple[Any, Any]]) -> list[float]:
        """The dot product of each pair, in one pass (one allreduce when distributed)."""

    def axpy(self, alpha: float, x: Any, y: Any) -> None:
        """``y += alpha * x`` in place."""

    def scale(self, alpha: float, x: Any) -> None:
        """``x *= alpha`` in place."""


class NumpyOps:
    """``VectorOps`` on numpy arrays."""

    def copy(self, x: np.ndarray) -> np.ndarray:
        """A copy of ``x``."""
        return x.copy()

    def dots(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
        """``a @ b`` of each pair."""
        return [float(a @ b) for a, b in pairs]

    def axpy(self, alpha: float, x: np.ndarray, y: np.ndarray) -> None:
        """``y += alpha * x`` in place."""
        y += alpha * x

    def scale(self, alpha: float, x: np.ndarray) -> None:
        """``x *= alpha`` in place."""
        x *= alpha


def two_loop(grad: Any, pairs: list[tuple[Any, Any]], ops: VectorOps | None = None) -> Any:
    """-H g for the L-BFGS inverse-Hessian approximation built from (s, y) pairs, oldest first,
    with H0 = (s.y / y.y) I from the newest pair. ``ops`` does the vector work (numpy arrays
    by default); the products y.s and y.y, which do not depend on q, go in one ``dots``."""
    ops = NumpyOps() if ops is None else ops
    q = ops.copy(grad)
    newest = [(pairs[-1][1], pairs[-1][1])] if pairs else []
    fixed = ops.dots([(y, s) for s, y in pairs] + newest)
    rhos = [1.0 / ys for ys in fixed[: len(pairs)]]
    alphas = []
    for (s, y), rho in zip(reversed(pairs), reversed(rhos)):
        alpha = rho * ops.dots([(s, q)])[0]
        ops.axpy(-alpha, y, q)
        alphas.append(alpha)
    if pairs:
        ops.scale(fixed[-2] / fixed[-1], q)  # s.y / y.y of the newest pair
    for (s, y), rho, alpha in zip(pairs, rhos, reversed(alphas)):
        ops.axpy(alpha - rho * ops.dots([(y, q)])[0], s, q)
    ops.scale(-1.0, q)
    return q


class _LineSearchOptimizer:
    """Shared machinery: flat vectors, closure evaluation at a trial step, counters."""

    needs_closure = True

    def __init__(self, params: Params, max_line_search: int = 25,
                 tolerance_grad: float = 1e-10) -> None:
        self.params = params
        self.tolerance_grad = tolerance_grad
        self.flat = _Flat(params)
        self.max_line_search = max_line_search
        self.evaluations = 0
        self.x: np.ndarray | None = None
        self.f = 0.0
        self.g: np.ndarray | None = None
        self.state: dict = {}

    def _evaluate(self, closure: Closure) -> tuple[float, np.ndarray]:
        loss, grads = closure()
        self.evaluations += 1
        return float(loss), self.flat.get(grads)

    def _search(self, closure: Closure, direction: np.ndarray, step: float,
                c2: float) -> float:
        x0 = self.x

        def at(alpha: float) -> tuple[float, np.ndarray]:
            self.flat.set(x0 + alpha * direction)
            return self._evaluate(closure)

        alpha, f, g, _ = strong_wolfe(at, self.f, self.g, direction, step, c2=c2,
                                      max_evals=self.max_line_search)
        self.x = x0 + alpha * direction
        self.flat.set(self.x)
        self.f, self.g = f, g
        return alpha

    def _start(self, closure: Closure) -> bool:
        """Evaluate at the current parameters (they may have been changed from outside);
        False when the gradient is already below ``tolerance_grad`` (converged)."""
        self.x = self.flat.get(self.params)
        self.f, self.g = self._evaluate(closure)
        return float(np.abs(self.g).max(initial=0.0)) > self.tolerance_grad


class LBFGS(_LineSearchOptimizer):
    """Limited-memory BFGS: one iteration (line search included) per ``step(closure)``.

    Returns the loss before the step. Pairs with s.y <= 0 are skipped, keeping H positive
    definite.
    """

    def __init__(self, params: Params, history: int = 10, max_line_search: int = 25) -> None:
        super().__init__(params, max_line_search)
        self.pairs: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=history)

    def state_dict(self) -> dict:
        """The curvature pairs and evaluation count, for a checkpoint."""
        return {"pairs": [list(pair) for pair in self.pairs], "evaluations": self.evaluations}

    def load_state_dict(self, saved: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.pairs.clear()
        self.pairs.extend((np.asarray(s), np.asarray(y)) for s, y in saved["pairs"])
        self.evaluations = saved["evaluations"]

    def step(self, closure: Closure) -> float:
        """One L-BFGS iteration (two-loop direction, line search); returns the loss before it."""
        if not self._start(closure):
            return self.f
        loss, x, g = self.f, self.x, self.g
        direction = two_loop(g, list(self.pairs))
        step = 1.0 if self.pairs else min(1.0, 1.0 / max(np.abs(g).sum(), 1e-12))
        self._search(closure, direction, step, c2=0.9)
        s, y = self.x - x, self.g - g
        if float(s @ y) > 1e-10 * float(y @ y):
            self.pairs.append((s, y))
        return loss


def fletcher_reeves(g: np.ndarray, g_prev: np.ndarray, d_prev: np.ndarray) -> float:
    """Fletcher-Reeves' beta: ``|g|^2 / |g_prev|^2``."""
    return float(g @ g) / float(g_prev @ g_prev)


def hestenes_stiefel(g: np.ndarray, g_prev: np.ndarray, d_prev: np.ndarray) -> float:
    """Hestenes-Stiefel's beta: ``g.y / y.d_prev`` with ``y = g - g_prev``."""
    y = g - g_prev
    return float(g @ y) / float(y @ d_prev)


def polak_ribiere_plus(g: np.ndarray, g_prev: np.ndarray, d_prev: np.ndarray) -> float:
    """Polak-Ribiere's beta, clipped at 0 (a restart when negative)."""
    return max(0.0, float(g @ (g - g_prev)) / float(g_prev @ g_prev))


BETAS = {"FR": fletcher_reeves, "HS": hestenes_stiefel, "PR+": polak_ribiere_plus}


class ConjugateGradient(_LineSearchOptimizer):
    """Nonlinear conjugate gradients: d <- beta d - g, x <- x + alpha d (seed 003's rule).

    ``method`` picks beta: "FR" (Fletcher-Reeves), "HS" (Hestenes-Stiefel) or "PR+"
    (Polak-Ribiere, clipped at 0). A direction that is not a descent direction restarts
    with steepest descent.
    """

    def __init__(self, params: Params, method: str = "PR+", max_line_search: int = 25) -> None:
        if method not in BETAS:
            raise ValueError(f"conjugate gradients: unknown method {method!r} "
                             f"(choose from {', '.join(BETAS)})")
        super().__init__(params, max_line_search)
        self.beta = BETAS[method]
        self.direction: np.ndarray | None = None
        self.g_prev: np.ndarray | None = None
        self.slope_step = 0.0  # alpha * g.d of the last step, for the next initial step

    def state_dict(self) -> dict:
        """The last direction and gradient, line-search step and evaluation count, for a
        checkpoint."""
        return {"direction": self.direction, "g_prev": self.g_prev,
                "slope_step": self.slope_step, "evaluations": self.evaluations}

    def load_state_dict(self, saved: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.direction, self.g_prev = saved["direction"], saved["g_prev"]
        self.slope_step, self.evaluations = saved["slope_step"], saved["evaluations"]

    def step(self, closure: Closure) -> float:
        """One nonlinear conjugate-gradient iteration (line search included); returns the loss
        before it."""
        if not self._start(closure):
            return self.f
        loss, g = self.f, self.g
        if self.direction is None:
            direction = -g
        else:
            try:
                beta = self.beta(g, self.g_prev, self.direction)
            except ZeroDivisionError:  # no change since the last step: restart
                beta = 0.0
            direction = beta * self.direction - g
            if float(direction @ g) >= 0:
                direction = -g
        slope = float(direction @ g)
        if self.direction is None:
            step = min(1.0, 1.0 / max(np.abs(g).sum(), 1e-12))
        else:  # expect the same first-order decrease as last time (Nocedal & Wright 3.60)
            step = self.slope_step / slope
        alpha = self._search(closure, direction, step, c2=0.1)
        self.direction, self.g_prev, self.slope_step = direction, g, alpha * slope
        return loss


LBFGS.options = {"history": Option(10, "(s, y) pairs kept", low=1),
                 "max_line_search": Option(25, "evaluations per line search", low=1)}
ConjugateGradient.options = {
    "method": Option("PR+", "beta: Fletcher-Reeves, Polak-Ribiere+ or Hestenes-Stiefel",
                     choices=tuple(BETAS)),
    "max_line_search": Option(25, "evaluations per line search", low=1)}
OPTIMIZERS.add("lbfgs", LBFGS, inherit=False, line_search=True)
OPTIMIZERS.add("cg", ConjugateGradient, inherit=False, line_search=True)
