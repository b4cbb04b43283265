"""Test cases for RNN, GRU and LSTM (see cases.py for the format): every attribute, small
enough for float64 finite differences through time. onnx.reference ignores sequence_lens,
clip, activations and input_forget, so those cases are forward-checked by
tests/lv0/test_recurrent.py instead (``OracleLimit``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .cases_nn import OracleLimit

T, B, IN, H = 3, 2, 2, 2
IGNORED = "onnx.reference ignores sequence_lens, clip, activations and input_forget"


def _recurrent(gates: int, extra_attrs: tuple = (), peepholes: bool = False,
               activations: list[str] = (), limited_attrs: tuple = ()):
    def cases(rng):
        def r(*shape, scale=0.5):
            return rng.standard_normal(shape) * scale

        def weights(dirs):
            return [r(dirs, gates * H, IN), r(dirs, gates * H, H), r(dirs, 2 * gates * H)]

        def states(dirs, layout=0):
            shape = (B, dirs, H) if layout else (dirs, B, H)
            return [r(*shape)] + ([r(*shape)] if peepholes else [])

        def tail(dirs, lens=None, layout=0):
            extra = [lens, *states(dirs, layout)]
            if peepholes:
                extra.append(r(dirs, 3 * H))
            return extra

        lens = np.array([3, 1], np.int32)
        x = r(T, B, IN, scale=1.0)
        out = [({"hidden_size": H}, [x, *weights(1)[:2]]),  # no bias, no initial state
               ({"hidden_size": H}, [x, *weights(1), None, *tail(1)[1:]]),
               ({"hidden_size": H, "direction": "reverse"}, [x, *weights(1), None, *tail(1)[1:]]),
               ({"hidden_size": H, "direction": "bidirectional"},
                [x, *weights(2), None, *tail(2)[1:]]),
               ({"hidden_size": H, "layout": 1},
                [np.swapaxes(x, 0, 1).copy(), *weights(1), None, *tail(1, layout=1)[1:]]),
               (OracleLimit({"hidden_size": H}, 0, "onnx.reference cannot run 0 time steps"),
                [np.zeros((0, B, IN)), *weights(1)]),
               ({"hidden_size": H}, [x[:, :0], *weights(1)])]  # empty batch
        for attrs in extra_attrs:
            out.append(({"hidden_size": H, **attrs}, [x, *weights(1), None, *tail(1)[1:]]))
        limited = [
            ({"direction": "bidirectional"}, [x, *weights(2), *tail(2, lens)]),
            ({"direction": "reverse"}, [x, *weights(1), *tail(1, lens)]),
            ({"layout": 1, "direction": "bidirectional"},
             [np.swapaxes(x, 0, 1).copy(), *weights(2), *tail(2, lens, layout=1)]),
            ({"clip": 0.3}, [x, *weights(1), None, *tail(1)[1:]]),
        ] + [(a, [x, *weights(1), None, *tail(1)[1:]]) for a in limited_attrs]
        if activations:
            limited.append(({"activations": list(activations)},
                            [x, *weights(1), None, *tail(1)[1:]]))
        for attrs, inputs in limited:
            out.append((OracleLimit({"hidden_size": H, **attrs}, 0, IGNORED), inputs))
        return out
    return cases


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "RNN": _recurrent(1, activations=["Relu"]),
    "GRU": _recurrent(3, ({"linear_before_reset": 1},),
                      activations=["HardSigmoid", "Softsign"]),
    "LSTM": _recurrent(4, peepholes=True, activations=["Sigmoid", "Elu", "ScaledTanh"],
                       limited_attrs=({"input_forget": 1},)),
}
