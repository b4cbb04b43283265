"""What a strategy did on the wire, as a run reports it: bytes, phases, measured vs modelled."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import measure_link
from meta.lv3.strategy import Strategy
from meta.lv3.timeline import chrome_trace


def communication_report(strategy: Strategy, comm: Communicator, stream: TextIO,
                         trace: Path | None = None, state_bytes: int = 0) -> dict[str, float]:
    """Bytes and phase shares of the rank that writes the outputs (rank 0, unless it died),
    and its communication time per step against the alpha-beta model's prediction (printed by
    that rank under MPI); writes the step timeline as a Chrome trace to ``trace`` if given. A
    collective (the link is measured)."""
    link = measure_link(comm)
    report = strategy.report()
    report["comm_predicted_ms_per_step"] = strategy.predict_comm_s(link) * 1e3
    report["comm_measured_ms_per_step"] = report.get("communicate_ms_per_step", 0.0)
    if trace is not None:
        path = chrome_trace(strategy.timeline, comm, trace, strategy.role)
        if path is not None:
            print(f"meta: wrote the step timeline to {path}", file=stream, flush=True)
    if comm.is_root and comm.size > 1:
        synced = (f"; state, {state_bytes} bytes, averaged at each evaluation: "
                  f"{report.get('state_bytes_sent', 0):.0f} bytes in all" if state_bytes else "")
        print(f"meta: {strategy.name} step phases on rank {strategy.comm.rank} "
              f"({report['bytes_sent_per_step']:.0f} bytes sent per step{synced})\n"
              f"{strategy.timeline.format_summary()}\n"
              f"meta: communication per step: measured "
              f"{report['comm_measured_ms_per_step']:.3f} ms (the wait in the step above; "
              f"what moved overlapped with compute is not in it), predicted "
              f"{report['comm_predicted_ms_per_step']:.3f} ms ({link})", file=stream, flush=True)
    text = strategy.report_text()  # e.g. Downpour's staleness
    if comm.is_root and text:
        print(text, file=stream, flush=True)
    return report
