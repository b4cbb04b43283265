"""How ranks talk: the only place meta touches MPI.

``communicator`` (buffer and object collectives, point to point, one-sided windows; a size-1
communicator so everything runs without MPI), ``tags`` (every message tag, one table),
``polling`` (waiting on requests without spinning), ``survival`` (ULFM: going on without a
dead rank), ``liveness`` (a watchdog that ends the job when a rank of its host dies),
``topology`` (neighbourhood collectives), ``shared_memory`` (MPI-3 windows one machine shares),
``agreement`` (ranks agree on the run before training) and ``costmodel`` (the alpha-beta
model the strategies predict with). Strategies speak only to these modules; none of them
imports mpi4py (tests/test_layers.py checks it).
"""
