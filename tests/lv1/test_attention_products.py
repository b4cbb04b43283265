"""``benchmarks/attention_products.py`` times what it says: its SDPA graph lowers to one fused
attention node (split-head Transposes of K and V and the merge read through strides) under
every query-block and scratch setting, node by node under 'unfused', and every setting gives the
reference executor's output and gradients (so the settings it compares do the same step)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor
from meta.lv1.plan import runtime
from meta.lv1.plan.lowering import attention

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import attention_products  # noqa: E402

sys.path.remove(str(BENCHMARKS))

FUSED = ("k.t", "v.t", "scaled", "softmax", "mix", "y")


@pytest.mark.parametrize("causal", [True, False])
def test_every_setting_fuses_as_named_and_matches_the_reference(causal):
    n, h, t, d = 2, 3, 11, 4  # t not a multiple of the blocks: a short last block
    graph = attention_products.attention_graph(n, h, t, d, causal)
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((n, t, h, d)).astype(np.float32) for x in "qkv"}
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(
        feeds, outputs=["y"], wrt=["q", "k", "v"])
    saved = attention.BLOCK, attention.ENABLED, attention.SCRATCH_BYTES
    for setting in ("block 4", "block whole", "scratch 1", "unfused"):  # scratch 1: 2 heads
        ex = attention_products.executor(graph, setting, t, feeds)      # a chunk
        assert (attention.BLOCK, attention.ENABLED, attention.SCRATCH_BYTES) == saved, \
            "the setting leaked"
        place = ex.placement()
        for node in FUSED + (("masked",) if causal else ()):
            want = "fused into scores" if setting != "unfused" else None
            assert (place[node] == want) if want else not place[node].startswith("fused into "
                                                                                   "scores"), \
                (setting, node, place[node])
        values, grads = ex.inference_and_backprop(feeds, outputs=["y"], wrt=["q", "k", "v"])
        np.testing.assert_allclose(values["y"], ref_values["y"], rtol=1e-5, atol=1e-5)
        for x in "qkv":
            np.testing.assert_allclose(grads[x], ref_grads[x], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{setting}: d{x}")
