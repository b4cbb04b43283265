"""Level 3: communicators, fused buffers, sharded sampling and distributed optimizers.

Everything runs at size 1 without MPI; ``world()`` switches to MPI only under ``mpiexec``.
"""

from meta.lv3.allreduce import AllreduceOptimizer, allreduce_mean
from meta.lv3.communicator import (
    Communicator,
    MPICommunicator,
    SingleProcessCommunicator,
    launched_size,
    world,
)
from meta.lv3.flat import FlatBuffer
from meta.lv3.sampler import DistributedSampler

__all__ = [
    "AllreduceOptimizer",
    "Communicator",
    "DistributedSampler",
    "FlatBuffer",
    "MPICommunicator",
    "SingleProcessCommunicator",
    "allreduce_mean",
    "launched_size",
    "world",
]
