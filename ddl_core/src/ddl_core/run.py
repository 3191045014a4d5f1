"""ddlrun: launch a DDL job.

    ddlrun -n 4 python train.py
    ddlrun -H server1:4,server2:4 --topology 4x2 python train.py
    ddlrun -v --hostfile hosts -x NCCL_DEBUG=INFO -- python train.py --epochs 3

Everything not understood here (and everything after `--`) is the program and its
arguments; launcher options can be passed with --mpi-args "...".
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .launcher import (
    LaunchError,
    Plan,
    build_command,
    find_mpirun,
    launch_environ,
    mpi_flavor,
    parse_hostfile,
    parse_hosts,
    parse_topology,
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ddlrun", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "-np", dest="np", type=int, help="number of ranks (default: the "
                    "slots of the hosts, else 1)")
    ap.add_argument("-H", "--hosts", help="host[:slots],... to run on")
    ap.add_argument("--hostfile", help="a file of 'host slots=N' lines")
    ap.add_argument("--topology", help="the rank grid, innermost first, e.g. 4x2 (4 per node x "
                    "2 nodes) or 4x2x2 (x 2 racks); sets DDL_TOPOLOGY")
    ap.add_argument("-x", dest="forward", action="append", default=[], metavar="VAR[=VALUE]",
                    help="export an environment variable to every rank (repeatable)")
    ap.add_argument("--mpi-args", default="", help="extra launcher options, as one string")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print the exact launcher command before running it")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
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
        parse_hostfile(args.hostfile)  # validated here, passed to the launcher as a file
    if hosts and args.hostfile:
        raise LaunchError("give either -H or --hostfile, not both")
    return Plan(command=command, np=args.np, hosts=hosts, hostfile=args.hostfile,
                topology=parse_topology(args.topology) if args.topology else None,
                forward=args.forward, extra=shlex.split(args.mpi_args))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        plan = make_plan(args)
        mpirun = find_mpirun()
        cmd = build_command(plan, mpirun, mpi_flavor(mpirun), dict(os.environ))
    except LaunchError as e:
        print(f"ddlrun: error: {e}", file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        print(shlex.join(cmd), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    env = launch_environ(dict(os.environ))
    os.execvpe(cmd[0], cmd, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
