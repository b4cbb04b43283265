"""meta's ``adam`` and ``adamw`` take PyTorch's steps: 100 steps of ``torch.optim.Adam`` /
``AdamW`` (with and without weight decay and amsgrad) stored in ``fixtures/torch_adam.npz``
by ``fixtures/make_torch_adam.py``; with PyTorch installed the same values are computed live
too. Kingma & Ba's form stays reachable as ``eps_form="kingma"``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from meta.lv2 import OPTIMIZERS, build_optimizer
from meta.lv2.optimizers import Optimizer, adam, adamw

from .fixtures import make_torch_adam as maker

FIXTURE = Path(__file__).parent / "fixtures" / "torch_adam.npz"
TOLERANCE = 1e-6


def stored() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


def meta_run(data: dict[str, np.ndarray], case: str, **kw) -> dict[str, np.ndarray]:
    cls, weight_decay, amsgrad = maker.CASES[case]
    rule = adam if cls == "Adam" else adamw
    names = sorted(k[3:] for k in data if k.startswith("p0/"))
    params = {n: data[f"p0/{n}"].copy() for n in names}
    opt = Optimizer(rule(maker.LR, weight_decay=weight_decay, amsgrad=amsgrad, **kw), params)
    for step in range(maker.STEPS):
        opt.step({n: data[f"grads/{n}"][step] for n in names})
    return params


def test_fixture_inputs_are_the_makers():
    """The stored gradients are the ones the maker draws (the fixture is not stale)."""
    data, fresh = stored(), maker.inputs()
    for key, value in fresh.items():
        np.testing.assert_array_equal(data[key], value, err_msg=key)


@pytest.mark.parametrize("case", list(maker.CASES))
def test_adam_equals_pytorch(case):
    data = stored()
    ours = meta_run(data, case)
    for n, value in ours.items():
        np.testing.assert_allclose(value, data[f"{case}/{n}"], rtol=0, atol=TOLERANCE,
                                   err_msg=f"{case}: {n}")
        assert not np.allclose(value, data[f"p0/{n}"])  # they moved


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
@pytest.mark.parametrize("case", ["adam_wd_amsgrad", "adamw_wd_amsgrad"])
def test_adam_equals_pytorch_live(case):
    data = stored()
    theirs, ours = maker.torch_run(data, case), meta_run(data, case)
    for n in ours:
        np.testing.assert_allclose(ours[n], theirs[n], rtol=0, atol=TOLERANCE, err_msg=n)


@pytest.mark.parametrize("case", ["adam", "adamw"])
def test_kingma_form_is_another_update(case):
    """Kingma & Ba's form is kept by name and is not PyTorch's: on gradients near eps the
    two part by far more than the tolerance."""
    data = stored()
    kingma = meta_run(data, case, eps_form="kingma")
    worst = max(float(np.abs(kingma[n] - data[f"{case}/{n}"]).max()) for n in kingma)
    assert worst > 100 * TOLERANCE


def test_recipe_options_reach_the_rule():
    """``amsgrad`` and ``eps_form`` are recipe options of both; a bad form is refused by name."""
    data = stored()
    params = {n: data[f"p0/{n}"].copy() for n in ("b", "w")}
    opt = build_optimizer(OPTIMIZERS["adamw"], {"lr": maker.LR, "weight_decay": 0.1,
                                                "amsgrad": True}, params, 10, 10)
    for step in range(maker.STEPS):
        opt.step({n: data[f"grads/{n}"][step] for n in params})
    for n in params:
        np.testing.assert_allclose(params[n], data[f"adamw_wd_amsgrad/{n}"], atol=TOLERANCE)
    assert OPTIMIZERS["adam"].options["eps_form"].default == "pytorch"
    with pytest.raises(Exception, match="eps_form"):
        OPTIMIZERS["adam"].resolve({"eps_form": "paper"})
