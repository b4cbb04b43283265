"""Lowerings by kernel family, one module per file of ``cpp/plan/`` (conv, eltwise, loss,
matmul, norm, pool, tensor, embedding: Gather by ids that vary) and ``views`` for what costs
no kernel (views, Gather of one index, Transpose). ``meta.lv1.plan.kernels`` dispatches to
them."""
