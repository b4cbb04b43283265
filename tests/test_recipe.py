from __future__ import annotations

import textwrap

import pytest

from meta.recipe import AtLeast, AtMost, RecipeError, judge, load_recipe, make_recipe

GOOD = {"dataset": "mnist", "hidden": [64]}
MUTABLE = {"epochs": 2, "lr": 0.1, "seed": 0}
METRICS = {"test_accuracy": AtLeast(0.9)}


def write(tmp_path, body):
    path = tmp_path / "r.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_the_shipped_recipe_is_valid():
    r = load_recipe("recipes/mnist_mlp.py")
    assert r.definitions.hidden == (512, 512) and r.definitions.dataset == "mnist"
    assert r.metrics["test_accuracy"].bound == 0.975


def test_types_are_converted_and_defaults_filled():
    r = make_recipe("t", GOOD, {"lr": 1, "epochs": 3}, METRICS)
    assert r.definitions.lr == 1.0 and isinstance(r.definitions.lr, float)
    assert r.definitions.hidden == (64,) and r.definitions.batch_size == 128


def test_all_problems_are_reported_together():
    with pytest.raises(RecipeError) as info:
        make_recipe("t", {"dataset": "mnist", "lrr": 0.1, "hidden": "64"},
                    {"dataset": "mnist", "epochs": 2.5, "momentum": 1.5, "executor": "gpu"},
                    {"test_acuracy": AtLeast(0.9), "train_loss": 0.1})
    msg = str(info.value)
    assert "8 problem(s)" in msg
    assert "unknown key 'lrr' (did you mean 'lr'?)" in msg
    assert "'hidden' must be list of int" in msg
    assert "'epochs' must be int, got float 2.5" in msg
    assert "'momentum' must be below 1" in msg
    assert "'executor' must be one of reference, native, got 'gpu'" in msg
    assert "'dataset' is in both FIXED and MUTABLE" in msg
    assert "unknown metric 'test_acuracy' (did you mean 'test_accuracy'?)" in msg
    assert "'train_loss' must be AtLeast(x) or AtMost(x), got 0.1" in msg


def test_bool_is_not_an_int():
    with pytest.raises(RecipeError, match="'epochs' must be int, got bool"):
        make_recipe("t", {}, {"epochs": True}, METRICS)


def test_overrides_only_touch_mutable_keys():
    r = make_recipe("t", GOOD, MUTABLE, METRICS)
    assert r.with_overrides({"lr": "0.2", "epochs": "4"}).definitions.lr == 0.2
    with pytest.raises(RecipeError, match="'hidden' is FIXED in this recipe"):
        r.with_overrides({"hidden": "32"})
    with pytest.raises(RecipeError, match="'momentum' is not MUTABLE in this recipe"):
        r.with_overrides({"momentum": "0.5"})
    with pytest.raises(RecipeError, match="unknown key 'ephocs'"):
        r.with_overrides({"ephocs": "3"})
    with pytest.raises(RecipeError, match="'epochs': cannot read 'many' as int"):
        r.with_overrides({"epochs": "many"})
    with pytest.raises(RecipeError, match="'lr' must be positive"):
        r.with_overrides({"lr": "-1"})


def test_override_parsing_by_type():
    r = make_recipe("t", {}, {"hidden": [8], "nesterov": False, "executor": "reference"},
                    METRICS)
    d = r.with_overrides({"hidden": "[32, 16]", "nesterov": "yes", "executor": "native"})
    assert d.definitions.hidden == (32, 16) and d.definitions.nesterov is True
    assert d.definitions.executor == "native"


def test_recipe_files(tmp_path):
    ok = write(tmp_path, """
        from meta.recipe import AtLeast
        FIXED = {"dataset": "mnist"}
        MUTABLE = {"epochs": 1}
        METRICS = {"test_accuracy": AtLeast(0.5)}
    """)
    assert load_recipe(ok).name == "r"
    with pytest.raises(RecipeError, match="missing section METRICS"):
        load_recipe(write(tmp_path, "FIXED = {}\nMUTABLE = {}\n"))
    with pytest.raises(RecipeError, match="unknown section 'METRIC' .*did you mean 'METRICS'"):
        load_recipe(write(tmp_path, "FIXED = {}\nMUTABLE = {}\nMETRIC = {}\n"))
    with pytest.raises(RecipeError, match="failed to load: NameError"):
        load_recipe(write(tmp_path, "FIXED = {'lr': undefined_name}\n"))
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.py")


def test_thresholds_and_verdict():
    assert AtLeast(0.9).accepts(0.9) and not AtLeast(0.9).accepts(0.89)
    assert AtMost(10).accepts(10) and not AtMost(10).accepts(10.1)
    r = make_recipe("t", {}, {}, {"test_accuracy": AtLeast(0.9), "train_time_s": AtMost(5)})
    good = judge(r, {"test_accuracy": 0.95, "train_time_s": 4.0}, [])
    assert good.passed and "t: PASS" in good.table()
    bad = judge(r, {"test_accuracy": 0.95, "train_time_s": 6.0}, [])
    assert not bad.passed and bad.checks == {"test_accuracy": True, "train_time_s": False}
    assert "FAIL" in bad.table()
    with pytest.raises(RecipeError, match="direction"):
        from meta.recipe import Threshold
        Threshold(1.0, "about")


def test_training_keys_are_validated():
    with pytest.raises(RecipeError) as info:
        make_recipe("t", {}, {"optimizer": "adamm", "augmentation": ["crop", "rotate"],
                              "lr_schedule": "step", "weight_decay": -1.0}, METRICS)
    msg = str(info.value)
    assert "'optimizer' must be one of adadelta, adagrad, adam, adamw, rmsprop, sgd" in msg
    assert "lbfgs, cg" in msg
    assert "'augmentation' may list crop, flip, cutout, got ['rotate']" in msg
    assert "'lr_schedule' 'step' needs 'lr_decay_epochs'" in msg
    assert "'weight_decay' must not be negative" in msg


def test_registered_optimizers_become_choices():
    from meta.lv2.optimizers import OPTIMIZERS, register_optimizer, sgd

    register_optimizer("plain_for_test")(lambda lr: sgd(lr))
    try:
        r = make_recipe("t", {"optimizer": "plain_for_test"}, {"augmentation": ["flip"]},
                        METRICS)
        assert r.definitions.optimizer == "plain_for_test"
        assert r.with_overrides({"augmentation": "crop,cutout"}).definitions.augmentation \
            == ("crop", "cutout")
    finally:
        del OPTIMIZERS["plain_for_test"]
