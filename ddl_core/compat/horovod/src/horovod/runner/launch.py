"""`horovodrun -np 4 -H a:2,b:2 python train.py` -> `ddlrun -n 4 -H a:2,b:2 python train.py`.

Horovod's common options are translated; the ones that only tune Horovod's own runtime
(fusion, cycle time, autotune, timeline) become DDL's environment variables or are
accepted and ignored, so existing job scripts keep working.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from ddl_core.runner import run as ddlrun


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="horovodrun", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-np", "--num-proc", dest="np", type=int, help="number of processes")
    ap.add_argument("-H", "--hosts", help="host1:slots,host2:slots")
    ap.add_argument("-hostfile", "--hostfile", dest="hostfile", help="'host slots=N' lines")
    ap.add_argument("-p", "--ssh-port", type=int, help="accepted, ignored (MPI's launcher)")
    ap.add_argument("-i", "--ssh-identity-file", help="accepted, ignored")
    ap.add_argument("--mpi", action="store_true", help="accepted: DDL always runs on MPI")
    ap.add_argument("--gloo", action="store_true", help="refused: DDL runs on MPI")
    ap.add_argument("--mpi-args", default="", help="extra mpirun options, one string")
    ap.add_argument("--network-interface", "--network-interfaces", dest="nics",
                    help="comma-separated interfaces for MPI's TCP traffic")
    ap.add_argument("--fusion-threshold-mb", type=float, help="-> DDL_FUSION_THRESHOLD")
    ap.add_argument("--cycle-time-ms", type=float, help="-> DDL_CYCLE_TIME_MS")
    ap.add_argument("--start-timeout", type=float, help="accepted, ignored")
    ap.add_argument("--timeline-filename", help="-> HOROVOD_TIMELINE (a Chrome-trace JSON)")
    ap.add_argument("--autotune", action="store_true", help="accepted, ignored")
    ap.add_argument("-cb", "--check-build", action="store_true",
                    help="print the frameworks, controllers and tensor operations available")
    el = ap.add_argument_group("elastic (Horovod's options; run as ddlrun --elastic)")
    el.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int,
                    help="fewest ranks the job goes on with after losing some (default: -np)")
    el.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int,
                    help="most ranks the job grows to on hosts the discovery script adds")
    el.add_argument("--host-discovery-script", dest="discovery",
                    help="an executable printing the available 'host[:slots]' lines")
    el.add_argument("--slots-per-host", "--slots", dest="slots", type=int,
                    help="slots of a host the discovery script lists without a count")
    el.add_argument("--elastic-timeout", type=int, help="accepted, ignored (ranks are not "
                    "re-launched at a reset, so there is no start-up to wait for)")
    el.add_argument("--reset-limit", type=int,
                    help="end the job after this many resets (HOROVOD_RESET_LIMIT)")
    el.add_argument("--blacklist-cooldown-range", dest="cooldown", type=int, nargs=2,
                    metavar=("MIN_S", "MAX_S"), help="accepted, ignored (a failed host is "
                    "left for the rest of the job)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the ddlrun command")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("-x", dest="forward", action="append", default=[], metavar="VAR[=VALUE]",
                    help="export an environment variable to the ranks")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return ap


def translate(argv: list[str]) -> list[str]:
    """The ddlrun argument list for a horovodrun argument list."""
    a = parser().parse_args(argv)
    if a.gloo:
        raise SystemExit("horovodrun: --gloo is not available; horovod-ddl runs on MPI")
    out: list[str] = _elastic_args(a)
    if a.np is not None:
        out += ["-n", str(a.np)]
    if a.hosts:
        out += ["-H", a.hosts]
    if a.hostfile:
        out += ["--hostfile", a.hostfile]
    mpi_args = a.mpi_args
    if a.nics:
        mpi_args = f"{mpi_args} --mca btl_tcp_if_include {a.nics}".strip()
    if mpi_args:
        out += ["--mpi-args", mpi_args]
    for var in a.forward:
        out += ["-x", var]
    if a.fusion_threshold_mb is not None:
        out += ["-x", f"DDL_FUSION_THRESHOLD={int(a.fusion_threshold_mb * 1024 * 1024)}"]
    if a.timeline_filename:
        out += ["-x", f"HOROVOD_TIMELINE={a.timeline_filename}"]
    if a.cycle_time_ms is not None:
        out += ["-x", f"DDL_CYCLE_TIME_MS={a.cycle_time_ms}"]
    if a.verbose:
        out.append("-v")
    if a.dry_run:
        out.append("--dry-run")
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        raise SystemExit("horovodrun: no command to run")
    return [*out, "--", *command]


def is_elastic(a: argparse.Namespace) -> bool:
    """Horovod's rule: a discovery script or --min-np makes the job elastic."""
    return a.discovery is not None or a.min_np is not None


def _elastic_args(a: argparse.Namespace) -> list[str]:
    """ddlrun's elastic options for Horovod's, after Horovod's checks (elastic options
    without an elastic job, and sizes that cannot hold, are refused before anything runs;
    -np defaults to --min-np)."""
    def refuse(why: str) -> SystemExit:
        return SystemExit(f"horovodrun: {why}")

    if not is_elastic(a):
        stray = [flag for flag, v in (("--max-np", a.max_np), ("--slots-per-host", a.slots),
                                      ("--reset-limit", a.reset_limit),
                                      ("--blacklist-cooldown-range", a.cooldown)) if v is not None]
        if stray:
            raise refuse(f"{', '.join(stray)} only apply to an elastic job: add "
                         "--min-np N or --host-discovery-script SCRIPT")
        return []
    if a.np is None:
        if a.min_np is None:
            raise refuse("an elastic job needs -np N (the ranks to start with) or --min-np")
        a.np = a.min_np
    min_np = a.np if a.min_np is None else a.min_np
    for flag, v in (("-np", a.np), ("--min-np", min_np), ("--max-np", a.max_np),
                    ("--slots-per-host", a.slots)):
        if v is not None and v < 1:
            raise refuse(f"{flag} {v}: must be at least 1")
    if min_np > a.np:
        raise refuse(f"--min-np {min_np} is above -np {a.np}: the job would start below "
                     "its own minimum; lower --min-np or raise -np")
    if a.max_np is not None and a.max_np < a.np:
        raise refuse(f"--max-np {a.max_np} is below -np {a.np}: raise --max-np or lower -np")
    if a.reset_limit is not None and a.reset_limit < 0:
        raise refuse(f"--reset-limit {a.reset_limit}: must be 0 or more")
    if a.cooldown is not None and not 0 <= a.cooldown[0] <= a.cooldown[1]:
        raise refuse(f"--blacklist-cooldown-range {a.cooldown[0]} {a.cooldown[1]}: give "
                     "MIN MAX seconds with 0 <= MIN <= MAX")
    if a.discovery is not None:
        if a.hosts or a.hostfile:
            raise refuse("give either --host-discovery-script or -H/--hostfile, not both: "
                         "the script says which hosts the job has")
        if not os.path.isfile(a.discovery) or not os.access(a.discovery, os.X_OK):
            raise refuse(f"--host-discovery-script {a.discovery}: not an executable file "
                         f"(chmod +x it, or give its path)")
    wanted = ["--elastic", "--min-np", "--max-np", "--host-discovery-script"]
    if a.slots is not None:
        wanted.append("--slots-per-host")
    missing = [f for f in wanted if f not in ddlrun.parser()._option_string_actions]
    if missing:
        raise refuse(f"this ddl_core's ddlrun has no {', '.join(missing)}, which elastic "
                     "Horovod runs on: install a ddl_core with elastic jobs (ddlrun --elastic)")
    out = ["--elastic", "--min-np", str(min_np)]
    if a.max_np is not None:
        out += ["--max-np", str(a.max_np)]
    if a.discovery is not None:
        out += ["--host-discovery-script", os.path.abspath(a.discovery)]
    if a.slots is not None:
        out += ["--slots-per-host", str(a.slots)]
    if a.reset_limit is not None:
        out += ["-x", f"HOROVOD_RESET_LIMIT={a.reset_limit}"]
    out += ["-x", "HOROVOD_ELASTIC=1"]
    return out


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_build() -> str:
    """Horovod's --check-build report for this install: which framework front ends can
    load (their framework is installed), the controller (MPI) and the tensor operations
    (DDL always; NCCL when libddl finds it at run time for GPU tensors)."""
    import horovod
    from horovod.common import basics

    def box(ok: bool) -> str:
        return "[X]" if ok else "[ ]"

    frameworks = [("TensorFlow", _importable("tensorflow")), ("PyTorch", _importable("torch")),
                  ("MXNet", False)]
    controllers = [("MPI", True), ("Gloo", False)]
    ops = [("NCCL", bool(basics.nccl_built())), ("DDL", True), ("CCL", False), ("MPI", True),
           ("Gloo", False)]
    lines = [f"Horovod v{horovod.__version__} (horovod-ddl: Horovod's API on DDL, "
             f"ddl_core {ddlrun_version()}):", "", "Available Frameworks:"]
    lines += [f"    {box(ok)} {name}" for name, ok in frameworks]
    lines += ["", "Available Controllers:"]
    lines += [f"    {box(ok)} {name}" for name, ok in controllers]
    lines += ["", "Available Tensor Operations:"]
    lines += [f"    {box(ok)} {name}" for name, ok in ops]
    return "\n".join(lines) + "\n"


def ddlrun_version() -> str:
    try:
        from importlib.metadata import version

        return version("ddl_core")
    except Exception:  # noqa: BLE001 - an uninstalled checkout
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "-cb" in args or "--check-build" in args:
        sys.stdout.write(check_build())
        return 0
    return ddlrun.main(translate(args))


if __name__ == "__main__":
    raise SystemExit(main())
