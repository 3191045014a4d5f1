"""Slurm on an emulated cluster: munge, slurmctld and one slurmd per namespace host.

Why: HPC users start jobs through a workload manager, not bare mpirun, so ddlrun's
Slurm path (allocation detection, srun with a PMI plugin) must be run by a real Slurm.
Here it is Debian's slurm-wlm (22.05) with everything an administrator would set up
generated into the cluster's state directory, so several clusters live side by side and
`down` removes every trace:

  <state>/slurm/slurm.conf, cgroup.conf   the configuration (SLURM_CONF points here)
  <state>/slurm/munge/                    the cluster's own munge key and socket
  <state>/slurm/ctld/                     slurmctld's state, pid file and log
  <state>/slurm/nodes/<host>/             each slurmd's spool, TmpFS, pid file and log

munged and slurmctld run in a namespace of their own on the bridge, `ddlc-<name>-ctl`
(hostname the same), so its ports never collide with another cluster's or the machine's,
and killing a compute "node" leaves the controller alone; each slurmd runs in its host's
namespace under that host's name. The munge socket is a path on the shared filesystem,
so one munged serves every namespace.

The configuration asks for nothing the emulation lacks: no cgroups (proctrack/linuxproc,
task/none; cgroup/v1 is named only because 22.05's slurmd loads a cgroup plugin at start,
and its init touches nothing), no accounting, and nodes whose CPU count is configured
rather than probed (all "hosts" share this machine's cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Protocol


class Cluster(Protocol):
    """What Slurm's set-up needs of an emulated cluster (ddl_tools.cluster.Cluster has
    it): named here rather than imported, so cluster.py alone imports this module."""

    name: str
    hosts: list[str]
    addrs: list[str]

    @property
    def state_dir(self) -> Path: ...

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "srun", "salloc", "sbatch", "scancel", "scontrol", "squeue")
# A node that stops answering is DOWN after this many seconds (and its jobs fail);
# Slurm's default (300) is for real machines, the emulation wants failures found fast.
SLURMD_TIMEOUT_S = 15
# scancel / a failed step: SIGTERM, then SIGKILL this many seconds later (default 30).
KILL_WAIT_S = 5


class SlurmError(Exception):
    """Slurm that cannot be set up here, with the reason and the fix."""


def sbin(name: str) -> str:
    """A Slurm or munge daemon: DDL_SLURM_SBIN (a site's own build), PATH, /usr/sbin."""
    where = os.environ.get("DDL_SLURM_SBIN")
    if where:
        p = Path(where) / name
        if not os.access(p, os.X_OK):
            raise SlurmError(f"DDL_SLURM_SBIN={where} holds no executable {name}")
        return str(p)
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise SlurmError(f"{name} is not installed: apt-get install slurm-wlm munge "
                         "libpmix-dev (or point DDL_SLURM_SBIN at the directory holding "
                         "munged, slurmctld and slurmd)")
    return found


def check_installed() -> None:
    """Refuse before creating anything where a daemon or a client is missing."""
    for d in DAEMONS:
        sbin(d)
    missing = [c for c in CLIENTS if not shutil.which(c)]
    if missing:
        raise SlurmError(f"Slurm's commands {', '.join(missing)} are not installed: "
                         "apt-get install slurm-client")


def ctl_name(name: str) -> str:
    return f"ddlc-{name}-ctl"


def slurm_dir(c: Cluster) -> Path:
    return c.state_dir / "slurm"


def conf_path(c: Cluster) -> Path:
    return slurm_dir(c) / "slurm.conf"


def munge_socket(c: Cluster) -> Path:
    return slurm_dir(c) / "munge" / "socket"


def node_dir(c: Cluster, host: str) -> Path:
    return slurm_dir(c) / "nodes" / host


def job_env(c: Cluster) -> dict[str, str]:
    """What makes sinfo, srun, salloc and sbatch talk to this cluster's controller."""
    return {"SLURM_CONF": str(conf_path(c))}


def slurm_conf(c: Cluster, ctl_addr: str, cpus: int) -> str:
    """The whole configuration. Paths with %n are per node (slurmd expands them)."""
    d = slurm_dir(c)
    nodes = "".join(f"NodeName={h} NodeAddr={a} CPUs={cpus} State=UNKNOWN\n"
                    for h, a in zip(c.hosts, c.addrs, strict=True))
    return f"""# Slurm for the emulated cluster {c.name} (ddl_tools.cluster; down removes it)
ClusterName=ddl{c.name}
SlurmctldHost={ctl_name(c.name)}({ctl_addr})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket(c)}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/ctld
SlurmctldPidFile={d}/ctld/slurmctld.pid
SlurmctldLogFile={d}/ctld/slurmctld.log
SlurmdSpoolDir={d}/nodes/%n/spool
SlurmdPidFile={d}/nodes/%n/slurmd.pid
SlurmdLogFile={d}/nodes/%n/slurmd.log
# Namespaces share /tmp: the PMIx plugin's per-step directories go under TmpFS, which
# must then differ per node or two nodes' steps collide.
TmpFS={d}/nodes/%n/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
KillWait={KILL_WAIT_S}
InactiveLimit=0
MailProg=/bin/true
{nodes}PartitionName=ddl Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _ns_run(ns: str, hostname: str, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run argv in namespace `ns` under `hostname`; daemons fork and this returns."""
    cmd = ["ip", "netns", "exec", ns, "unshare", "-u", "sh", "-c",
           f'hostname {hostname}; exec "$@"', "sh", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n    ".join(text[-lines:]) or "(empty log)"


def _started(what: str, proc: subprocess.CompletedProcess[str], log: Path) -> None:
    if proc.returncode != 0:
        raise SlurmError(f"{what} did not start (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()}\n  its log {log}:\n    "
                         + _tail(log))


def write_files(c: Cluster, ctl_addr: str, cpus: int) -> None:
    """Config, munge key and the directories every daemon writes to."""
    d = slurm_dir(c)
    # munged checks that no directory on its socket's and key's paths is writable by
    # others, and that everyone may traverse the socket's directory.
    for p in (c.state_dir, d, d / "munge", d / "ctld"):
        p.mkdir(parents=True, exist_ok=True)
        p.chmod(0o755)
    key = d / "munge" / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    for h in c.hosts:
        for sub in ("spool", "tmp"):
            (node_dir(c, h) / sub).mkdir(parents=True, exist_ok=True)
    conf_path(c).write_text(slurm_conf(c, ctl_addr, cpus))
    (d / "cgroup.conf").write_text("# no cgroups are used (proctrack/linuxproc, task/none)\n"
                                   "CgroupPlugin=cgroup/v1\n")


def start_controller(c: Cluster) -> None:
    """munged and slurmctld in the controller's namespace."""
    d, ns = slurm_dir(c), ctl_name(c.name)
    m = d / "munge"
    proc = _ns_run(ns, ns, [sbin("munged"), f"--socket={m / 'socket'}",
                            f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                            f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"])
    _started("munged", proc, m / "munged.log")
    proc = _ns_run(ns, ns, [sbin("slurmctld"), "-f", str(conf_path(c))])
    _started("slurmctld", proc, d / "ctld" / "slurmctld.log")


def start_node(c: Cluster, host: str) -> None:
    """slurmd for `host` in its namespace (also to bring back a node a test killed)."""
    proc = _ns_run(host, host, [sbin("slurmd"), "-f", str(conf_path(c)), "-N", host])
    _started(f"slurmd on {host}", proc, node_dir(c, host) / "slurmd.log")


def node_states(c: Cluster) -> dict[str, str]:
    """Each node's state as sinfo reports it ('idle', 'alloc', 'down*', ...)."""
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                          text=True, timeout=20, env=dict(os.environ, **job_env(c)))
    if proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)


def wait_idle(c: Cluster, timeout: float = 60, hosts: list[str] | None = None) -> float:
    """Seconds until sinfo shows every node (or `hosts`) idle; raises with the logs."""
    want = hosts or c.hosts
    t0 = time.monotonic()
    states: dict[str, str] = {}
    while time.monotonic() - t0 < timeout:
        states = node_states(c)
        if all(states.get(h) == "idle" for h in want):
            return time.monotonic() - t0
        time.sleep(0.1)
    bad = [h for h in want if states.get(h) != "idle"]
    logs = "\n  ".join(f"{h} ({states.get(h, 'not listed')}), {node_dir(c, h)}/slurmd.log:\n"
                       f"    {_tail(node_dir(c, h) / 'slurmd.log')}" for h in bad)
    raise SlurmError(f"Slurm nodes not idle after {timeout:.0f} s:\n  {logs}\n  slurmctld.log:\n"
                     f"    {_tail(slurm_dir(c) / 'ctld' / 'slurmctld.log')}")


def start(c: Cluster, ctl_addr: str, cpus: int, timeout: float = 60) -> float:
    """Everything, in order; returns the seconds from the first daemon to all idle."""
    write_files(c, ctl_addr, cpus)
    t0 = time.monotonic()
    start_controller(c)
    for h in c.hosts:
        start_node(c, h)
    wait_idle(c, timeout)
    return time.monotonic() - t0
