"""Parameter servers: ranks that hold the parameters, workers that fetch and push.

``central`` (one server: consistent and asynchronous), ``rma`` (the asynchronous one through
one-sided windows), ``downpour`` (DistBelief's sharded servers, each shard a ``shard_server``)
and ``hierarchical`` (servers as a tree).
"""

from meta.common.moved import forward_names
from meta.lv3.parameter_server.central import AsyncParameterServer, ParameterServer
from meta.lv3.parameter_server.downpour import Downpour
from meta.lv3.parameter_server.hierarchical import HierarchicalParameterServer
from meta.lv3.parameter_server.rma import AsyncRMA

__all__ = ["AsyncParameterServer", "AsyncRMA", "Downpour", "HierarchicalParameterServer",
           "ParameterServer"]
# what else the module meta.lv3.parameter_server held, before it became this package
__getattr__ = forward_names(__name__, "meta.lv3.parameter_server.central")
