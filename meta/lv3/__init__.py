"""Level 3: communicators, fused buffers, sharded sampling and distributed optimizers.

Everything runs at size 1 without MPI; ``world()`` switches to MPI only under ``mpiexec``.
Strategies (``make_strategy``) wrap any Level 2 optimizer: ``Allreduce`` (with optional
gradient compression), ``ParameterServer``, ``AsyncParameterServer``, ``ModelAveraging`` and
``RingAveraging``, ``AsyncRMA`` (one-sided windows), ``Downpour`` and ``Sandblaster``
(DistBelief's two); ``Pipeline`` cuts the network into stages, one per rank;
``HybridAllreduce`` and ``HybridDownpour`` run data parallelism over pipelined replicas;
``Partitioned`` splits the layers' neurons over the ranks. A strategy is built from what it
uses: the optimizer, the communicator and, where it cuts the graph or reads the data, a
``Workload`` (never the trainer).

The tree: the strategy interface and its small helpers at this level (``strategy``,
``strategies``, ``workload``, ``flat``, ``timeline``, ``sampler``, ``report``,
``pretraining``), MPI only in ``comm/``, and one sub-package per kind of parallelism:
``data_parallel/``, ``parameter_server/``, ``sandblaster/``, ``pipeline/``,
``tensor_parallel/``, ``hybrid/``.
Modules that lived at this level before the split (``meta.lv3.allreduce`` is now
``meta.lv3.data_parallel.allreduce``) still import under their old names, with a
``DeprecationWarning``, for one release: see ``MOVED``.
"""

from __future__ import annotations

from meta.common.moved import alias_modules
from meta.lv3.comm.communicator import (
    Communicator,
    MPICommunicator,
    SingleProcessCommunicator,
    launched_size,
    world,
)
from meta.lv3.comm.costmodel import Link, measure_link
from meta.lv3.data_parallel.allreduce import Allreduce, AllreduceOptimizer, allreduce_mean
from meta.lv3.data_parallel.averaging import ModelAveraging, RingAveraging
from meta.lv3.data_parallel.compression import Compressor, Float16, Sign, TopK, make_compressor
from meta.lv3.data_parallel.hogwild import Hogwild
from meta.lv3.data_parallel.neighbours import NeighbourAveraging
from meta.lv3.data_parallel.quantization import StochasticQuantizer, Ternary
from meta.lv3.flat import FlatBuffer
from meta.lv3.hybrid.allreduce import HybridAllreduce
from meta.lv3.hybrid.downpour import HybridDownpour
from meta.lv3.parameter_server.central import AsyncParameterServer, ParameterServer
from meta.lv3.parameter_server.downpour import Downpour
from meta.lv3.parameter_server.hierarchical import HierarchicalParameterServer
from meta.lv3.parameter_server.rma import AsyncRMA
from meta.lv3.pipeline.strategy import Pipeline
from meta.lv3.sampler import DistributedSampler
from meta.lv3.sandblaster.strategy import Sandblaster
from meta.lv3.strategies import (
    STRATEGIES,
    make_strategy,
    register_strategy,
    replica,
    strategy_class,
)
from meta.lv3.strategy import DEFAULT_CHUNK_BYTES, Strategy
from meta.lv3.tensor_parallel.strategy import Partitioned
from meta.lv3.timeline import Timeline, chrome_trace
from meta.lv3.workload import Workload

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "STRATEGIES",
    "Allreduce",
    "AllreduceOptimizer",
    "AsyncParameterServer",
    "AsyncRMA",
    "Communicator",
    "Compressor",
    "DistributedSampler",
    "Downpour",
    "FlatBuffer",
    "Float16",
    "HierarchicalParameterServer",
    "Hogwild",
    "HybridAllreduce",
    "HybridDownpour",
    "Link",
    "MPICommunicator",
    "ModelAveraging",
    "NeighbourAveraging",
    "ParameterServer",
    "Partitioned",
    "Pipeline",
    "RingAveraging",
    "Sandblaster",
    "Sign",
    "SingleProcessCommunicator",
    "StochasticQuantizer",
    "Strategy",
    "Ternary",
    "Timeline",
    "TopK",
    "Workload",
    "allreduce_mean",
    "chrome_trace",
    "launched_size",
    "make_compressor",
    "make_strategy",
    "register_strategy",
    "measure_link",
    "replica",
    "strategy_class",
    "world",
]

# Old module (under meta.lv3) -> its new home. The four whose old name is now a sub-package
# (parameter_server, sandblaster, pipeline, hybrid) need no entry: the package exports the
# old module's names (its other names with a warning: ``forward_names``).
MOVED = {
    "agreement": "comm.agreement",
    "allreduce": "data_parallel.allreduce",
    "averaging": "data_parallel.averaging",
    "communicator": "comm.communicator",
    "compression": "data_parallel.compression",
    "costmodel": "comm.costmodel",
    "downpour": "parameter_server.downpour",
    "hierarchical_server": "parameter_server.hierarchical",
    "hogwild": "data_parallel.hogwild",
    "hybrid_allreduce": "hybrid.allreduce",
    "hybrid_downpour": "hybrid.downpour",
    "hybrid_server": "hybrid.server",
    "neighbours": "data_parallel.neighbours",
    "node_exchange": "data_parallel.node_exchange",
    "partitioned": "tensor_parallel.strategy",
    "pipeline_executor": "pipeline.stage",
    "pipeline_partition": "meta.lv1.partition",
    "pipeline.partition": "meta.lv1.partition",  # a graph operation: Level 1 (recompute cuts too)
    "pipeline_schedule": "pipeline.schedule",
    "polling": "comm.polling",
    "quantization": "data_parallel.quantization",
    "rma": "parameter_server.rma",
    "sandblaster_portions": "sandblaster.portions",
    "sandblaster_rows": "sandblaster.rows",
    "sandblaster_shards": "sandblaster.shards",
    "shard_server": "parameter_server.shard_server",
    "sharded_optimizer": "data_parallel.sharded_optimizer",
    "shared_memory": "comm.shared_memory",
    "survival": "comm.survival",
    "tensor_parallel_ops": "tensor_parallel.ops",
    "tensor_parallel_plan": "tensor_parallel.plan",
    "topology": "comm.topology",
}

alias_modules(__name__, MOVED)
