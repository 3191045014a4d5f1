"""`horovodrun -np 4 -H a:2,b:2 python train.py` -> `ddlrun -n 4 -H a:2,b:2 python train.py`.

Horovod's common options are translated; the ones that only tune Horovod's own runtime
(fusion, cycle time, autotune, timeline) become DDL's environment variables or are
accepted and ignored, so existing job scripts keep working.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    for flag in ("--min-np", "--max-np", "--host-discovery-script", "--slots-per-host",
                 "--elastic-timeout", "--reset-limit", "--blacklist-cooldown-range"):
        ap.add_argument(flag, dest="elastic", action="append", default=[],
                        help="refused: elastic Horovod is not supported")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the ddlrun command")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("-x", dest="forward", action="append", default=[], metavar="VAR[=VALUE]",
                    help="export an environment variable to the ranks")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return ap


def translate(argv: list[str]) -> list[str]:
    """The ddlrun argument list for a horovodrun argument list."""
    a = parser().parse_args(argv)
    if a.elastic:
        raise SystemExit("horovodrun: elastic Horovod (--min-np, --max-np, "
                         "--host-discovery-script, ...) is not supported by horovod-ddl: a DDL "
                         "job has a fixed size; run -np N and restart from a checkpoint")
    if a.gloo:
        raise SystemExit("horovodrun: --gloo is not available; horovod-ddl runs on MPI")
    out: list[str] = []
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
