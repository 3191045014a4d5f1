"""An elastic job whose MPI connections on one host are cut (a network fault, not a death):
the survivors must still agree on one world.

Open MPI's fault tolerance takes the peers of a broken TCP connection for dead. Cut every
MPI connection of one host (`ss -K` in its namespace, on the TCP ports the job's MPI uses)
and that host's ranks see everyone else fail while the others see them fail: without a
check, each side shrinks to a world of its own and both finish, with different parameters
(seen: worlds of 2 and 6 from 8 ranks, exit status 0). libddl's liveness watcher, whose
own connections are untouched, knows both sides are alive: the side left in the minority
leaves as a failed rank, and the job goes on in one world.

Skipped, with the reason, without root / ip netns, or where `ss -K` cannot destroy a
socket."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterkit import BIN, REASON, WORKERS
from ddl_tools import cluster

PORTS = (21000, 21099)  # the job's MPI (btl tcp) listens here, so the cut spares the rest


def _cannot_destroy_sockets() -> str | None:
    """Why `ss -K` cannot cut a connection here (a kernel without INET_DIAG_DESTROY, no
    ss), or None: a loopback connection is cut and its client must see the error."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        port = lst.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            srv, _ = lst.accept()
            with srv:
                try:
                    subprocess.run(["ss", "-K", "-Htn", "dst", "127.0.0.1", "dport", "=",
                                    f":{port}"], capture_output=True, timeout=10, check=False)
                except (OSError, subprocess.SubprocessError) as e:
                    return f"ss cannot run: {e}"
                try:
                    cli.send(b"x")
                    time.sleep(0.05)
                    cli.send(b"x")
                except OSError:
                    return None
    return "ss -K does not destroy sockets on this kernel (CONFIG_INET_DIAG_DESTROY)"


NO_CUT = _cannot_destroy_sockets() if REASON is None else None
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300),
              pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}"),
              pytest.mark.skipif(NO_CUT is not None, reason=f"cutting connections: {NO_CUT}")]


def cut_mpi_connections(c: cluster.Cluster, host: str) -> int:
    """Destroy every TCP connection of `host` to or from the MPI ports; how many."""
    lo, hi = PORTS
    flt = (f"( sport >= :{lo} and sport <= :{hi} ) or ( dport >= :{lo} and dport <= :{hi} )")
    listed = subprocess.run(["ip", "netns", "exec", host, "ss", "-Htn", flt],
                            capture_output=True, text=True, check=True).stdout
    subprocess.run(["ip", "netns", "exec", host, "ss", "-K", "-Htn", flt],
                   capture_output=True, text=True, check=True)
    return len([line for line in listed.splitlines() if line.strip()])


def run_and_cut(c: cluster.Cluster, tmp_path: Path, names: list[str]) -> tuple[int, str, str, int]:
    """The job on `names`, the first host's MPI connections cut at its fault step: how many
    connections were cut, its stdout, stderr and exit status."""
    trigger = tmp_path / "trigger"
    trigger.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", DDL_TIMEOUT="60", TRIGGER=str(trigger))
    job = subprocess.Popen(
        [str(BIN / "ddlrun"), *c.ddlrun_args(), "-H", ",".join(f"{h}:2" for h in names),
         "--elastic", "-n", str(2 * len(names)), "-x", "TRIGGER", "--mpi-args",
         f"--mca btl_tcp_port_min_v4 {PORTS[0]} --mca btl_tcp_port_range_v4 "
         f"{PORTS[1] - PORTS[0] + 1}",
         sys.executable, str(WORKERS / "elastic_netfault.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        until = time.monotonic() + 120
        while not trigger.exists() and job.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        assert trigger.exists(), "the job never reached its fault step"
        cut = cut_mpi_connections(c, names[0])
        try:
            out, err = job.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            job.terminate()  # ddlrun ends its ranks and reports what it knows
            out, err = job.communicate(timeout=60)
            pytest.fail(f"the job hung after the cut\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    return cut, out, err, job.returncode


def crashed_in_mpi(err: str, ranks: list[int]) -> bool:
    """Whether one of `ranks` was killed by a signal inside MPI's shrink: Open MPI 5.0.11's
    agreement (coll/ftagree) was seen to crash so (SIGSEGV, SIGABRT) after a cut, in
    2 of about 60 jobs here and in CI; an upstream fault, not libddl's decision."""
    return "MPIX_Comm_shrink" in err and any(
        re.search(rf"rank {r} on \S+ was killed by signal", err) for r in ranks)


@pytest.mark.parametrize("nhosts,left,stay", [(3, [0, 1], [2, 3, 4, 5]),
                                              (2, [2, 3], [0, 1])],
                         ids=["minority-leaves", "even-split-lowest-rank-stays"])
def test_a_host_cut_off_and_the_others_go_on_in_one_world(
        cluster3: cluster.Cluster, tmp_path: Path, nhosts: int, left: list[int],
        stay: list[int]) -> None:
    """The first host's MPI connections cut at step 10: on 3 hosts its 2 ranks are the
    minority and leave; on 2 hosts the split is even and the side without rank 0 leaves.
    Whoever stays finishes in one world; the job's status is 0. A job whose staying side
    Open MPI itself crashed in its shrink is run once more (see crashed_in_mpi)."""
    names = cluster3.hosts[:nhosts]
    cut, out, err, rc = run_and_cut(cluster3, tmp_path, names)
    if crashed_in_mpi(err, stay):
        cut, out, err, rc = run_and_cut(cluster3, tmp_path, names)
    assert cut > 0, "no MPI connection of the first host was found to cut"
    worlds = re.findall(r"^OK (\d+) ([\d,]+)$", out, re.M)
    members = ",".join(map(str, stay))
    assert worlds == [(str(len(stay)), members)] * len(stay), out[-3000:] + err[-3000:]
    for r in left:
        # It leaves, saying why, or Open MPI crashed it in its shrink first (not anchored to
        # a line's start: mpirun may interleave two ranks' stderr; the ranks named and the
        # count kept depend on when each leaver's MPI saw what).
        assert crashed_in_mpi(err, [r]) or re.search(
            rf"\[ddl rank {r}\] ddl_comm_shrink: the MPI library takes ranks? [\d,-]+ for "
            rf"failed, which libddl's liveness watcher knows to be alive \(or to have finished "
            rf"without this rank\), and would leave this rank with [12] of the communicator's "
            rf"ranks", err), err[-3000:]
    assert f"2 ranks lost, {len(stay)} finished" in err, err[-3000:]
    assert rc == 0, err[-3000:]
