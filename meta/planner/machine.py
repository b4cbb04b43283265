"""A machine description: nodes, ranks per node, per-rank compute rate and memory, and the
α-β links within a node and between nodes; read from and written to TOML.

A planner's predictions are only as good as its machine, so the description says where each
figure came from (``source``): measured by ``meta plan --calibrate`` on this machine, or typed
in by hand for a cluster that is not this one. Measured per-operator costs of recipes are kept
with the machine (``[costs.RECIPE]``), keyed by the network's signature so a changed network
is not planned with an old network's times.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from meta.lv3.comm.costmodel import Link
from meta.planner.async_pattern import AsyncPattern

GIB = 1 << 30


class MachineError(ValueError):
    """A machine file that cannot be read: the file and the key are named."""


@dataclass(frozen=True)
class RecipeCosts:
    """One recipe's measured step on one rank: per graph node, forward and backward seconds
    at ``batch`` samples (the executor's profile), and the whole step's measured time (which
    includes what no node owns: the optimizer update, copies)."""

    signature: str
    executor: str
    batch: int
    forward_s: dict[str, float]
    backward_s: dict[str, float]
    step_s: float
    update_s: float = 0.0
    # per call, whatever the batch (the executor's own overhead): fitted from a second
    # batch size, so a pipeline's micro-batches are not taken to cost batch/M of a batch
    forward_fixed_s: dict[str, float] = field(default_factory=dict)
    backward_fixed_s: dict[str, float] = field(default_factory=dict)
    extra_fixed_s: float = 0.0
    # every measured step's time over their mean, pooled over the ranks that measured at
    # once: a synchronous step waits for the slowest of P ranks, whose expected excess over
    # the mean this distribution gives (``Workload.sync_s``); empty: no excess is predicted
    step_spread: tuple[float, ...] = ()
    # ranks that stepped at once while measuring (each on a share of the node's cores when
    # more than its cores): ``Workload.busy`` rescales to the ranks a strategy keeps busy
    ranks_measured: int = 1
    # the asynchronous strategies' patterns measured with this step as the workers' work
    # (``meta.planner.async_pattern``); None: not measured (one process, a described cluster)
    pattern: AsyncPattern | None = None


@dataclass(frozen=True)
class Machine:
    """A cluster as the planner sees it. ``flops`` is a rank's sustained rate on the recipe's
    kind of work (used only when a recipe has no measured costs), ``memory_bytes`` what a rank
    may hold; ``intra`` links two ranks of one node, ``inter`` two nodes; ``copy_beta`` is
    a memory copy's time per byte (a strategy packs its gradients into one buffer)."""

    name: str = "default"
    nodes: int = 1
    ranks_per_node: int = 2
    flops: float = 2e10
    memory_bytes: float = 4 * GIB
    intra: Link = Link(alpha=1e-6, beta=1e-10)  # shared memory: ~1 us, 10 GB/s
    inter: Link = Link(alpha=5e-6, beta=8e-11)  # a 100 Gb/s network: ~5 us, 12.5 GB/s
    copy_beta: float = 2e-10  # s/byte of a rank's memory copy (packing gradients): 5 GB/s
    source: str = "the cost model's defaults (not measured)"
    costs: dict[str, RecipeCosts] = field(default_factory=dict)
    cores: int = 0  # per node; 0: one per rank (ranks_per_node). More ranks than cores share
    # a message waited for by polling (the asynchronous servers' and workers' waits); None:
    # as the link it crosses (an MPI with a progress thread, or not measured)
    polled: Link | None = None
    # whether MPI moves a nonblocking collective while the rank computes (an asynchronous
    # progress thread, e.g. MPICH_ASYNC_PROGRESS=1, or a network that offloads it); without,
    # an overlapped bucket moves only inside the calls that test it, and an allreduce
    # overlapped with the backward hides almost nothing (benchmarks/planner_validation.py)
    progress: bool = False
    # seconds per byte of reading what another rank of a node has just written (the
    # shared-memory exchange's reads: ``costmodel.measure_shared_reads``); None: not measured,
    # that exchange moved at ``intra``'s beta
    shared_read_beta: float | None = None

    @property
    def cores_per_node(self) -> int:
        return self.cores or self.ranks_per_node

    def oversubscribed(self, ranks: int) -> Machine:
        """This one node running ``ranks`` ranks on its cores (as tests and benchmarks do
        on a small machine): every collective stays on ``intra``."""
        return replace(self, nodes=1, ranks_per_node=max(ranks, self.ranks_per_node),
                       cores=self.cores_per_node)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def sized(self, ranks: int) -> Machine:
        """This machine's kind of node, as many as ``ranks`` need (a planned P beyond the
        described cluster grows it node by node, each node like the described ones)."""
        return replace(self, nodes=max(1, math.ceil(ranks / self.ranks_per_node)))

    def link(self, ranks: int) -> Link:
        """The slowest link a collective over ``ranks`` consecutive ranks crosses."""
        return self.intra if ranks <= self.ranks_per_node else self.inter

    def polled_link(self, ranks: int) -> Link:
        """A polled wait's link among ``ranks``: measured within a node, or the link."""
        if self.polled is not None and ranks <= self.ranks_per_node:
            return self.polled
        return self.link(ranks)


def _link(table: Any, where: str) -> Link:
    if not isinstance(table, dict):
        raise MachineError(f"{where}: expected a table with alpha and beta")
    try:
        link = Link(float(table["alpha"]), float(table["beta"]))
    except KeyError as err:
        raise MachineError(f"{where}: missing key {err.args[0]!r}") from err
    except (TypeError, ValueError) as err:
        raise MachineError(f"{where}: {err}") from err
    for key in ("alpha", "beta"):
        _check(f"{where}: {key}", getattr(link, key), zero=True)
    return link


def _check(where: str, value: float, zero: bool) -> float:
    """``value`` where it is a finite number > 0 (>= 0 with ``zero``); else MachineError: a
    rate of 0 divides by zero, a nan or inf makes every prediction nan or inf."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise MachineError(f"{where} = {value!r}: must be a finite number "
                           f"{'>= 0' if zero else '> 0'}")
    return value


def load_machine(path: str | Path) -> Machine:
    """Read a machine TOML file (see docs/design/planner.md for its keys)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise MachineError(f"machine file {str(path)!r} cannot be read: {err}") from err
    except tomllib.TOMLDecodeError as err:
        raise MachineError(f"machine file {str(path)!r} is not TOML: {err}") from err
    known = {f.name for f in fields(Machine)} | {"memory_gib"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise MachineError(f"machine file {str(path)!r}: unknown key {unknown[0]!r} "
                           f"(known: {', '.join(sorted(known))})")
    kw: dict[str, Any] = {}
    try:
        for key in ("name", "source"):
            if key in data:
                kw[key] = str(data[key])
        for key in ("nodes", "ranks_per_node", "cores"):
            if key in data:
                kw[key] = int(data[key])
                if kw[key] < (0 if key == "cores" else 1):
                    raise MachineError(f"machine file {str(path)!r}: {key} must be >= 1")
        for key in ("flops", "copy_beta", "shared_read_beta"):
            if key in data:
                kw[key] = _check(f"machine file {str(path)!r}: {key}", float(data[key]),
                                 zero=key != "flops")
        if "progress" in data:
            if not isinstance(data["progress"], bool):
                raise MachineError(f"machine file {str(path)!r}: progress must be true or "
                                   f"false, got {data['progress']!r}")
            kw["progress"] = data["progress"]
        if "memory_gib" in data:
            kw["memory_bytes"] = float(data["memory_gib"]) * GIB
        if "memory_bytes" in data:
            kw["memory_bytes"] = float(data["memory_bytes"])
        if "memory_bytes" in kw:
            _check(f"machine file {str(path)!r}: memory", kw["memory_bytes"], zero=False)
    except (TypeError, ValueError) as err:
        raise MachineError(f"machine file {str(path)!r}: {err}") from err
    for key in ("intra", "inter", "polled"):
        if key in data:
            kw[key] = _link(data[key], f"machine file {str(path)!r}, [{key}]")
    costs = {}
    if not isinstance(data.get("costs", {}), dict):
        raise MachineError(f"machine file {str(path)!r}: costs must be a table of recipes")
    for recipe, table in data.get("costs", {}).items():
        where = f"machine file {str(path)!r}, [costs.{recipe}]"
        try:
            costs[recipe] = RecipeCosts(
                str(table["signature"]), str(table["executor"]), int(table["batch"]),
                {k: float(v) for k, v in table["forward_s"].items()},
                {k: float(v) for k, v in table["backward_s"].items()},
                float(table["step_s"]), float(table.get("update_s", 0.0)),
                {k: float(v) for k, v in table.get("forward_fixed_s", {}).items()},
                {k: float(v) for k, v in table.get("backward_fixed_s", {}).items()},
                float(table.get("extra_fixed_s", 0.0)),
                tuple(float(v) for v in table.get("step_spread", ())),
                int(table.get("ranks_measured", 1)),
                AsyncPattern.from_table(table["pattern"]) if "pattern" in table else None)
        except KeyError as err:
            raise MachineError(f"{where}: missing key {err.args[0]!r}") from err
        except (TypeError, ValueError, AttributeError) as err:
            raise MachineError(f"{where}: {err}") from err
        for key in ("step_s", "update_s", "extra_fixed_s"):
            _check(f"{where}: {key}", getattr(costs[recipe], key), zero=key != "step_s")
        for key in ("forward_s", "backward_s", "forward_fixed_s", "backward_fixed_s"):
            for node, value in getattr(costs[recipe], key).items():
                _check(f"{where}: {key}.{node}", value, zero=True)
        if costs[recipe].batch < 1 or costs[recipe].ranks_measured < 1:
            raise MachineError(f"{where}: batch and ranks_measured must be >= 1")
    kw["costs"] = costs
    kw.setdefault("source", f"described in {path}")
    return Machine(**kw)


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


def machine_toml(machine: Machine) -> str:
    """The TOML text ``load_machine`` reads back to an equal Machine."""
    lines = [f"# meta plan machine description ({machine.source})"]
    for key in ("name", "source", "nodes", "ranks_per_node", "cores", "flops", "memory_bytes",
                "copy_beta", "progress", "shared_read_beta"):
        if getattr(machine, key) is not None:
            lines.append(f"{key} = {_toml_value(getattr(machine, key))}")
    for key in ("intra", "inter", "polled"):
        link = getattr(machine, key)
        if link is None:
            continue
        lines += ["", f"[{key}]  # {link}", f"alpha = {link.alpha!r}", f"beta = {link.beta!r}"]
    for recipe, c in machine.costs.items():
        lines += ["", f"[costs.{recipe}]"]
        for key in ("signature", "executor", "batch", "step_s", "update_s", "extra_fixed_s",
                    "step_spread", "ranks_measured"):
            lines.append(f"{key} = {_toml_value(getattr(c, key))}")
        if c.pattern is not None:
            lines += ["", f"[costs.{recipe}.pattern]  # {c.pattern}"]
            lines += [f"{k} = {v!r}" for k, v in c.pattern.table().items()]
        for key in ("forward_s", "backward_s", "forward_fixed_s", "backward_fixed_s"):
            lines += ["", f"[costs.{recipe}.{key}]"]
            lines += [f"{_toml_value(k)} = {v!r}" for k, v in getattr(c, key).items()]
    return "\n".join(lines) + "\n"


def save_machine(machine: Machine, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(machine_toml(machine))
    return path
