"""MPI checks of ``meta.lv3.comm.agreement`` and of what ends a job, written once.

pytest runs the checks in-process at size 1; under MPI every rank runs them as a script:

    mpiexec -n 2 python tests/lv3/comm/agreement_checks.py [check_name ...]

``python tests/lv3/comm/agreement_checks.py --raise-on-rank R`` instead raises on rank R before
a collective the others wait in: the job must end at once (exit 2), not hang.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv3 import Communicator, world
from meta.lv3.comm.agreement import AgreementError, _ranks, agree_on
from tests.checks import run_checks

DEFINITIONS = {"recipe": "mnist_mlp", "lr": 0.1, "hidden": [512, 512], "epochs": 5}


def _refused(comm: Communicator, payload: dict) -> str:
    """The message every rank gets; the ranks can go on communicating after it."""
    try:
        agree_on(comm, payload)
    except AgreementError as err:
        message = str(err)
    else:
        raise AssertionError(f"rank {comm.rank}: {payload} was accepted")
    assert "\n" not in message, message
    everyone = comm.gather_obj(message)
    assert comm.rank != 0 or len(set(everyone)) == 1, everyone  # one message, on every rank
    return message


def check_equal_payloads_agree(comm: Communicator) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    agree_on(comm, {**DEFINITIONS, "data": data, "none": None, "nested": {"b": 1, "a": (1, 2)}})
    agree_on(comm, {})


def check_a_different_value_is_named_with_its_ranks(comm: Communicator) -> None:
    if comm.size == 1:
        return
    lr = 0.2 if comm.rank == 1 else 0.1
    message = _refused(comm, {**DEFINITIONS, "lr": lr})
    others = "0" if comm.size == 2 else "0, " + ", ".join(map(str, range(2, comm.size)))
    rank_word = "rank" if comm.size == 2 else "ranks"
    assert message == (f"ranks disagree on the run: 'lr' (0.1 on {rank_word} {others}; 0.2 on "
                       f"rank 1); start every rank with the same recipe, --set values and data"), \
        message


def check_missing_keys_and_arrays_are_named(comm: Communicator) -> None:
    if comm.size == 1:
        return
    payload = dict(DEFINITIONS)
    data = np.zeros((1000, 784), np.float32)
    if comm.rank == comm.size - 1:
        del payload["epochs"]
        data[500, 3] = 1.0  # one value in the middle of a large array
    message = _refused(comm, {**payload, "train data": data})
    first = _ranks(list(range(comm.size - 1)))
    assert f"'epochs' (5 on {first}; missing on rank {comm.size - 1})" in message, message
    assert "'train data' (float32 array (1000, 784) #" in message, message
    assert "'lr'" not in message and "'hidden'" not in message, message


def check_many_differing_keys_stay_one_line(comm: Communicator) -> None:
    if comm.size == 1:
        return
    payload = {f"key{i}": comm.rank * 1000 + i for i in range(20)}
    message = _refused(comm, payload)
    assert "'key0'" in message and "'key5'" in message and "'key6'" not in message, message
    assert ", and 14 more;" in message, message


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_equal_payloads_agree,
        check_a_different_value_is_named_with_its_ranks,
        check_missing_keys_and_arrays_are_named,
        check_many_differing_keys_stay_one_line,
    )
}


def main(argv: list[str]) -> int:
    comm = world()
    if argv[:1] == ["--raise-on-rank"]:
        if comm.rank == int(argv[1]):
            raise OSError(f"rank {comm.rank} cannot read its data")
        comm.barrier()  # the others wait here for a rank that will never come
        return 0
    return run_checks(comm, CHECKS, argv or list(CHECKS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
