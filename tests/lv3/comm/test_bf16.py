"""The bf16 gradient exchange (``meta.lv3.comm.bf16``, ``distributed.grad_dtype=bf16``): the
rounding against PyTorch's, the checks of ``bf16_checks.py`` at size 1 and under ``mpiexec -n
2`` and ``-n 3``, the option, the planner's bytes, and the MNIST MLP recipe end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import SingleProcessCommunicator, make_strategy
from meta.lv3.comm.bf16 import from_bf16, round_bf16, to_bf16

from . import bf16_checks

SCRIPT = str(Path(bf16_checks.__file__))
REPO = Path(__file__).resolve().parents[3]
META = str(Path(sys.executable).parent / "meta")


def _awkward_floats() -> np.ndarray:
    """Every kind of float32 a rounding can get wrong: ties (to even, both ways), values just
    above and below them, subnormals, the largest finite (rounds to inf), signed zeros,
    infinities, and a spread of random bit patterns."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    low = np.array([0x8000, 0x7FFF, 0x8001, 0x18000, 0x17FFF, 0x0, 0xFFFF], np.uint32)
    tops = rng.integers(0, 2**16, 200, dtype=np.uint64).astype(np.uint32) << 16
    words = np.concatenate([words, (tops[:, None] | low[None, :]).ravel(),
                            np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001,
                                      0x007FFFFF, 0x80000000, 0x7F800000, 0xFF800000],
                                     np.uint32)])
    values = words.view(np.float32)
    return values[~np.isnan(values)]


def test_rounding_matches_torch_bfloat16() -> None:
    """Round to nearest even, bit for bit as ``torch.Tensor.to(torch.bfloat16)``, on ties,
    subnormals, overflow to inf and random bit patterns; NaN stays NaN and inf inf."""
    torch = pytest.importorskip("torch")
    x = _awkward_floats()
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(to_bf16(x), theirs)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38], np.float32)
    back = round_bf16(special)
    assert np.isnan(back[:2]).all() and back[2] == np.inf and back[3] == -np.inf
    assert back[4] == np.inf and back[5] == -np.inf  # above bf16's largest finite


def test_rounding_reference_without_torch() -> None:
    """The same rounding by exact arithmetic (no torch needed): the nearest bf16 value, the
    one with an even last bit on a tie, and bf16 -> float32 -> bf16 is the identity."""
    x = _awkward_floats()
    x = x[np.isfinite(x) & (np.abs(x) < 3.3e38)]
    got = from_bf16(to_bf16(x)).astype(np.float64)
    down = (x.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)  # toward 0
    step = np.abs(((x.view(np.uint32) & 0xFFFF0000) + 0x10000).view(np.float32)
                  .astype(np.float64) - down)
    away = down + np.sign(x.astype(np.float64)) * step
    exact = x.astype(np.float64)
    d_down, d_away = np.abs(exact - down), np.abs(exact - away)
    even_down = (to_bf16(down.astype(np.float32)) & 1) == 0
    want = np.where(d_down < d_away, down, np.where(d_away < d_down, away,
                                                    np.where(even_down, down, away)))
    np.testing.assert_array_equal(got, want)
    words = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(from_bf16(words))
    np.testing.assert_array_equal(to_bf16(from_bf16(words))[finite], words[finite])


def test_single_process_alltoallv_checks_counts() -> None:
    comm = SingleProcessCommunicator()
    send, recv = np.arange(5, dtype=np.uint16), np.zeros(3, np.uint16)
    comm.wait(comm.ialltoallv(send, [2], recv, [2], [3], [1]))
    assert recv.tolist() == [0, 3, 4]
    with pytest.raises(ValueError, match=r"ialltoallv: send counts \[6\] from \[0\]"):
        comm.ialltoallv(send, [6], recv, [6])
    with pytest.raises(TypeError, match="send is uint16, recv float32"):
        comm.ialltoallv(send, [1], np.zeros(1, np.float32), [1])


@pytest.mark.parametrize("name", list(bf16_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    bf16_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=300)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(bf16_checks.CHECKS)} checks passed" in out, out


def test_option_is_declared_and_refuses_what_it_cannot_do() -> None:
    from meta.lv3.strategies import STRATEGIES

    option = STRATEGIES["allreduce"].options["grad_dtype"]
    assert option.default == "f32" and option.choices == ("f32", "bf16")
    with pytest.raises(ComponentError, match="must be one of f32, bf16, got 'fp8'"):
        option.convert("grad_dtype", "fp8")
    with pytest.raises(ComponentError, match="grad_dtype 'bf16' and compression 'fp16'"):
        make_strategy("allreduce", Optimizer(sgd(0.1), {"w": np.zeros(3, np.float32)}),
                      SingleProcessCommunicator(), compression="fp16", grad_dtype="bf16")
    with pytest.raises(ComponentError, match="needs float32 gradients"):
        make_strategy("allreduce", Optimizer(sgd(0.1), {"w": np.zeros(3)}),
                      SingleProcessCommunicator(), grad_dtype="bf16")


def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(capsys) -> None:
    from meta.cli import main

    assert main(["run", str(REPO / "recipes" / "mnist_mlp.py"),
                 "--set", "distributed.grad_dtype=fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'distributed.grad_dtype' must be one of f32, bf16" in err


def test_plan_costs_half_the_bytes_in_bf16() -> None:
    """The planner's allreduce rows send GRAD_BYTES per value: bf16 half of float32, its rows
    labelled and set as such, the recipe's choice read from ``distributed.grad_dtype``."""
    from meta.planner.costs import allreduce_costs, grad_dtype_of
    from meta.planner.machine import Machine
    from meta.planner.workload import make_workload
    from meta.run.recipe import load_recipe

    recipe = load_recipe(REPO / "recipes" / "mnist_mlp.py")
    assert grad_dtype_of(recipe) == "f32"
    bf16 = recipe.with_overrides({"distributed.grad_dtype": "bf16"})
    assert grad_dtype_of(bf16) == "bf16"
    machine = Machine()
    work = make_workload(recipe, machine)
    f32_rows = allreduce_costs(work, machine.sized(4), 4)
    bf16_rows = allreduce_costs(work, machine.sized(4), 4, "bf16")
    assert [r.label for r in bf16_rows] == ["allreduce bf16", "allreduce overlapped bf16"]
    for f, b in zip(f32_rows, bf16_rows):
        assert b.bytes_sent == f.bytes_sent / 2 == 2 * 3 / 4 * work.param_bytes / 2
        assert b.sets["distributed.grad_dtype"] == "bf16"


@pytest.mark.mpi
@pytest.mark.slow
def test_mnist_mlp_recipe_in_bf16_on_2_ranks(tmp_path, mnist_dir, mpirun) -> None:
    """Issue 42: ``mpiexec -n 2`` with ``grad_dtype=bf16`` reaches the recipe's bound, the
    backward overlapped with the exchange, sending 2 bytes per parameter a step (the float32
    allreduce: 4)."""
    args = [META, "run", str(REPO / "recipes" / "mnist_mlp.py"), "--output-dir", str(tmp_path),
            "--quiet", "--no-export", "--set=distributed.grad_dtype=bf16"]
    output = mpirun(2, args, timeout=400)
    assert output.count("mnist_mlp: PASS") == 1, output
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    n_params = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert metrics["bytes_sent_per_step"] == 2 * n_params
    assert metrics["test_accuracy"] >= 0.975
