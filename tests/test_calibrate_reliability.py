"""meta plan --calibrate says when its figures cannot be trusted (issue 45 item 4): the step
measured in rounds whose spread is shown, the load and this process's CPU share during them,
a warning naming the spread when a noisy step is injected, no infinite rate printed, and the
plan quoting the calibration's own step."""

from __future__ import annotations

import re

import pytest

from meta.cli import main
from meta.lv3.comm.costmodel import Link
from meta.planner import calibrate as cal
from meta.planner.calibrate import Conditions


def test_a_steady_step_on_a_quiet_machine_has_no_warning() -> None:
    quiet = Conditions((0.0100, 0.0102, 0.0101), 5, (0.1, 0.2), 0.98, 4, 1)
    assert quiet.warnings() == []
    assert abs(quiet.step_s - 0.0101) < 1e-12 and quiet.spread == pytest.approx(0.0198, 1e-2)
    assert "rounds of 5 steps: 10.000, 10.200, 10.100 ms" in str(quiet)


def test_each_reason_is_named() -> None:
    noisy = Conditions((0.0815, 0.0103, 0.370), 5, (0.5, 0.5), 1.0, 4, 1)
    (spread,) = noisy.warnings()
    assert "81.5, 10.3, 370 ms" in spread and "spread of 441 %" in spread
    loaded = Conditions((0.01, 0.01, 0.01), 5, (6.0, 7.0), 1.0, 4, 1)
    assert loaded.warnings() == ["other work loaded the machine: load average 6.0 beyond this "
                                 "calibration's 1 rank(s) on 4 cores"]
    starved = Conditions((0.01, 0.01, 0.01), 5, (None, None), 0.4, 4, 1)
    (cpu,) = starved.warnings()
    assert "a CPU for 40 %" in cpu and starved.other_load is None
    # 4 ranks on 2 cores: half a CPU each is their due, not a warning
    assert Conditions((0.01,) * 3, 5, (4.0, 4.0), 0.5, 2, 4).warnings() == []


def test_a_fit_of_zero_is_not_an_infinite_rate() -> None:
    text = str(Link(alpha=2e-6, beta=0.0))
    assert "inf" not in text and "beta not measurable" in text and "2.00 us" in text
    assert str(Link(1e-6, 1e-10)) == "alpha 1.00 us, beta 0.100 ns/B (10.00 GB/s)"
    assert "alpha not measurable" in str(Link(0.0, 1e-10))


def test_a_noisy_step_is_warned_of_and_the_plan_quotes_the_calibration(
        tmp_path, capsys, monkeypatch, mnist_dir) -> None:
    """Each round's steps slowed by a different factor (as other work on a shared machine
    does): the calibration warns naming the spread, writes it into the machine's source, and
    a plan with that machine warns again and quotes the same step as the calibration."""
    factors = iter([1.0, 9.0, 0.25] + [1.0] * 10)
    real = cal._timed

    def noisy(*args, **kwargs):
        f, b, steps, update, profiled = real(*args, **kwargs)
        k = next(factors)
        return f, b, [s * k for s in steps], update, profiled

    monkeypatch.setattr(cal, "_timed", noisy)
    out = tmp_path / "noisy.toml"
    assert main(["plan", "mnist_mlp", "--calibrate", str(out), "--steps", "2",
                 "--set", "batch_size=8"]) == 0
    text = capsys.readouterr().out
    assert "inf" not in text.replace("info", ""), text
    warning = next(line for line in text.splitlines() if "warning" in line)
    assert re.search(r"the step's 3 rounds of 2 steps took .* ms: a spread of \d+ % of the "
                     r"median", warning), warning
    assert warning.endswith("the fit is unreliable (calibrate again on a quiet machine, or "
                            "with more --steps or --repeats)")
    calibrated = re.search(r"step ([0-9.]+) ms at batch 8", text).group(1)
    monkeypatch.setattr(cal, "_timed", real)
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--machine", str(out),
                 "--set", "batch_size=8"]) == 0
    captured = capsys.readouterr()
    assert f"one rank's step {calibrated} ms at batch 8 (the calibration's step)" in \
        captured.out, captured.out
    assert "warning: calibration unreliable: the step's 3 rounds" in captured.err
    assert captured.err.rstrip().endswith("(this plan uses it)")
    assert "inf" not in captured.out.replace("info", "")
    # at another batch: scaled, and said so with the calibration's figure
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--machine", str(out)]) == 0
    assert f"scaled from the calibration's {calibrated} ms at batch 8" in \
        capsys.readouterr().out


def test_steps_and_repeats_must_be_positive(capsys) -> None:
    assert main(["plan", "--calibrate", "x.toml", "--repeats", "0"]) == 2
    assert capsys.readouterr().err == \
        "meta plan: --steps 5 --repeats 0: both must be >= 1\n"
