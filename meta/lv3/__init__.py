"""Level 3: communicators, fused buffers, sharded sampling and distributed optimizers.

Everything runs at size 1 without MPI; ``world()`` switches to MPI only under ``mpiexec``.
Strategies (``make_strategy``) wrap any Level 2 optimizer: ``Allreduce`` (with optional
gradient compression), ``ParameterServer``, ``AsyncParameterServer``, ``ModelAveraging`` and
``RingAveraging``, ``AsyncRMA`` (one-sided windows), ``Downpour`` and ``Sandblaster``
(DistBelief's two); ``Pipeline`` cuts the network into stages, one per rank;
``HybridAllreduce`` and ``HybridDownpour`` run data parallelism over pipelined replicas;
``Partitioned`` splits the layers' neurons over the ranks.
"""

from meta.lv3.allreduce import Allreduce, AllreduceOptimizer, allreduce_mean
from meta.lv3.averaging import ModelAveraging, RingAveraging
from meta.lv3.communicator import (
    Communicator,
    MPICommunicator,
    SingleProcessCommunicator,
    launched_size,
    world,
)
from meta.lv3.compression import Compressor, Float16, Sign, TopK, make_compressor
from meta.lv3.costmodel import Link, measure_link
from meta.lv3.downpour import Downpour
from meta.lv3.flat import FlatBuffer
from meta.lv3.hierarchical_server import HierarchicalParameterServer
from meta.lv3.hogwild import Hogwild
from meta.lv3.hybrid_allreduce import HybridAllreduce
from meta.lv3.hybrid_downpour import HybridDownpour
from meta.lv3.neighbours import NeighbourAveraging
from meta.lv3.parameter_server import AsyncParameterServer, ParameterServer
from meta.lv3.partitioned import Partitioned
from meta.lv3.pipeline import Pipeline
from meta.lv3.quantization import StochasticQuantizer, Ternary
from meta.lv3.rma import AsyncRMA
from meta.lv3.sampler import DistributedSampler
from meta.lv3.sandblaster import Sandblaster
from meta.lv3.strategies import (
    STRATEGIES,
    make_strategy,
    register_strategy,
    replica,
    strategy_class,
)
from meta.lv3.strategy import DEFAULT_CHUNK_BYTES, Strategy
from meta.lv3.timeline import Timeline, chrome_trace

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
