"""ddlrun: launch a DDL job on one host or a list of hosts.

    ddlrun -n 4 python train.py
    ddlrun -H server1,server2,server3,server4 python train.py
    ddlrun -H server1:4,server2:4 --racks 2 python train.py
    ddlrun --hostfile hosts --accelerators 6 --launcher mpirun -v python train.py
    ddlrun -H n1,n2 --launch-agent /opt/site/agent --mpi-args "--mca btl_tcp_if_include ib0" ...
    salloc -N 2 -n 8 ddlrun python train.py          # hosts, slots and layout from Slurm

Ranks are placed so that consecutive ranks share a host (ranks per host: --accelerators,
else the GPUs found on each host, else the slots given), which makes DDL's rank grid
(ranks per host x hosts, x racks with --racks) match the placement. Hosts are checked
before launching (name resolution, an ssh probe with a short timeout), so a typo or a
dead node fails in seconds with the host's name. The launcher is srun inside a Slurm
allocation, jsrun inside LSF, else mpirun; -v / --dry-run print the exact command.
Inside a Slurm allocation (salloc, sbatch) the hosts, their slots and so the placement
come from Slurm (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE), and srun starts the ranks
with the PMI plugin the MPI needs (--mpi=pmix for Open MPI).

Each rank gets a TF_CONFIG naming every rank as a worker (host:port, ports picked here)
and itself as worker <rank>, so tf.distribute.MultiWorkerMirroredStrategy runs across
the ranks unchanged; --no-tf-config leaves it out, and a TF_CONFIG already set is kept.

Everything not understood here (and everything after `--`) is the program and its
arguments; launcher options can be passed with --mpi-args "..." (repeatable). Where the
hosts are not reached over ssh (a container runtime, a site's own remote shell, network
namespaces), --launch-agent names the command mpirun starts its daemons with in ssh's
place, called as `AGENT HOST COMMAND`; the host check goes through it too.

Exit status: that of the first rank that failed on its own (its exit code, or 128 + the
signal that killed it), in every launcher mode (`mpirun --runtime-options recoverable`
itself exits 0 for ranks killed by signals); ranks run under exitreport.py, which reports
their status here. With `--runtime-options recoverable` Open MPI's fault tolerance is turned
on too (see launcher.recoverable_extra).

With --elastic (or --min-np / --max-np / --host-discovery-script) a lost rank does not end
the job: the survivors recover on Open MPI's ULFM, the exit status is theirs, and ddlrun
names the ranks it lost; below --min-np it ends the job (elastic.py). A discovery script
is polled and its new slots announced to the ranks, which spawn onto them (discovery.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..jobshm import JobShm
from ..launchenv import launch_environ
from ..netaddr import local_addresses
from .child import run_forwarding
from .discovery import ENV as UPDATES_ENV
from .discovery import DiscoveryError, HostUpdates, Poller, run_discovery
from .elastic import Elastic, elastic_status, running_per_host, too_few_left
from .exitreport import ENV as EXIT_ENV
from .exitreport import Collector, job_status
from .hosts import Host, LaunchError, parse_hostfile, parse_hosts
from .launchcheck import check_plan, count_type
from .launcher import (
    LAUNCHERS,
    build_command,
    build_jsrun,
    build_srun,
    choose_launcher,
    find_mpirun,
    mpi_flavor,
    parse_topology,
    srun_mpi_plugin,
)
from .plan import Plan, grid_for, place, plan_hosts
from .probe import agent_argv, check_hosts, probe_host
from .slurmalloc import allocation, in_allocation
from .stage import Staging, launch, per_rank, stage, wrap_ranks
from .tfconfig import add_tf_config


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ddlrun", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "-np", dest="np", type=count_type("-n"), help="number of ranks "
                    "(default: ranks per host x hosts, else 1)")
    ap.add_argument("-H", "--hosts", help="host[:slots],... to run on")
    ap.add_argument("--hostfile", help="a file of 'host slots=N' lines")
    ap.add_argument("--accelerators", type=count_type("--accelerators"), help="ranks per host "
                    "(default: the GPUs found on each host, else its slots)")
    ap.add_argument("--racks", type=count_type("--racks"), help="group the hosts, in order, "
                    "into this many racks of equal size: a third topology level")
    ap.add_argument("--oversubscribe", action="store_true",
                    help="allow more ranks than the hosts' slots (spread evenly over the hosts)")
    ap.add_argument("--topology", help="the rank grid, innermost first, e.g. 4x2 (4 per node x "
                    "2 nodes) or 4x2x2 (x 2 racks); sets DDL_TOPOLOGY")
    ap.add_argument("--launcher", default="auto", choices=LAUNCHERS,
                    help="auto: srun in a Slurm allocation, jsrun in LSF, else mpirun")
    ap.add_argument("--launch-agent", metavar="AGENT", help="reach the hosts with AGENT "
                    "instead of ssh (called as `AGENT HOST COMMAND`; mpirun only)")
    ap.add_argument("--no-host-check", action="store_true",
                    help="skip the resolution / ssh probe of each host before launching")
    ap.add_argument("-x", dest="forward", action="append", default=[], metavar="VAR[=VALUE]",
                    help="export an environment variable to every rank (repeatable)")
    ap.add_argument("--mpi-args", action="append", default=[],
                    help="extra launcher options, as one string (repeatable)")
    ap.add_argument("--no-tf-config", action="store_true",
                    help="do not give the ranks a TF_CONFIG (TensorFlow multi-worker)")
    ap.add_argument("--env", metavar="IMAGE", help="run every rank inside this sealed env "
                    "image (envtools seal), copied once to each node's local storage")
    ap.add_argument("--stage-dir", metavar="DIR", help="where each node keeps the image "
                    "(a node-local directory, the same path on every node; default: the "
                    "temp dir; /dev/shm allowed)")
    el = ap.add_argument_group("elastic jobs (survivors of a lost rank go on; see "
                               "ddl_core.runner.elastic)")
    el.add_argument("--elastic", action="store_true", help="start the job so that a lost "
                    "rank or host does not end it (Open MPI ULFM; srun --no-kill)")
    el.add_argument("--min-np", type=count_type("--min-np"), help="end the job with an error "
                    "once fewer ranks are left (default 1; implies --elastic)")
    el.add_argument("--max-np", type=count_type("--max-np"), help="never run more ranks than "
                    "this, however many slots discovery reports (implies --elastic)")
    el.add_argument("--host-discovery-script", metavar="SCRIPT", help="prints the usable "
                    "hosts, one host:slots a line; polled; new slots get new ranks, spawned "
                    "by the survivors at their next reset (implies --elastic)")
    el.add_argument("--slots-per-host", type=count_type("--slots-per-host"), default=1,
                    help="slots of a host the script prints without :slots (default 1)")
    el.add_argument("--discovery-interval", type=float, default=1.0, metavar="S",
                    help="seconds between runs of the discovery script (default 1)")
    el.add_argument("--discovery-timeout", type=float, default=10.0, metavar="S",
                    help="a run of the script that takes longer is killed and skipped "
                    "(default 10)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print the placement and the exact launcher command before running")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("--no-exec", action="store_true", help=argparse.SUPPRESS)  # always now
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return ap


def make_plan(args: argparse.Namespace) -> Plan:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise LaunchError("no program given: ddlrun [options] python train.py")
    hosts = parse_hosts(args.hosts) if args.hosts else []
    if args.hostfile:
        parse_hostfile(args.hostfile)  # validated here
    if hosts and args.hostfile:
        raise LaunchError("give either -H or --hostfile, not both")
    if args.launch_agent:
        agent_argv(args.launch_agent)  # a program that exists, or a clear error now
    if args.accelerators is not None and args.accelerators < 1:
        raise LaunchError(f"--accelerators {args.accelerators}: at least 1 rank per host")
    if args.host_discovery_script and (hosts or args.hostfile):
        raise LaunchError("--host-discovery-script gives the hosts: leave -H / --hostfile out "
                          "(or list those hosts in the script's output)")
    return Plan(command=command, np=args.np, hosts=hosts, hostfile=args.hostfile,
                topology=parse_topology(args.topology) if args.topology else None,
                forward=args.forward, extra=[a for s in args.mpi_args for a in shlex.split(s)],
                accelerators=args.accelerators, racks=args.racks,
                launch_agent=args.launch_agent,
                oversubscribe=args.oversubscribe,
                elastic=bool(args.elastic or args.min_np or args.max_np
                             or args.host_discovery_script))


def elastic_launcher(plan: Plan, requested: str, chosen: str) -> str:
    """The launcher an elastic job can live under: not srun. Slurm's PMIx plugin cancels
    the whole step when a rank dies, --no-kill or not (seen on the emulated Slurm:
    "mpi/pmix_v4: _errhandler ... STEP CANCELLED"), so no survivor would go on. Refused,
    with the way round (mpirun inside the allocation, which starts its daemons through
    Slurm), rather than chosen silently: that way is not tested on the emulated Slurm."""
    if not plan.elastic or chosen != "srun":
        return chosen
    how = "inside a Slurm allocation ddlrun would use srun, but " if requested == "auto" else ""
    raise LaunchError(f"--elastic: {how}Slurm's PMIx plugin ends the whole step when a rank "
                      "dies, so no survivor could go on; give --launcher mpirun (Open MPI's "
                      "mpirun starts its daemons through Slurm and keeps the survivors)")


def start_elastic(args: argparse.Namespace, plan: Plan) -> Elastic | None:
    """--elastic: its bounds checked, and with a discovery script its first run, which
    gives the hosts (a failure here is an error: there is nothing to start on)."""
    if not plan.elastic:
        return None
    el = Elastic(min_np=args.min_np or 1, max_np=args.max_np,
                 discovery=args.host_discovery_script, interval_s=args.discovery_interval,
                 timeout_s=args.discovery_timeout, slots_per_host=args.slots_per_host)
    el.check(args.np)
    if el.discovery:
        if args.env:
            raise LaunchError("--env with --host-discovery-script: not supported (a host "
                              "added later has no staged copy); stage with --env and a fixed "
                              "host list, or leave --env out")
        try:
            found = run_discovery(el.discovery, el.timeout_s, el.slots_per_host)
        except DiscoveryError as e:
            raise LaunchError(f"the host-discovery script's first run: {e}") from None
        plan.hosts = [Host(h, n) for h, n in found.items()]
        if plan.np is None:
            total = sum(found.values())
            plan.np = min(total, el.max_np) if el.max_np else total
        el.check(plan.np)
    return el


def use_allocation(plan: Plan, launcher: str, environ: dict[str, str]) -> None:
    """Inside Slurm: the allocation's nodes and tasks per node become the hosts and
    their slots (unless -H / --hostfile name others). srun needs an allocation. With a
    launch agent mpirun reaches the hosts through it, not through the allocation."""
    if launcher == "srun" or (launcher == "mpirun" and in_allocation(environ)
                              and not plan.launch_agent):
        plan.allocation = allocation(environ)  # LaunchError outside an allocation
        if not plan.hosts and not plan.hostfile:
            plan.hosts = [Host(n, slots) for n, slots in plan.allocation.nodes]


def resolve(plan: Plan, launcher: str, check: bool) -> None:
    """Check the hosts and fix the placement and grid in the plan."""
    names = [h.name for h in plan_hosts(plan)]
    gpus: dict[str, int] = {}
    if names and launcher == "mpirun" and plan.allocation is None and check:
        found = check_hosts(names, lambda h: probe_host(h, agent=plan.launch_agent))
        gpus = {h: i.gpus for h, i in found.items()}
        plan.host_cpus = {h: i.cpus for h, i in found.items() if i.cpus}
    from_allocation = plan.allocation is not None and not plan.hostfile and \
        [(h.name, h.slots) for h in plan.hosts] == plan.allocation.nodes
    if from_allocation and plan.allocation and plan.np and not plan.accelerators and \
            plan.np > plan.allocation.ntasks:
        # more ranks than the allocation holds: Slurm (or mpirun) says so, in its words
        plan.placement = None
    elif names and launcher != "jsrun":
        plan.placement = place(plan, gpus)
        if plan.racks and not plan.topology:
            plan.topology = grid_for(plan.placement, plan.racks)
    elif plan.racks:
        raise LaunchError("--racks needs the hosts (-H or --hostfile) to group")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    environ = dict(os.environ)
    extra_env: dict[str, str] = {}
    collector = None
    shm: JobShm | None = None  # the job's Open MPI shared-memory directory (jobshm.py)
    staging: Staging | None = None
    elastic: Elastic | None = None
    updates: HostUpdates | None = None
    try:
        plan = make_plan(args)
        # Every rank starts through exitreport.py, which reports its exit status here: the
        # launcher's own status is not to be trusted (see exitreport.py).
        plan.command = [sys.executable, str(Path(__file__).with_name("exitreport.py")),
                        *plan.command]
        elastic = start_elastic(args, plan)
        if elastic is not None:
            environ.update(elastic.environ())
            # ranks spawned later get the variables mpirun forwards by name (-x NAME), not
            # those given a value on its command line (-x NAME=value): seen with PRRTE 5.0
            for i, item in enumerate(plan.forward):
                name, eq, value = item.partition("=")
                if eq:
                    environ[name], plan.forward[i] = value, name
            environ["DDL_ELASTIC_COMMAND"] = json.dumps(plan.command)
        if not args.dry_run:
            try:
                collector = Collector(local_addresses())
                environ[EXIT_ENV] = collector.env_value
            except OSError as e:  # no TCP here: only the launcher's status is known
                print(f"ddlrun: warning: cannot collect the ranks' exit statuses ({e}); "
                      "the exit status is the launcher's", file=sys.stderr)
            shm = JobShm.open(environ)
        launcher = elastic_launcher(plan, args.launcher, choose_launcher(args.launcher,
                                                                         environ))
        if plan.launch_agent and launcher != "mpirun":
            raise LaunchError(f"--launch-agent is how mpirun reaches the hosts; {launcher} "
                              "starts the ranks itself: add --launcher mpirun, or leave "
                              "--launch-agent out")
        use_allocation(plan, launcher, environ)
        resolve(plan, launcher, check=not (args.no_host_check or args.dry_run))
        check_plan(plan, launcher, environ)
        if elastic is not None:
            elastic.hosts = {r: h for r, h in enumerate(
                h for h, n in (plan.placement or []) for _ in range(n))}
            elastic.check(launched(plan))
            if elastic.discovery and not args.dry_run:
                updates = HostUpdates(local_addresses(), {h.name: h.slots or 1
                                                          for h in plan.hosts},
                                      elastic.max_np, running_per_host([], elastic.hosts))
                environ[UPDATES_ENV] = updates.env_value
        if not args.no_tf_config and launcher != "jsrun":
            add_tf_config(plan, environ)
        if launcher == "mpirun":
            mpirun = find_mpirun()
            flavor: str | None = mpi_flavor(mpirun)
            staging = start_env(args, plan, launcher, flavor, environ)
            cmd = build_command(plan, mpirun, flavor or "openmpi", environ)
        elif launcher == "srun":
            try:
                flavor = mpi_flavor(find_mpirun())
            except LaunchError:
                flavor = None  # no MPI beside this Python: leave --mpi to Slurm
            staging = start_env(args, plan, launcher, flavor, environ)
            cmd, extra_env = build_srun(plan, environ, srun_mpi_plugin(flavor, environ))
        else:
            if args.env:
                raise LaunchError("--env with jsrun: not supported (jsrun starts the ranks "
                                  "itself and has no stage step); use --launcher mpirun")
            cmd = build_jsrun(plan, environ)
        if staging is not None:
            cmd = launch(staging, launcher, flavor, cmd)
    except LaunchError as e:
        if updates is not None:
            updates.close()
        if shm is not None:
            shm.close()
        if staging is not None:
            staging.close()
        if collector is not None:
            collector.close()
        print(f"ddlrun: error: {e}", file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        if plan.placement:
            grid = plan.topology or grid_for(plan.placement, None) or "flat (uneven hosts)"
            print("# placement: " + ", ".join(f"{h}:{n}" for h, n in plan.placement)
                  + f"; grid {grid}" + ("" if plan.topology else " (detected at init)"),
                  file=sys.stderr)
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items())
              + (" " if extra_env else "") + shlex.join(cmd), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    env = launch_environ(environ)
    env.update(extra_env)
    stopped: list[bool] = []
    stop = None
    poller = None
    if elastic is not None and collector is not None:
        el, col, np_ = elastic, collector, launched(plan)

        def stop() -> bool:  # fewer than --min-np ranks left: end the job now
            if too_few_left(col.snapshot(), np_, el.min_np):
                stopped.append(True)
                print(f"ddlrun: elastic: fewer than --min-np {el.min_np} ranks left; "
                      "ending the job", file=sys.stderr, flush=True)
            return bool(stopped)

        if updates is not None and el.discovery:
            poller = Poller(el.discovery, el.interval_s, el.timeout_s, el.slots_per_host,
                            updates, lambda: running_per_host(col.snapshot(), el.hosts,
                                                             set(updates.hosts)))
    try:
        status = _run_launcher(cmd, env, stop)
    finally:
        if poller is not None:
            poller.close()
        if updates is not None:
            updates.close()
        if staging is not None:
            staging.close()  # every node's copy removed
    reports = collector.close() if collector is not None else []
    if shm is not None:
        shm.close()  # after the launcher: however the job ended
    if elastic is not None and collector is not None:
        status, summary = elastic_status(reports, status, elastic, launched(plan),
                                         bool(stopped))
    else:
        status, summary = job_status(reports, status)
    if summary:
        print(summary, file=sys.stderr, flush=True)
    return status


def start_env(args: argparse.Namespace, plan: Plan, launcher: str, flavor: str | None,
              environ: dict[str, str]) -> Staging | None:
    """--env: stage the image to every node (not for --dry-run), make it the ranks' env,
    and wrap each rank where no per-node daemon can be (stage.py)."""
    if not args.env:
        return None
    if args.dry_run:
        print(f"# --env {args.env}: staged to each node first; the command below then runs "
              "inside the staged copy", file=sys.stderr)
        return None
    hosts = [h for h, _ in plan.placement] if plan.placement else \
        [h.name for h in plan_hosts(plan)]
    slurm = len(plan.allocation.nodes) if plan.allocation is not None else None
    t0 = time.monotonic()
    st = stage(args.env, hosts, plan.launch_agent, args.stage_dir, slurm_nodes=slurm,
               here=launcher == "mpirun")
    if args.verbose:
        nodes = sum(k.expect for k in st.keepers)
        print(f"# --env {args.env}: staged {st.size / 2**20:.0f} MiB to {nodes} "
              f"node{'s' if nodes != 1 else ''} in {time.monotonic() - t0:.2f} s (sha256 "
              "checked on each)", file=sys.stderr, flush=True)
    st.activate(environ)
    if per_rank(launcher, flavor):
        plan.command = wrap_ranks(st, plan.command)
    return st


def launched(plan: Plan) -> int:
    """How many ranks the launch starts (what --min-np is counted against)."""
    if plan.np:
        return plan.np
    if plan.placement:
        return sum(n for _, n in plan.placement)
    return 1


def _run_launcher(cmd: list[str], env: dict[str, str],
                  stop: Callable[[], bool] | None = None) -> int:
    """Run the launcher as a child (not exec: its exit status is only part of the
    answer), passing Ctrl-C on (child.py). The status: its exit code, or 128+signal."""
    try:
        return run_forwarding(cmd, env, stop=stop).status
    except OSError as e:
        print(f"ddlrun: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
