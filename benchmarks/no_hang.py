"""Does a job end when one of its ranks is SIGKILLed, whatever mpiexec's options? (Issue 28.)

Run:  python benchmarks/no_hang.py [--runs 10] [--strategies allreduce downpour ...]

For each strategy's MNIST recipe, ``--runs`` times: start it under MPICH's ``mpiexec
-disable-auto-cleanup`` with each rank under ``sh -c`` (as a job script runs it; started
directly, Hydra SIGKILLs the others itself; ``--shells-ignore-usr1``: each shell ignores
the SIGUSR1 Hydra then sends, which ends it otherwise), SIGKILL rank ``run % n``
``--kill-after`` seconds into training, and wait up to 30 s for the job to end (then end it
ourselves: a hang). Prints,
per strategy: how many runs ended within 10 s, the largest and the median seconds from the kill
to the job's end, mpiexec's exit statuses, how many runs printed exactly one
``meta: rank R ... died`` line naming the killed rank (and how many named another rank too),
and one such line. The machine's CPU and load average are printed before and after, since a
loaded machine starts ranks slowly (it does not change when a death is seen: every 0.1 s).
Needs the MNIST files ($META_MNIST_DIR, or the loaders' download) and MPICH's mpiexec.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.test_no_hang import (  # noqa: E402  (the test's own launch and kill)
    DIED,
    KILLS,
    NO_HANG_S,
    Kill,
    kill_during_training,
    wrapped_job,
)

STRATEGIES = {recipe[6:-3]: (recipe, n) for recipe, n, _ in KILLS}  # mnist_X.py -> X


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summary(name: str, n: int, victims: list[int], kills: list[Kill]) -> list[str]:
    """The table's row for one strategy, and the lines that were not as expected."""
    host = socket.gethostname()
    seconds = [k.seconds for k in kills]
    ended = sum(not k.hung and k.seconds < NO_HANG_S for k in kills)
    one, also_other, example, odd = 0, 0, "", []
    for victim, kill in zip(victims, kills):
        lines = DIED.findall(kill.out)
        named = f"rank {victim} (pid {kill.pid} on {host})"
        if len(lines) == 1 and named in lines[0]:
            one += 1
            if lines[0].count("rank ") > 1:
                also_other += 1
            example = example or lines[0]
        if kill.hung or kill.rc == 0 or len(lines) != 1 or named not in lines[0] \
                or "Traceback" in kill.out:
            tail = "\n".join(f"    | {line}" for line in kill.out.splitlines()[-12:])
            odd.append(f"  {name}, rank {victim} killed: exit {kill.rc}, "
                       f"{kill.seconds:.2f} s{', HUNG' if kill.hung else ''}; lines {lines}; "
                       f"the output's end:\n{tail}")
    statuses = ", ".join(f"{rc} x{count}" for rc, count in sorted(Counter(
        k.rc for k in kills).items()))
    row = (f"| {name} | {n} | {ended}/{len(kills)} | {max(seconds):.2f} | "
           f"{statistics.median(seconds):.2f} | {statuses} | {one}/{len(kills)} "
           f"({also_other} also naming another) | `{example}` |")
    return [row, *odd]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES),
                        default=list(STRATEGIES))
    parser.add_argument("--shells-ignore-usr1", action="store_true",
                        help="each rank's shell runs `trap '' USR1` first (Hydra's SIGUSR1 "
                             "ends the shells otherwise)")
    parser.add_argument("--kill-after", type=float, default=2.0,
                        help="seconds into training (after the epoch table's header)")
    args = parser.parse_args()
    print(f"machine: {machine()}; Python {platform.python_version()}; "
          f"load average before: {load()}; shells ignore SIGUSR1: {args.shells_ignore_usr1}",
          flush=True)
    rows, odd = [], []
    for name in args.strategies:
        recipe, n = STRATEGIES[name]
        victims = [run % n for run in range(args.runs)]
        kills = []
        for run, victim in enumerate(victims):
            with tempfile.TemporaryDirectory() as out:
                job = wrapped_job(recipe, n, Path(out) / "out", args.shells_ignore_usr1)
                kill = kill_during_training(job, victim, after_s=args.kill_after)
            kills.append(kill)
            print(f"{name} run {run + 1}: rank {victim} killed, exit {kill.rc}, "
                  f"{kill.seconds:.2f} s{' HUNG' if kill.hung else ''}", flush=True)
        row, *bad = summary(name, n, victims, kills)
        rows.append(row)
        odd += bad
    print(f"\nload average after: {load()}\n")
    print(f"| strategy | ranks | ended within {NO_HANG_S} s | max s | median s | exit statuses "
          "| one line naming the killed rank | the line |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if odd:
        print("\nnot as expected:\n" + "\n".join(odd))
    return 0 if not odd else 1


if __name__ == "__main__":
    sys.exit(main())
