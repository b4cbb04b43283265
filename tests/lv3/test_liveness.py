"""The watchdog's parts without MPI: how it tells a live peer from a dead one, and how it ends
a process (one line on the lowest survivor, exit 3). The whole, under mpiexec, is
tests/e2e/test_no_hang.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from meta.lv3.comm.liveness import EXIT_RANK_DIED, Peer, alive, me


def test_a_running_process_is_alive() -> None:
    assert alive(me(0))


def test_a_reaped_process_a_zombie_and_a_reused_pid_are_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    peer = Peer(1, me(1).host, child.pid, "")
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not alive(peer)
    child.wait()
    assert not alive(peer)
    assert not alive(me(0)._replace(started="1"))  # this pid, another process's start time


def test_the_lowest_survivor_names_the_dead_rank_and_every_survivor_exits_3() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    script = textwrap.dedent(f"""
        import time
        from meta.lv3.comm.liveness import Peer, Watchdog, me
        rank = {{rank}}
        dead = Peer(0, me(0).host, {child.pid}, "")
        Watchdog(me(rank), [dead, Peer(1 if rank == 2 else 2, me(0).host, {os.getpid()}, "")], 3).start()
        time.sleep(20)
        print("not ended")
    """)
    for rank, says in ((1, True), (2, False)):
        done = subprocess.run([sys.executable, "-c", script.format(rank=rank)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == EXIT_RANK_DIED, done
        line = f"meta: rank 0 (pid {child.pid} on {me(0).host.split()[0]}) died; ending this job"
        assert done.stderr.splitlines() == ([line] if says else []), done
        assert "not ended" not in done.stdout
