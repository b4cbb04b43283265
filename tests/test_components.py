"""Components with declared options, and adding one: a new file and its test, nothing else."""

from __future__ import annotations

import textwrap

import pytest

from meta.common.component import ComponentError, Option, Registry
from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import load_recipe
from meta.run.runner import RecipeRun


def test_options_convert_check_and_parse():
    lr = Option(0.1, "learning rate", above=0.0)
    assert lr.convert("lr", 1) == 1.0 and lr.parse("lr", "0.5") == 0.5
    for bad, message in ((0, "must be above 0"), (True, "must be float"),
                         (float("nan"), "must be a number")):
        with pytest.raises(ComponentError, match=message):
            lr.convert("lr", bad)
    widths = Option((8,), "widths", low=1)
    assert widths.convert("w", [4, 2]) == (4, 2) and widths.parse("w", "[3, 5]") == (3, 5)
    with pytest.raises(ComponentError, match="must be at least 1, got 0"):
        widths.convert("w", [4, 0])
    with pytest.raises(ComponentError, match="may list a, b, got \\['c'\\]"):
        Option((), type=tuple[str, ...], choices=("a", "b")).convert("x", ["a", "c"])


def test_a_registry_derives_options_and_refuses_a_second_owner():
    things = Registry("thing", context=("size",))

    def small(size, depth=2, name="x"):
        return (size, depth, name)

    component = things.add("small", small)
    assert list(component.options) == ["depth", "name"]  # context is not an option
    assert component.build(3, depth=4) == (3, 4, "x")
    assert component.check({"dpeth": 1}) == [
        "thing 'small': unknown option 'dpeth' (did you mean 'depth'?)"]
    things.add("small", small)  # the same definition again (a recipe loaded twice): fine
    with pytest.raises(ComponentError, match="already registered by .*small"):
        things.add("small", lambda size: size)
    with pytest.raises(ComponentError, match="unknown thing 'smal' \\(did you mean 'small'"):
        things["smal"]


def test_adding_a_dataset_and_a_strategy_is_one_new_file_each(tmp_path):
    """What a user writes: a module per component beside the recipe, nothing in meta."""
    (tmp_path / "blobs.py").write_text(textwrap.dedent('''
        import numpy as np
        from meta.common.component import Option
        from meta.lv2 import register_dataset

        @register_dataset("blobs", n=Option(400, "examples per split", low=10))
        def blobs(seed, n):
            rng = np.random.default_rng(seed)
            y = rng.integers(0, 3, (2, n))
            centres = np.random.default_rng(1).standard_normal((3, 5)) * 3
            return [(centres[y[i]] + rng.standard_normal((n, 5)), y[i]) for i in (0, 1)]
    '''))
    (tmp_path / "plain_sgd.py").write_text(textwrap.dedent('''
        from meta.lv3 import Strategy, register_strategy

        @register_strategy("local_only")
        class LocalOnly(Strategy):
            """Each rank steps alone (no communication at all)."""
            name = "local_only"
            consistent = False

            def step(self, grads):
                self.optimizer.step(grads)

            def predict_comm_s(self, link):
                return 0.0
    '''))
    recipe = tmp_path / "mine.py"
    recipe.write_text(textwrap.dedent('''
        import blobs, plain_sgd
        from meta.run.recipe import AtLeast
        FIXED = {"dataset": {"name": "blobs", "n": 300}, "model": {"name": "mlp", "hidden": [16]},
                 "distributed": "local_only"}
        MUTABLE = {"epochs": 3, "batch_size": 20, "lr": 0.05}
        METRICS = {"test_accuracy": AtLeast(0.9)}
    '''))
    outcome = RecipeRun(load_recipe(recipe), SingleProcessCommunicator(), output_dir=tmp_path,
                        progress=False, export_onnx=False).execute()
    assert outcome.passed, outcome.metrics
