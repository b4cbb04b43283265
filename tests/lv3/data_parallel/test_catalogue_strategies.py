"""The hierarchical parameter server, neighbourhood averaging and Hogwild: their pieces at
size 1, their refusals, their recipe options, and the checks of ``catalogue_checks.py``
in-process and under ``mpiexec`` (-n 5: one server and four workers, so fan-in 2 and 4 both
divide the workers; -n 3: the ring comparison and Hogwild with an odd count)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import (
    STRATEGIES,
    HierarchicalParameterServer,
    Hogwild,
    NeighbourAveraging,
    SingleProcessCommunicator,
    make_strategy,
)
from meta.lv3.comm.topology import SingleProcessTopology, exponential_offsets, topology
from meta.lv3.data_parallel.hogwild import ranks_on_this_node, refusal
from meta.run.recipe import AtLeast, RecipeError, make_recipe

from . import catalogue_checks

SCRIPT = str(Path(catalogue_checks.__file__))


@pytest.mark.parametrize("name", list(catalogue_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    catalogue_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 5])  # oversubscribed on the 2-core machine
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=120)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(catalogue_checks.CHECKS)} checks passed" in out, out


def _opt() -> Optimizer:
    return Optimizer(sgd(0.1), {"w": np.zeros(3)})


def test_the_three_are_recipe_components_with_declared_options() -> None:
    assert STRATEGIES["hierarchical_ps"].meta["cls"] is HierarchicalParameterServer
    assert STRATEGIES["neighbours"].meta["cls"] is NeighbourAveraging
    assert STRATEGIES["hogwild"].meta["cls"] is Hogwild
    assert {"servers", "fan_in"} <= set(STRATEGIES["hierarchical_ps"].options)
    assert {"topology", "cart_dims", "average_every"} <= set(STRATEGIES["neighbours"].options)
    metrics = {"test_accuracy": AtLeast(0.5)}
    recipe = make_recipe("r", {"distributed": {"name": "hierarchical_ps", "fan_in": 4}}, {},
                         metrics)
    assert recipe.definitions.choices["distributed"].values()["fan_in"] == 4
    with pytest.raises(RecipeError) as err:
        make_recipe("r", {"distributed": "neighbours", "topology": "star", "fan_in": 0}, {},
                    metrics)
    message = str(err.value)
    assert "option 'topology' must be one of cart, graph, got 'star'" in message, message
    assert "'fan_in' is an option of distributed 'hierarchical_ps'" in message, message
    with pytest.raises(RecipeError, match="'cart_dims' must be at least 1"):
        make_recipe("r", {"distributed": "neighbours", "cart_dims": 0}, {}, metrics)


def test_bad_options_built_directly_name_the_option() -> None:
    with pytest.raises(ComponentError, match="fan_in must be an integer >= 1, got 0"):
        HierarchicalParameterServer(_opt(), SingleProcessCommunicator(), fan_in=0)
    with pytest.raises(ComponentError, match="distributed 'neighbours': topology: unknown kind"):
        NeighbourAveraging(_opt(), SingleProcessCommunicator(), topology="star")
    with pytest.raises(ValueError, match="average_every must be an int >= 1, got 0"):
        NeighbourAveraging(_opt(), SingleProcessCommunicator(), average_every=0)
    with pytest.raises(ValueError, match="dims must be an int >= 1"):
        topology(SingleProcessCommunicator(), "cart", dims=0)


def test_hierarchy_needs_a_worker_beside_its_servers() -> None:
    two = SimpleNamespace(rank=0, size=2)
    with pytest.raises(ComponentError, match="servers=2 leaves no worker among 2 ranks"):
        HierarchicalParameterServer(_opt(), two, servers=2)  # refused before any collective
    assert HierarchicalParameterServer.replica(4, 5, servers=1) == (0, 1)  # the server
    assert HierarchicalParameterServer.replica(3, 5, servers=1) == (3, 4)


def test_hierarchy_at_size_one_has_no_server_and_no_report_of_one() -> None:
    opt = make_strategy("hierarchical_ps", _opt(), SingleProcessCommunicator(), fan_in=8)
    assert opt.servers == [] and opt.fan_in == 1 and opt.consistent
    assert "global_server_bytes_per_step" not in opt.report() and opt.report_text() == ""


def test_exponential_graph_and_the_single_process_topology() -> None:
    assert exponential_offsets(5) == [1, 2, 4] and exponential_offsets(16) == [1, 2, 4, 8]
    hood = topology(SingleProcessCommunicator(), "graph")
    assert isinstance(hood, SingleProcessTopology) and hood.destinations == []
    assert hood.neighbor_alltoall(np.empty((0, 4))).shape == (0, 4)
    with pytest.raises(ValueError, match="2 blocks for 0 out-neighbours"):
        hood.neighbor_alltoall(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="not C-contiguous"):
        hood.neighbor_allgather(np.zeros((4, 4))[:, 1])


def test_neighbours_predict_degree_messages_per_average() -> None:
    opt = NeighbourAveraging(_opt(), SingleProcessCommunicator(), average_every=4)
    assert opt.report()["neighbours"] == 0.0 and opt.report()["replica_spread"] == 0.0


def test_hogwild_refuses_ranks_on_several_nodes_in_one_line() -> None:
    assert ranks_on_this_node({"MPI_LOCALNRANKS": "2"}) == 2
    assert ranks_on_this_node({}) is None
    assert refusal(4, 4) is None and refusal(4, None) is None and refusal(1, 1) is None
    message = refusal(4, 2)
    assert "\n" not in message and "only 2 of the 4 ranks run on this node" in message
    assert "distributed 'async_rma'" in message


def test_hogwild_check_refuses_before_any_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    with pytest.raises(ComponentError, match="only 2 of the 4 ranks"):
        Hogwild.check(_opt(), SimpleNamespace(rank=0, size=4), None)
    Hogwild.check(_opt(), SimpleNamespace(rank=0, size=2), None)  # all on this node: fine


def test_hogwild_at_size_one_reports_no_shared_writes() -> None:
    opt = Hogwild(_opt(), SingleProcessCommunicator())
    opt.step({"w": np.ones(3)})
    opt.finish()
    assert opt.shared is None and opt.report()["shared_bytes_written_per_step"] == 0.0
