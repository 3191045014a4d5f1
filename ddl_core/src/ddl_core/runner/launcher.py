"""Build the launcher command that `ddlrun` runs (mpirun, srun or jsrun).

Separate from the CLI so each launcher flavour is a small, testable function from a
plan (plan.py: ranks, hosts, placement, environment) to an argv list. Open MPI gets the
placement as a rankfile, Slurm as an arbitrary-distribution host list. Nothing here
touches the network (the host checks are probe.py's).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from .. import _ddl
from ..launchenv import NOT_FOUND
from ..launchenv import find_mpirun as _find_mpirun
from ..settings import check, env_number
from .hosts import LaunchError, is_local
from .plan import Plan, env_to_forward, total_slots
from .probe import local_gpus

LAUNCHERS = ("auto", "mpirun", "srun", "jsrun")


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
    found = _find_mpirun()
    if found is None:
        raise LaunchError(NOT_FOUND)
    return found


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


def rankfile_text(placement: list[tuple[str, int]], cpus: dict[str, int] | None = None) -> str:
    """Open MPI rankfile: rank r on its host, slot = its index on that host, modulo the
    host's CPUs where they are known (this machine's, or what the host check found), so
    a host with more ranks than cores still maps (its ranks then share cores)."""
    lines, r = [], 0
    for host, n in placement:
        c = (cpus or {}).get(host)
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


def yield_options(extra: list[str], bind: bool) -> list[str]:
    """Options for ranks that share cores: no binding (if `bind`) and idle ranks
    yielding the CPU, each left out where the user's own launcher options set it."""
    joined = " ".join(extra)
    out = ["--bind-to", "none"] if bind and "--bind-to" not in joined else []
    if "mpi_yield_when_idle" not in joined:
        out += ["--mca", "mpi_yield_when_idle", "1"]
    return out


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
        over = False
        if placement and plan.allocation is not None:
            # Inside a Slurm allocation PRRTE starts its daemons through srun and binds
            # within the CPUs Slurm gave the job; a rankfile's slot numbers could point
            # outside them. Hosts in rank order, filled slot by slot, place the same.
            cmd += ["--host", ",".join(f"{h}:{n}" for h, n in placement), "--map-by", "slot"]
        elif placement:
            cmd += ["--host", ",".join(f"{h}:{n}" for h, n in placement)]
            cpus = {**plan.host_cpus, **{h: cores for h, _ in placement if is_local(h)}}
            over = plan.oversubscribe or any(n > cpus[h] for h, n in placement if h in cpus)
            rf = _stash("rankfile", rankfile_text(placement, cpus))
            cmd += ["--map-by", f"rankfile:file={rf}" + (":OVERSUBSCRIBE" if over else "")]
        elif plan.hosts:
            cmd += ["--host", ",".join(h.name + (f":{h.slots}" if h.slots else "")
                                       for h in plan.hosts)]
        if plan.hostfile and not placement:
            cmd += ["--hostfile", plan.hostfile]
        if plan.launch_agent:
            cmd += ["--prtemca", "plm_ssh_agent", plan.launch_agent]
        if over:  # more ranks than a host's cores: share them, and yield
            cmd += yield_options(plan.extra, bind=True)
        elif local_only and np_ is not None and np_ > cores:
            # More ranks than cores: allow it, and make idle ranks yield the CPU or
            # Open MPI's busy polling makes every rank crawl.
            cmd += ["--map-by", ":OVERSUBSCRIBE", *yield_options(plan.extra, bind=False)]
        for name, value in fwd:
            cmd += ["-x", f"{name}={value}" if value is not None else name]
        if plan.elastic and "--with-ft" not in plan.extra:
            cmd += ["--with-ft", "ulfm"]  # a dead rank is the survivors' error, not the end
        cmd += recoverable_extra(plan.extra)
    else:
        if plan.launch_agent:  # Hydra's ssh launcher, with the agent in ssh's place
            cmd += ["-launcher", "ssh", "-launcher-exec", plan.launch_agent]
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
    mpirun ends the job; with --elastic it does not (--no-kill, and Open MPI's ULFM on
    through OMPI_MCA_mpi_ft_enable). Values given with -x travel in srun's environment:
    --export splits on commas, so a value holding one cannot be written there."""
    cmd, env = ["srun"], {}
    if mpi and not any(a == "--mpi" or a.startswith("--mpi=") for a in plan.extra):
        cmd.append(f"--mpi={mpi}")
    if plan.elastic:  # the step outlives a failed task or node (elastic.py)
        cmd += ["--kill-on-bad-exit=0", "--no-kill"]
    else:
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
    fwd = env_to_forward(plan, environ)
    if plan.elastic and not any(n == "OMPI_MCA_mpi_ft_enable" for n, _ in fwd):
        fwd.append(("OMPI_MCA_mpi_ft_enable", "1"))
    for n, v in fwd:
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
