"""``meta plan``: predict, rank and plot the step time of parallel strategies for a recipe.

Above Level 3: it reads recipes (``meta.run.recipe``), builds their networks (Level 1) and reuses
Level 3's α-β formulas (``meta.lv3.comm.costmodel``) and pipeline simulator
(``meta.lv3.pipeline.schedule``) without a communicator of P ranks, so a machine of 4,096
ranks can be planned on a laptop. One component per file: ``machine`` (the described
cluster, TOML), ``workload`` (what a recipe's step costs on one rank), ``calibrate`` (measure
this machine), ``models`` (one model per strategy and option), ``memory`` (one rank's
memory by part: the ZeRO paper's formulas and meta's own buffers; ``meta run``'s
``memory_limit_gb`` checks with it too), ``report`` (table, ``--set``
lines, plot), ``command`` (the ``meta plan`` subcommand), ``virtual_time`` (Downpour and the
asynchronous parameter server with N virtual workers on simulated clocks: accuracy against
time, ``--simulate``).
"""

from __future__ import annotations
