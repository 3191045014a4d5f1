"""`ddlrun --elastic`: a job whose survivors go on after a rank or a host is lost.

What ddlrun does differently with --elastic (or any of --min-np, --max-np,
--host-discovery-script, which imply it, as in horovodrun):
- mpirun gets `--with-ft ulfm` (Open MPI's fault tolerance: a dead rank is an error the
  survivors can recover from with MPIX shrink, not the end of the job). srun is refused
  (run.elastic_launcher: Slurm's PMIx plugin cancels the step when a rank dies); the srun
  command ddlrun would build keeps `--no-kill --kill-on-bad-exit=0` and ULFM on
  (OMPI_MCA_mpi_ft_enable) for the day a Slurm keeps the step.
- a whole host lost (its Open MPI daemon with it) still ends the job: PRRTE 3.0, the
  runtime of Open MPI 5.0, does not recover from a lost daemon.
- every rank sees DDL_ELASTIC=1, DDL_MIN_NP, DDL_MAX_NP (0: unbounded) and, with a
  discovery script, the host-update channel (discovery.py).
- ranks start and end through exitreport.py as always; under --elastic a failed rank's
  wrapper ends by SIGKILL, which Open MPI treats as a failure the survivors recover from.
- the job's status is the survivors': 0 when at least --min-np ranks finished with 0,
  with one line naming each rank lost (rank, host, how it ended). ddlrun ends the job at
  once (SIGTERM to the launcher) when fewer than --min-np ranks are left, and exits with
  the first lost rank's status; it does not wait for hosts to come back.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from .exitreport import Report, job_status
from .hosts import LaunchError, is_local


@dataclass
class Elastic:
    """The elastic settings of one ddlrun, checked (check())."""

    min_np: int = 1
    max_np: int | None = None
    discovery: str | None = None
    interval_s: float = 1.0
    timeout_s: float = 10.0
    slots_per_host: int = 1
    #: launch rank -> host, from the placement (a lost host sends no report)
    hosts: dict[int, str] = field(default_factory=dict)

    def check(self, np_: int | None) -> None:
        """Impossible bounds are refused before launch, naming the option to change."""
        if np_ is not None and self.min_np > np_:
            raise LaunchError(f"--min-np {self.min_np} is above -n {np_}: the job would "
                              f"start below its minimum; lower --min-np or raise -n")
        if self.max_np is not None and np_ is not None and self.max_np < np_:
            raise LaunchError(f"--max-np {self.max_np} is below -n {np_}: raise --max-np "
                              "or lower -n")
        if self.max_np is not None and self.max_np < self.min_np:
            raise LaunchError(f"--max-np {self.max_np} is below --min-np {self.min_np}")
        if not 0 < self.interval_s <= 3600 or not 0 < self.timeout_s <= 3600:
            raise LaunchError("--discovery-interval and --discovery-timeout are seconds in "
                              "(0, 3600]")

    def environ(self) -> dict[str, str]:
        return {"DDL_ELASTIC": "1", "DDL_MIN_NP": str(self.min_np),
                "DDL_MAX_NP": str(self.max_np or 0)}


def started(reports: list[Report]) -> dict[tuple[int, int], Report]:
    """(job, rank) -> its start report."""
    return {(r.job, r.rank): r for r in reports if r.kind == "start"}


def ended(reports: list[Report]) -> dict[tuple[int, int], Report]:
    return {(r.job, r.rank): r for r in reports if r.kind != "start"}


def running_per_host(reports: list[Report], launched: dict[int, str],
                     names: Collection[str] = ()) -> dict[str, int]:
    """The ranks that started (or were launched) and have not ended, per host, named as
    the placement and the discovery script name them (`names`): a rank reports its host
    name, which for this machine may be an alias such as localhost there."""
    def canon(host: str) -> str:
        if host in names or not is_local(host):
            return host
        return next((n for n in names if is_local(n)), host)

    live = {(1, r): h for r, h in launched.items()}
    live.update({k: canon(r.host) for k, r in started(reports).items() if k[0] > 1})
    for k in ended(reports):
        live.pop(k, None)
    out: dict[str, int] = {}
    for h in live.values():
        out[h] = out.get(h, 0) + 1
    return out


def too_few_left(reports: list[Report], np_: int, min_np: int) -> bool:
    """Fewer than min_np ranks can still finish: the launched and spawned ones less the
    failed ones."""
    total = len(set(started(reports)) | {(1, r) for r in range(np_)})
    failed = sum(1 for r in ended(reports).values() if r.failed)
    return total - failed < min_np


def _lost_line(r: Report, host: str) -> str:
    return f"{r.name} on {host or 'an unknown host'} {r.describe()}"


def elastic_status(reports: list[Report], launcher_status: int, el: Elastic, np_: int,
                   stopped: bool) -> tuple[int, str | None]:
    """ddlrun's exit status and its report for an elastic job: 0 when at least --min-np
    ranks finished with 0 (the launcher's own status is not theirs: mpirun may count the
    lost ranks); else the first failure's status, as without --elastic."""
    starts = started(reports)
    ends = ended(reports)
    where = {(1, r): h for r, h in el.hosts.items()}
    where.update({k: r.host for k, r in starts.items() if r.host})
    where.update({k: r.host for k, r in ends.items() if r.host})
    expected = set(starts) | {(1, r) for r in range(np_)}
    missing = sorted(k for k in expected if k not in ends)
    finished = [r for r in ends.values() if not r.failed]
    lost = [r for r in ends.values() if r.failed]
    lines = [_lost_line(r, where.get((r.job, r.rank), "")) for r in lost]
    lines += [f"{Report(k[1], 'exit', 0, job=k[0]).name} on "
              f"{where.get(k, 'an unknown host')} ended without a report (its host or its "
              "wrapper was lost)" for k in missing]
    if len(finished) >= el.min_np and not stopped:
        if not lines:
            return 0, None
        return 0, (f"ddlrun: elastic: {len(lines)} rank{'s' if len(lines) > 1 else ''} lost, "
                   f"{len(finished)} finished (--min-np {el.min_np}): " + "; ".join(lines))
    status, _ = job_status(lost, launcher_status if launcher_status else 1)
    why = (f"ddlrun: elastic: fewer than --min-np {el.min_np} ranks left "
           f"({len(finished)} finished, {len(lost) + len(missing)} lost"
           + (", the job was ended" if stopped else "") + ")")
    return status or 1, why + (": " + "; ".join(lines) if lines else "") + \
        f"; exit status {status or 1}"
