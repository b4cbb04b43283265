"""meta components reads as plain text (issue 45 item 7): whole summaries, no
reStructuredText markup, lines a terminal shows whole; one name per concept (a former name in
a recipe read with a FutureWarning, which a command-line user sees; in Python's API with a
DeprecationWarning); only the options that apply."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from meta.cli import main
from meta.common.component import Option, Registry, first_sentence, plain
from meta.run.recipe import AtLeast, RecipeError, make_recipe, registry

METRICS = {"test_accuracy": AtLeast(0.5)}


def test_components_print_whole_plain_summaries(capsys) -> None:
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"``|:(class|func|meth|mod|attr):`", out), \
        [line for line in out.splitlines() if "`" in line][:5]
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "ResNet-20 (He et al. 2016, CIFAR variant)" in out  # was cut at "et al."
    # the whole first paragraph, not its first sentence
    assert "Optimizer state (momentum) stays local." in out


def test_plain_text_and_first_sentence() -> None:
    assert plain("``every`` steps; :class:`~meta.lv3.Strategy`; :func:`build`; `x`_") == \
        "every steps; Strategy; build; x"
    assert first_sentence("ResNet-20 (He et al. 2016). More.") == "ResNet-20 (He et al. 2016)."
    assert first_sentence("Steps, e.g. two. Then.") == "Steps, e.g. two."


def test_a_former_option_name_is_read_with_a_warning_naming_the_new_one() -> None:
    with pytest.warns(FutureWarning, match="option 'every' is now 'average_every'"):
        recipe = make_recipe("r", {"distributed": "model_averaging", "every": 4}, {}, METRICS)
    assert recipe.definitions.choices["distributed"].values()["average_every"] == 4
    with pytest.warns(FutureWarning, match="option 'every' is now 'average_every'"):
        nested = make_recipe("r", {"distributed": {"name": "model_averaging", "every": 3}}, {},
                             METRICS)
    assert nested.definitions.choices["distributed"].values()["average_every"] == 3
    with pytest.warns(FutureWarning, match="option 'vocab' is now 'vocab_size'"):
        lm = make_recipe("r", {"model": {"name": "gpt", "vocab": 7}}, {}, METRICS)
    assert lm.definitions.choices["model"].values()["vocab_size"] == 7
    assert "vocab" not in registry("model")["gpt"].options  # one name offered
    reg = Registry("example_alias")
    reg.add("c", lambda new=1: new, {"new": Option(1, "the new name", aliases=("old",))})
    _, problems = reg["c"].checked({"old": 2, "new": 3})
    assert problems == ["example_alias 'c': options 'old' and 'new' are one option ('old' is "
                        "its former name): give 'new' only"]


def test_model_averaging_takes_the_former_keyword_with_a_warning() -> None:
    from meta.lv2.optimizers import Optimizer, sgd
    from meta.lv3.data_parallel.averaging import ModelAveraging

    with pytest.warns(DeprecationWarning, match="'every' is now 'average_every'"):
        old = ModelAveraging(Optimizer(sgd(0.1), {"w": np.zeros(2)}), every=3)
    assert old.average_every == old.every == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ModelAveraging(Optimizer(sgd(0.1), {"w": np.zeros(2)}),
                              average_every=2).average_every == 2


@pytest.mark.parametrize("strategy", ["parameter_server", "async_parameter_server", "async_rma",
                                      "downpour", "hierarchical_ps", "hogwild"])
def test_strategies_that_never_chunk_do_not_offer_chunk_bytes(strategy) -> None:
    """chunk_bytes sizes the chunks ``Strategy.average`` allreduces; where a strategy never
    calls it, setting it did nothing, silently: now it is refused, naming who takes it."""
    assert "chunk_bytes" not in registry("strategy")[strategy].options
    with pytest.raises(RecipeError, match="'chunk_bytes' is an option of distributed"):
        make_recipe("r", {"distributed": strategy, "chunk_bytes": 1024}, {}, METRICS)
    for chunked in ("allreduce", "model_averaging", "ring", "neighbours"):
        assert "chunk_bytes" in registry("strategy")[chunked].options


def test_an_unknown_kind_is_one_line(capsys) -> None:
    assert main(["components", "strategies"]) == 2
    assert capsys.readouterr().err.count("\n") == 1

