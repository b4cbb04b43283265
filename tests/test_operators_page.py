"""docs/reference/operators.md is what the registry gives today (regenerating changes nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gen_operators_page  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_committed_page_is_up_to_date() -> None:
    assert gen_operators_page.PAGE.read_text() == gen_operators_page.render(), \
        "docs/reference/operators.md is out of date: run python tools/gen_operators_page.py"


def test_page_states_known_facts() -> None:
    rows = {(r[0], r[1]): r for r in gen_operators_page.rows()}
    assert rows[("ai.onnx", "Conv")][3:] == ("yes", rows[("ai.onnx", "Conv")][4], "kernel")
    assert rows[("ai.onnx", "Relu")][4].startswith("yes")
    assert rows[("ai.onnx", "Equal")][3] == "zero"  # a comparison: no input has a gradient
    assert "13" in rows[("ai.onnx", "Softmax")][2].split(", ")


def test_the_page_lists_meta_s_library_whatever_else_is_registered() -> None:
    """A program (or an earlier test in the same process) that registers its own operator
    does not change the page: it documents meta's operators (the full suite found it)."""
    from meta.lv0 import Operator, register
    from meta.lv0.registry import scratch

    with scratch():
        @register("PageTestOp", domain="ai.test.page")
        class PageTestOp(Operator):
            def forward(self, ctx, x):
                return (x,)

        assert "PageTestOp" not in gen_operators_page.render()
        assert gen_operators_page.PAGE.read_text() == gen_operators_page.render()
