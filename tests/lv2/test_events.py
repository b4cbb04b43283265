from __future__ import annotations

import csv
import json

import pytest

from meta.lv2.events import CSVLog, EarlyStopping, JSONLinesLog, PlotMetrics, TimeBudget

from .test_trainer import make_trainer


def test_early_stopping_stops_and_says_why():
    stopper = EarlyStopping("test_accuracy", patience=1, mode="max", min_delta=1.0)
    trainer = make_trainer([stopper])
    history = trainer.fit(10)
    assert len(history) == 2  # epoch 2 cannot beat epoch 1 by a whole 1.0 of accuracy
    assert "early stopping: test_accuracy has not improved for 1 epoch(s)" in trainer.stop_reason


def test_early_stopping_names_a_missing_metric():
    with pytest.raises(KeyError, match="'val_loss' is not reported"):
        make_trainer([EarlyStopping("val_loss")]).fit(1)


def test_time_budget_stops_mid_epoch():
    trainer = make_trainer([TimeBudget(0.0)])
    trainer.fit(3)
    # the interrupted epoch ends early and is still evaluated and reported
    assert trainer.step == 1 and len(trainer.history) == 1
    assert "test_accuracy" in trainer.history[0]
    assert trainer.stop_reason.startswith("time budget of 0 s used up at step 1")


def test_logs_and_plot(tmp_path):
    events = [CSVLog(tmp_path / "m.csv"), JSONLinesLog(tmp_path / "m.jsonl"),
              PlotMetrics(tmp_path / "curves.png", title="blobs")]
    trainer = make_trainer(events)
    trainer.fit(2)
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert [int(float(r["epoch"])) for r in rows] == [1, 2]
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines[1]["test_accuracy"] == pytest.approx(trainer.history[1]["test_accuracy"])
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_plot_redraws_at_most_every_few_seconds_and_always_at_the_end(tmp_path):
    """The first epoch is drawn at once (a live view), later ones only after ``every_s``, and
    the file ends with every epoch however training ended (``finalize``)."""
    plot = PlotMetrics(tmp_path / "curves.png", every_s=3600)
    drawn = []
    real_draw = plot.draw
    plot.draw = lambda history: (drawn.append(len(history)), real_draw(history))
    trainer = make_trainer([plot])
    trainer.fit(3)
    assert drawn == [1, 3] and plot.drawn_epochs == 3, drawn
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
