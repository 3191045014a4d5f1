"""An emulated multi-host cluster on one machine, from Linux network namespaces.

    python -m ddl_tools.cluster up --hosts 3 --link 200mbit [--name demo]
    python -m ddl_tools.cluster ddlrun --name demo -- -n 6 python train.py
    python -m ddl_tools.cluster status
    python -m ddl_tools.cluster down --name demo
    python -m ddl_tools.cluster down --name demo --host ddlc-demo-h1   # one node dies
    python -m ddl_tools.cluster up --name demo --host ddlc-demo-h1     # and comes back
    python -m ddl_tools.cluster run --hosts 2 --link 200mbit -- -n 4 python train.py
    python -m ddl_tools.cluster up --name demo --hosts 2 --slurm  # + munge, slurmctld, slurmd
    python -m ddl_tools.cluster run --name demo -- salloc -N 2 -n 4 ddlrun python train.py

Why: DDL's topology-aware allreduce only shows its worth across hosts joined by a link
slower than shared memory, and one machine has no such link. Each "host" here is a
network namespace (its own interfaces, addresses and routes) whose processes also get
their own hostname (a UTS namespace), joined to the others by a veth pair to a bridge.
`tc ... tbf` shapes each host's link in both directions (tbf works in this kind of
container; netem does not). Ranks inside one namespace share memory like ranks of one
node; ranks in different namespaces talk TCP through the shaped links.

Open MPI launches across the namespaces the way it launches across real hosts, over its
ssh launcher, with an agent script instead of ssh: the agent runs
`ip netns exec <host> unshare -u sh -c 'hostname <host>; <command>'`. ddlrun is given it
as a site would give its own: `ddlrun --launch-agent <state>/agent --mpi-args "<the
cluster's MPI options>" -H <its hosts> ...` (Cluster.ddlrun_args; the `ddlrun`
subcommand here adds them), so the launcher knows nothing of the emulation. The namespaces
resolve each other's names through /etc/netns/<ns>/hosts, which `ip netns exec`
bind-mounts over /etc/hosts. The bridge has an address too, so the launcher (prterun, in
the root namespace) and the daemons it starts in the namespaces reach each other.

Every resource is named from the cluster's name (namespaces and hostnames
`ddlc-<name>-h<i>`, bridge `ddlc-<name>`, root-side veths `dc<name>h<i>`), so clusters of
people working side by side never collide and `down` can find everything (also what a
crashed `up` left behind) from the name alone. `down` is idempotent, and returns only once
every process it ended is gone by its pid (reaped, not a zombie), so `up` may follow at
once; `down --host H` / `up --host H` take one host away and bring it back while the
others run.

With --slurm the cluster also runs Slurm (ddl_tools.slurmcluster): munged and slurmctld in
one more namespace, `ddlc-<name>-ctl`, and a slurmd in each host's. `run --name N -- CMD`
runs CMD on the first host of cluster N (up already) with the cluster's environment
(SLURM_CONF pointing at its configuration, with --slurm); `run --hosts K [--slurm] -- ...`
makes a cluster for one command and removes it (the arguments are ddlrun's, or with
--slurm a command).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddl_core.runner.child import run_forwarding

from . import slurmcluster

PREFIX = "ddlc"
STATE_DIR = Path(os.environ.get("DDL_CLUSTER_STATE", "/run/ddl-cluster"))
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # bridge "ddlc-<name>" must fit IFNAMSIZ (15)
SUBNET_BASE = "10.77"  # /24 per cluster: 10.77.<k>.0/24, k chosen free at `up`
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
RATE_UNIT = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts each namespace
TERM_WAIT_S = 5.0  # how long `down` lets processes exit after SIGTERM before SIGKILL
REAP_WAIT_S = 10.0  # then how long it waits for every killed pid to be reaped


class ClusterError(Exception):
    """A cluster that cannot be made, found or removed, with the reason and the fix."""


@dataclass
class Cluster:
    """A running emulated cluster, as recorded in its state file."""

    name: str
    hosts: list[str]
    addrs: list[str]
    subnet: str
    head_addr: str
    link: str | None = None
    link_bps: float | None = None
    created: float = field(default_factory=time.time)
    slurm: bool = False
    cpus: int | None = None  # CPUs each Slurm node advertises
    slurm_ready_s: float | None = None  # from the first Slurm daemon to every node idle

    @property
    def ctl(self) -> str:
        """The namespace (and hostname) of munged and slurmctld, with --slurm."""
        return ctl_name(self.name)

    @property
    def ctl_addr(self) -> str:
        return self.subnet.rsplit(".", 1)[0] + ".253"

    @property
    def bridge(self) -> str:
        return bridge_name(self.name)

    @property
    def state_dir(self) -> Path:
        return STATE_DIR / self.name

    @property
    def agent(self) -> Path:
        return self.state_dir / "agent"

    def ddlrun_args(self) -> list[str]:
        """ddlrun options that launch on this cluster: its agent, its MPI options and
        every host (a later -H in the same command line replaces the hosts)."""
        return ["--launch-agent", str(self.agent), "--mpi-args", shlex.join(self.mpirun_args()),
                "-H", ",".join(self.hosts)]

    def mpirun_args(self) -> list[str]:
        """Open MPI options that talk over this cluster's network (the agent that
        launches on it is ddlrun's --launch-agent)."""
        return ["--prtemca", "oob_tcp_if_include", self.subnet,
                "--mca", "btl_tcp_if_include", self.subnet,
                # Let Linux size the socket buffers: Open MPI's fixed ones cap the TCP
                # window, and once both directions of a shaped link are busy (the ACKs
                # queue behind data) a window-limited exchange runs at half rate
                # (measured: a 16 MiB Sendrecv both ways took 2x the one-way time).
                "--mca", "btl_tcp_sndbuf", "0", "--mca", "btl_tcp_rcvbuf", "0",
                # No emulated RDMA put over TCP: with it a large message goes out as one
                # fragment, and the rendezvous ACK the peer waits for queues behind it,
                # so exchanges in both directions ran one after the other (2 pairs x 8 MiB
                # Sendrecv: 1.3 s with put, 0.72 s without, 0.67 s = the link's limit).
                # Every variant in a benchmark runs with it, MPI's own collectives too.
                "--mca", "btl_tcp_flags", "send,inplace,need-ack,need-csum",
                # All "hosts" share this machine's cores: binding would pile every
                # namespace's rank 0 onto core 0, and idle ranks must yield.
                "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]

    def job_env(self) -> dict[str, str]:
        """The environment of a job started on the cluster by something other than
        ddlrun's own mpirun (Slurm's srun, salloc, sbatch): the same MPI settings as
        mpirun_args, as Open MPI / PRRTE environment variables, and SLURM_CONF."""
        env = {"OMPI_MCA_btl_tcp_sndbuf": "0", "OMPI_MCA_btl_tcp_rcvbuf": "0",
               "OMPI_MCA_btl_tcp_flags": "send,inplace,need-ack,need-csum",
               "OMPI_MCA_mpi_yield_when_idle": "1",
               # mpirun inside an allocation must not bind either (see mpirun_args)
               "PRTE_MCA_hwloc_default_binding_policy": "none"}
        if self.slurm:
            env.update(slurmcluster.job_env(self))
        return env

    def exec_argv(self, host: str, command: list[str]) -> list[str]:
        """argv that runs `command` on `host` with its hostname set (as the agent does)."""
        if host not in self.hosts:
            raise ClusterError(f"host {host!r} is not in cluster {self.name} "
                               f"(its hosts: {', '.join(self.hosts)})")
        return ["ip", "netns", "exec", host, "unshare", "-u", "sh", "-c",
                f"hostname {host}; exec {shlex.join(command)}"]


def ctl_name(name: str) -> str:
    return slurmcluster.ctl_name(name)


def ctl_veth(name: str) -> str:
    return f"dc{name}c"


def bridge_name(name: str) -> str:
    return f"{PREFIX}-{name}"


def host_name(name: str, i: int) -> str:
    return f"{PREFIX}-{name}-h{i}"


def veth_name(name: str, i: int) -> str:
    return f"dc{name}h{i}"


def parse_rate(text: str) -> float:
    """'200mbit' -> bits per second (tc's units)."""
    m = RATE_RE.match(text.strip().lower())
    if not m:
        raise ClusterError(f"--link {text!r}: write a rate as tc does, e.g. 200mbit or 1gbit")
    return float(m.group(1)) * RATE_UNIT[m.group(2)]


def _run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` failed: {proc.stderr.strip() or proc.stdout}")
    return proc


def check_environment() -> None:
    """Refuse early and clearly where namespaces cannot be made."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (it creates network namespaces, "
                           "a bridge and veth links): run as root or under sudo")
    if not shutil.which("ip") or not shutil.which("tc") or not shutil.which("unshare"):
        raise ClusterError("the emulated cluster needs `ip`, `tc` (iproute2) and `unshare` "
                           "(util-linux): apt-get install iproute2 util-linux")
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"`ip netns` is unavailable here: {proc.stderr.strip()}")


def skip_reason() -> str | None:
    """Why the emulated cluster cannot run here (for pytest skips), or None."""
    try:
        check_environment()
    except ClusterError as e:
        return str(e)
    return None


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_subnets() -> set[int]:
    used = set()
    out = _run("ip", "-4", "-o", "addr", "show", check=False).stdout
    for m in re.finditer(rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", out):
        used.add(int(m.group(1)))
    for p in STATE_DIR.glob("*.json"):
        with contextlib.suppress(Exception):
            used.add(int(json.loads(p.read_text())["subnet"].split(".")[2]))
    return used


def load(name: str) -> Cluster:
    """The running cluster called `name`, or a ClusterError that says how to start one."""
    if not NAME_RE.match(name or ""):
        raise ClusterError(f"cluster name {name!r}: use 1-8 lowercase letters and digits, "
                           "starting with a letter")
    p = STATE_DIR / f"{name}.json"
    if not p.is_file():
        raise ClusterError(f"no emulated cluster named {name!r} is up: start one with "
                           f"`python -m ddl_tools.cluster up --name {name} --hosts 2`")
    return Cluster(**json.loads(p.read_text()))


def _tbf(dev: str, bps: float, netns: str | None = None) -> None:
    # burst: at least one timer tick's worth at this rate (and a few packets), so the
    # shaper reaches its rate; latency bounds the queue as a real switch port's buffer
    # would (20 ms: a deep queue only adds round-trip time, and with both directions
    # busy the ACKs wait behind it).
    burst = max(int(bps / 8 / 250), 32 * 1024)
    pre = ["ip", "netns", "exec", netns] if netns else []
    _run(*pre, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(bps)}bit",
         "burst", str(burst), "latency", "20ms")


def up(name: str = "ddl", hosts: int = 2, link: str | None = None, slurm: bool = False,
       cpus: int | None = None) -> Cluster:
    """Create the cluster (with Slurm's daemons if `slurm`); on any failure remove what
    was made and raise."""
    check_environment()
    if slurm:
        try:
            slurmcluster.check_installed()
        except slurmcluster.SlurmError as e:
            raise ClusterError(str(e)) from None
    if cpus is not None and not slurm:
        raise ClusterError("--cpus is the CPU count of each Slurm node: it needs --slurm")
    if cpus is not None and not 1 <= cpus <= 4096:
        raise ClusterError(f"--cpus {cpus}: between 1 and 4096 CPUs per Slurm node")
    if not NAME_RE.match(name):
        raise ClusterError(f"cluster name {name!r}: use 1-8 lowercase letters and digits, "
                           "starting with a letter (interface names are at most 15 characters)")
    if not 1 <= hosts <= 99:
        raise ClusterError(f"--hosts {hosts}: between 1 and 99")
    bps = parse_rate(link) if link else None
    with _lock():
        if (STATE_DIR / f"{name}.json").exists():
            raise ClusterError(f"cluster {name!r} is already up: `python -m "
                               f"ddl_tools.cluster down --name {name}` first, or use "
                               "another --name")
        leftovers = _resources(name)
        if any(leftovers.values()):
            _teardown(name)  # what a crashed `up` or killed `down` left behind
        free = [k for k in range(1, 255) if k not in _used_subnets()]
        if not free:
            raise ClusterError(f"no free {SUBNET_BASE}.X.0/24 subnet left: `status`, then "
                               "`down` clusters no longer in use")
        k = free[0]
        c = Cluster(name=name, hosts=[host_name(name, i) for i in range(hosts)],
                    addrs=[f"{SUBNET_BASE}.{k}.{i + 1}" for i in range(hosts)],
                    subnet=f"{SUBNET_BASE}.{k}.0/24", head_addr=f"{SUBNET_BASE}.{k}.254",
                    link=link, link_bps=bps, slurm=slurm,
                    cpus=(cpus or max(os.cpu_count() or 1, 2)) if slurm else None)
        c.state_dir.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{name}.json").write_text(json.dumps(asdict(c), indent=1))
    try:
        _create(c)
        if c.slurm:
            c.slurm_ready_s = slurmcluster.start(c, c.ctl_addr, c.cpus or 1)
            (STATE_DIR / f"{name}.json").write_text(json.dumps(asdict(c), indent=1))
    except slurmcluster.SlurmError as e:
        down(name)
        raise ClusterError(f"cluster {name}: {e}\n(the cluster was removed)") from None
    except BaseException:
        down(name)
        raise
    return c


def _create(c: Cluster) -> None:
    br = c.bridge
    _run("ip", "link", "add", br, "type", "bridge")
    _run("ip", "addr", "add", f"{c.head_addr}/24", "dev", br)
    _run("ip", "link", "set", br, "up")
    members = [(h, a, veth_name(c.name, i)) for i, (h, a) in
               enumerate(zip(c.hosts, c.addrs, strict=True))]
    if c.slurm:  # the controller's namespace: on the bridge, never shaped
        members.append((c.ctl, c.ctl_addr, ctl_veth(c.name)))
    for h, a, v in members:
        _add_member(c, h, a, v)
    names = "|".join(c.hosts)
    # PRRTE calls the agent as `agent [ssh options] host command`; only this cluster's
    # hosts are accepted, and the host name is one of ours, so nothing from a host list
    # reaches a shell unchecked.
    c.agent.write_text(f"""#!/bin/sh
# Open MPI launch agent for the emulated cluster {c.name} (written by ddl_tools.cluster)
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
h="$1"; shift
case "$h" in
  {names}) ;;
  *) echo "host '$h' is not in cluster {c.name} (its hosts: {', '.join(c.hosts)})" >&2
     exit 255;;
esac
exec ip netns exec "$h" unshare -u sh -c "hostname $h; $*"
""")
    c.agent.chmod(0o755)


def _add_member(c: Cluster, h: str, a: str, v: str) -> None:
    """Namespace `h` with address `a`, joined to the bridge by veth `v` (shaped unless it
    is the controller's), and the /etc/netns files `ip netns exec` mounts in it."""
    hosts_file = "127.0.0.1 localhost\n" + "".join(
        f"{ha} {hh}\n" for ha, hh in zip(c.addrs, c.hosts, strict=True)) + \
        f"{c.head_addr} {PREFIX}-{c.name}-head\n" + \
        (f"{c.ctl_addr} {c.ctl}\n" if c.slurm else "")
    _run("ip", "netns", "add", h)
    etc = Path("/etc/netns") / h
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts_file)
    (etc / "hostname").write_text(h + "\n")
    _run("ip", "link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", h)
    _run("ip", "link", "set", v, "master", c.bridge, "up")
    _run("ip", "-n", h, "addr", "add", f"{a}/24", "dev", "eth0")
    _run("ip", "-n", h, "link", "set", "eth0", "up")
    _run("ip", "-n", h, "link", "set", "lo", "up")
    if c.link_bps and h != c.ctl:
        _tbf("eth0", c.link_bps, netns=h)  # what the host sends
        _tbf(v, c.link_bps)  # what the host receives


def _member(c: Cluster, host: str) -> tuple[str, str]:
    """(address, root-side veth) of one of the cluster's compute hosts."""
    if host not in c.hosts:
        raise ClusterError(f"host {host!r} is not in cluster {c.name} "
                           f"(its hosts: {', '.join(c.hosts)})")
    i = c.hosts.index(host)
    return c.addrs[i], veth_name(c.name, i)


def host_down(name: str, host: str) -> float:
    """Take one host of a running cluster away, as a node that died: every process in it
    (its slurmd, ranks, daemons) ended and waited for by pid, then its namespace, link,
    /etc/netns entry, slurmd pid file and Open MPI files removed. The other hosts, the
    controller and the bridge are left running; `host_up` brings it back. Returns the
    seconds it took. Idempotent."""
    check_environment()
    c = load(name)
    _, veth = _member(c, host)
    t0 = time.monotonic()
    if (NETNS_DIR / host).exists():
        _stop_processes([host])
        _run("ip", "netns", "del", host, check=False)
    _run("ip", "link", "del", veth, check=False)  # gone with the namespace, normally
    shutil.rmtree(Path("/etc/netns") / host, ignore_errors=True)
    if c.slurm:
        with contextlib.suppress(FileNotFoundError):
            (slurmcluster.node_dir(c, host) / "slurmd.pid").unlink()
    _remove_mpi_leftovers(name, host)
    left = [n for n in _resources(name)["namespaces"] + _resources(name)["links"]
            if n in (host, veth)] + [m for m in _netns_mounts(host)
                                     if m == str(NETNS_DIR / host)]
    if left:
        raise ClusterError(f"cluster {name}: could not remove host {host}: {left}")
    return time.monotonic() - t0


def host_up(name: str, host: str, timeout: float = 60) -> float:
    """Bring back a host `host_down` took away: same name, address and link shaping, and
    with Slurm its slurmd, waited for until the node is idle. Returns the seconds it took."""
    check_environment()
    c = load(name)
    addr, veth = _member(c, host)
    if (NETNS_DIR / host).exists():
        raise ClusterError(f"host {host} of cluster {name} is up already: "
                           f"`python -m ddl_tools.cluster down --name {name} --host {host}` "
                           "first")
    t0 = time.monotonic()
    try:
        _add_member(c, host, addr, veth)
        if c.slurm:
            slurmcluster.start_node(c, host)
            slurmcluster.wait_idle(c, timeout, hosts=[host])
    except slurmcluster.SlurmError as e:
        host_down(name, host)
        raise ClusterError(f"cluster {name}: {e}\n(host {host} was removed again)") from None
    except BaseException:
        host_down(name, host)
        raise
    return time.monotonic() - t0


def _resources(name: str) -> dict[str, list[str]]:
    """Everything that exists on this machine for cluster `name`, found by its names."""
    ns = [line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines()
          if line.strip()]
    links = _run("ip", "-o", "link", "show", check=False).stdout
    link_names = [m.group(1).split("@")[0] for m in re.finditer(r"^\d+: ([^:]+):", links, re.M)]
    return {
        "namespaces": [n for n in ns if re.fullmatch(rf"{PREFIX}-{name}-(h\d+|ctl)", n)],
        "links": [n for n in link_names
                  if n == bridge_name(name) or re.fullmatch(rf"dc{name}(h\d+|c)", n)],
    }


def _pids_in(ns: str) -> list[int]:
    """The live processes in network namespace `ns` (as `ip netns pids` finds them: by
    the namespace file's inode; a zombie has no namespace any more and is not listed)."""
    try:
        want = os.stat(NETNS_DIR / ns)
    except OSError:
        return []
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = os.stat(f"/proc/{d}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                pids.append(int(d))
    return pids


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of `pid`, None once it is gone. The start
    time tells a reused pid from the process we signalled."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def _stop_processes(namespaces: list[str], term_s: float = TERM_WAIT_S,
                    reap_s: float = REAP_WAIT_S) -> None:
    """End every process in `namespaces` and return only once each is gone by its pid.

    TERM, up to `term_s` for them to exit, KILL what is left (and whatever was forked
    meanwhile), then wait up to `reap_s` until every pid is reaped (past that, a warning
    names what is left, and the teardown goes on: never a hang). Why the last step:
    a daemon (slurmctld, slurmd, munged, prted) is a child of pid 1 after it detached,
    so once it died it stays a zombie, still listed by pgrep and still "alive" to
    `kill(pid, 0)` (a new slurmd reads the old pid file and waits on it), until pid 1
    reaps it; the init of some containers does that only about once a second. A zombie
    no longer shows in its namespace, so the pids are remembered from before the kill."""
    seen: dict[int, int] = {}  # pid -> start time

    def alive() -> list[int]:
        for ns in namespaces:
            for p in _pids_in(ns):
                st = _proc_state(p)
                if st and st[0] != "Z":
                    seen.setdefault(p, st[1])
        return [p for p, t in seen.items()
                if (st := _proc_state(p)) and st[1] == t and st[0] != "Z"]

    def present() -> list[int]:
        return [p for p, t in seen.items() if (st := _proc_state(p)) and st[1] == t]

    def signal_all(pids: list[int], sig: int) -> None:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)

    signalled: set[int] = set()
    deadline = time.monotonic() + term_s
    while (pids := alive()) and time.monotonic() < deadline:
        signal_all([p for p in pids if p not in signalled], signal.SIGTERM)
        signalled.update(pids)
        time.sleep(0.02)
    deadline = time.monotonic() + reap_s
    while (pids := alive()) and time.monotonic() < deadline:
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.02)
    while present() and time.monotonic() < deadline:
        time.sleep(0.02)
    if left := present():  # bounded: go on removing, and say what could not be waited for
        desc = ", ".join(f"{p} (state {(_proc_state(p) or ('?', 0))[0]}, parent "
                         f"{_parent(p)})" for p in left)
        print(f"ddl_tools.cluster: warning: processes of {', '.join(namespaces)} still there "
              f"{reap_s:.0f} s after SIGKILL: {desc} (a zombie is gone once its parent reaps "
              "it)", file=sys.stderr)


def _parent(pid: int) -> str:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return data[data.rfind(b")") + 2:].split()[1].decode()
    except (OSError, IndexError):
        return "?"


def _netns_mounts(prefix: str) -> list[str]:
    """Mount points of network namespaces whose name starts with `prefix` (`ip netns add`
    bind-mounts each one on NETNS_DIR/<name>; `ip netns del` unmounts it)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    at = str(NETNS_DIR / prefix)
    return [f[4] for f in (ln.split() for ln in lines) if len(f) > 4 and f[4].startswith(at)]


def _teardown(name: str) -> None:
    res = _resources(name)
    # Processes first (ranks, daemons of a killed run), each waited for by its pid.
    _stop_processes(res["namespaces"])
    for ns in res["namespaces"]:
        _run("ip", "netns", "del", ns, check=False)  # takes its end of the veth with it
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    for link in res["links"]:
        _run("ip", "link", "del", link, check=False)
    etc = Path("/etc/netns")
    for h in [*etc.glob(f"{PREFIX}-{name}-h*"), etc / ctl_name(name)] if etc.is_dir() else []:
        shutil.rmtree(h, ignore_errors=True)
    shutil.rmtree(STATE_DIR / name, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{name}.json").unlink()
    _remove_mpi_leftovers(name)


def _remove_mpi_leftovers(name: str, host: str | None = None) -> None:
    """Open MPI files named after the cluster's hosts in the filesystem the namespaces
    share: session directories (/tmp/ompi.<host>.<uid>, which ranks srun starts directly
    never remove) and shared-memory segments (/dev/shm/sm_segment.<host>...) of ranks
    killed by scancel or a dead node. On real nodes Slurm's epilog or a reboot clears
    them; here they would pile up from one cluster to the next."""
    hosts = re.compile(re.escape(host) if host else rf"{PREFIX}-{re.escape(name)}-h\d+")
    for where, pattern in ((Path(os.environ.get("TMPDIR") or "/tmp"), r"ompi\.{}\.\d+"),
                           (Path("/tmp"), r"ompi\.{}\.\d+"),
                           (Path("/dev/shm"), r"sm_segment\.{}\.\d+\.[0-9a-f]+\.\d+")):
        rx = re.compile(pattern.format(hosts.pattern))
        for p in where.glob(f"*{host or f'{PREFIX}-{name}-h'}*") if where.is_dir() else []:
            if rx.fullmatch(p.name):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        p.unlink()


def down(name: str = "ddl") -> list[str]:
    """Remove the cluster's processes, namespaces, links and files; idempotent.

    Returns what it removed (empty when nothing was there)."""
    check_environment()
    if not NAME_RE.match(name):
        raise ClusterError(f"cluster name {name!r}: use 1-8 lowercase letters and digits")
    res = _resources(name)
    had = res["namespaces"] + res["links"]
    if (STATE_DIR / f"{name}.json").exists():
        had.append(str(STATE_DIR / f"{name}.json"))
    _teardown(name)
    left = _resources(name)
    mounts = _netns_mounts(f"{PREFIX}-{name}-")
    if any(left.values()) or mounts:
        raise ClusterError(f"cluster {name}: could not remove {left}"
                           + (f", mounts {mounts}" if mounts else ""))
    return had


def status() -> list[dict[str, object]]:
    """Clusters recorded as up, and stray resources (by the naming scheme) of any other."""
    rows: list[dict[str, object]] = []
    seen = set()
    for p in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        with contextlib.suppress(Exception):
            c = Cluster(**json.loads(p.read_text()))
            seen.add(c.name)
            res = _resources(c.name)
            pids = sum(len(_pids_in(ns)) for ns in res["namespaces"])
            rows.append({"name": c.name, "hosts": c.hosts, "subnet": c.subnet,
                         "link": c.link or "unshaped", "processes": pids, "slurm": c.slurm,
                         "healthy": len(res["namespaces"]) == len(c.hosts) + c.slurm})
    ns = _run("ip", "netns", "list", check=False).stdout.split()
    for n in ns:
        m = re.fullmatch(rf"{PREFIX}-([a-z][a-z0-9]*)-(h\d+|ctl)", n)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            rows.append({"name": m.group(1), "hosts": _resources(m.group(1))["namespaces"],
                         "subnet": "?", "link": "?", "processes": "?", "healthy": False,
                         "note": "no state file (a crashed up?): `down` removes it"})
    return rows


@contextlib.contextmanager
def running(name: str = "ddl", hosts: int = 2, link: str | None = None, slurm: bool = False,
            cpus: int | None = None) -> Iterator[Cluster]:
    """`with running("t", hosts=3, link="200mbit") as c:` - always torn down, also on
    SIGTERM (turned into an exception here so the `finally` runs)."""
    old = signal.getsignal(signal.SIGTERM)
    restore = False
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        signal.signal(signal.SIGTERM, _raise_on_term)
        restore = True
    try:
        c = up(name, hosts, link, slurm, cpus)
        try:
            yield c
        finally:
            down(name)
    finally:
        if restore:
            signal.signal(signal.SIGTERM, old)


def _raise_on_term(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_argv(c: Cluster, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run `command` on the cluster's first host, as a user
    logged in there would: its hostname, its network, and (with Slurm) SLURM_CONF."""
    if not command:
        raise ClusterError("no command given: python -m ddl_tools.cluster run --name "
                           f"{c.name} -- sinfo")
    return c.exec_argv(c.hosts[0], command), dict(os.environ, **c.job_env())


def ddlrun_on(c: Cluster, ddlrun_args: list[str]) -> int:
    """Run ddlrun here with the cluster's launch options in front of `ddlrun_args`
    (its hosts unless those name a --hostfile; a -H there replaces them)."""
    from ddl_core.runner.run import main as ddlrun_main

    rest = ddlrun_args[1:] if ddlrun_args[:1] == ["--"] else ddlrun_args
    own = c.ddlrun_args()
    if any(a == "--hostfile" or a.startswith("--hostfile=") for a in rest):
        own = own[:-2]  # -H and the hosts
    return ddlrun_main([*own, *rest])


def _child(argv: list[str], env: dict[str, str]) -> int:
    """Run argv, passing Ctrl-C on (child.py); one that outlives it is killed and the
    interrupt goes on, so that the caller removes the cluster."""
    end = run_forwarding(argv, env)
    if end.killed_after_signal:
        raise KeyboardInterrupt
    return end.returncode


def _describe(c: Cluster) -> str:
    return (f"cluster {c.name} up: {len(c.hosts)} hosts {', '.join(c.hosts)} on {c.subnet}, "
            f"links {c.link or 'unshaped'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_tools.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="create a cluster")
    p_run = sub.add_parser(
        "run", help="run a command on a cluster's first host (--name N, N up); or create a "
        "cluster (--hosts K), run ddlrun on it (with --slurm: the command), remove it")
    for p in (p_up, p_run):
        p.add_argument("--name", default="ddl" if p is p_up else None)
        p.add_argument("--hosts", type=int, default=2 if p is p_up else None)
        p.add_argument("--link", help="shape each host's link, e.g. 200mbit (tc tbf rate)")
        p.add_argument("--slurm", action="store_true",
                       help="also run Slurm: munged, slurmctld and a slurmd per host")
        p.add_argument("--cpus", type=int, help="CPUs each Slurm node advertises (default: "
                       "this machine's, at least 2)")
    p_run.add_argument("ddlrun_args", nargs=argparse.REMAINDER,
                       help="after --: the command (a cluster that is up, or --slurm), "
                       "else ddlrun's options and the program")
    p_ddlrun = sub.add_parser("ddlrun", help="run ddlrun on a cluster that is up, with its "
                              "launch agent, MPI options and hosts")
    p_ddlrun.add_argument("--name", default="ddl")
    p_ddlrun.add_argument("ddlrun_args", nargs=argparse.REMAINDER,
                          help="after --: ddlrun's options and the program")
    p_up.add_argument("--host", help="bring back one host of cluster --name that `down "
                      "--host` took away (its namespace, link and slurmd)")
    p_down = sub.add_parser("down", help="remove a cluster (idempotent); returns once every "
                            "process of it is gone")
    p_down.add_argument("--name", default="ddl")
    p_down.add_argument("--all", action="store_true", help="every ddlc-* cluster")
    p_down.add_argument("--host", help="take only this host away (as a node that died: its "
                        "processes, namespace and link); the others keep running")
    sub.add_parser("status", help="list clusters")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up" and args.host:
            took = host_up(args.name, args.host)
            print(f"cluster {args.name}: host {args.host} up in {took:.1f} s")
        elif args.cmd == "down" and args.host:
            took = host_down(args.name, args.host)
            print(f"cluster {args.name}: host {args.host} down in {took:.1f} s")
        elif args.cmd == "up":
            t0 = time.monotonic()
            c = up(args.name, args.hosts, args.link, args.slurm, args.cpus)
            print(_describe(c))
            if c.slurm:
                print(f"slurm: {len(c.hosts)} nodes idle {c.slurm_ready_s:.1f} s after the "
                      f"first daemon started; up took {time.monotonic() - t0:.1f} s "
                      f"(controller {c.ctl}, {c.cpus} CPUs per node)")
                print(f"run on it: python -m ddl_tools.cluster run --name {c.name} -- salloc "
                      f"-N {len(c.hosts)} ddlrun python train.py")
            else:
                print(f"run on it: python -m ddl_tools.cluster ddlrun --name {c.name} -- "
                      f"-n {len(c.hosts)} python train.py")
        elif args.cmd == "down":
            names = [r["name"] for r in status()] if args.all else [args.name]
            for n in names:
                t0 = time.monotonic()
                gone = down(str(n))
                print(f"cluster {n}: " + (f"removed {len(gone)} resources in "
                                          f"{time.monotonic() - t0:.1f} s" if gone
                                          else "nothing to remove"))
        elif args.cmd == "ddlrun":
            return ddlrun_on(load(args.name), list(args.ddlrun_args))
        elif args.cmd == "status":
            check_environment()
            rows = status()
            if not rows:
                print("no emulated clusters are up")
            for r in rows:
                print(f"{r['name']}: {len(r['hosts'])} hosts ({', '.join(r['hosts'])}), "  # type: ignore[arg-type]
                      f"subnet {r['subnet']}, link {r['link']}, {r['processes']} processes"
                      + (", slurm" if r.get("slurm") else "")
                      + ("" if r["healthy"] else f", BROKEN {r.get('note', '')}"))
        else:
            return _run_cmd(args)
    except ClusterError as e:
        print(f"ddl_tools.cluster: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddl_tools.cluster: interrupted; the cluster was removed", file=sys.stderr)
        return 130
    return 0


def _run_cmd(args: argparse.Namespace) -> int:
    rest = list(args.ddlrun_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    existing = args.name is not None and (STATE_DIR / f"{args.name}.json").is_file()
    if existing:
        if args.hosts is not None or args.link or args.slurm or args.cpus:
            raise ClusterError(f"cluster {args.name} is up already: --hosts, --link, --slurm "
                               "and --cpus apply only to a new cluster (leave them out, or "
                               "pick another --name)")
        check_environment()
        cmd, env = run_argv(load(args.name), rest)
        os.execvpe(cmd[0], cmd, env)
    if args.hosts is None:
        raise ClusterError(
            (f"no emulated cluster named {args.name!r} is up: " if args.name else "")
            + "give --hosts K to run on a new cluster removed afterwards, or start one with "
            "`python -m ddl_tools.cluster up --name N --hosts K [--slurm]`")
    name = args.name or f"r{os.getpid() % 100000}"
    with running(name, args.hosts, args.link, args.slurm, args.cpus) as c:
        if c.slurm:
            return _child(*run_argv(c, rest))
        return ddlrun_on(c, rest)


if __name__ == "__main__":
    sys.exit(main())
