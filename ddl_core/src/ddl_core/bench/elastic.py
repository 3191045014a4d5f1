"""What a lost rank costs an elastic job, and what elastic mode costs a healthy one.

    python -m ddl_core.bench elastic [--ranks 8] [--hosts 2,4] [--trials 100]
                                     [--healthy-reps 5] [--json F] [--plot F.png]

Every trial is a real job, `ddlrun --elastic -n RANKS` on HOSTS emulated hosts (network
namespaces: the repository's ddl_tools.cluster, so it needs root; `--hosts 1` runs on
this machine alone), of a training loop with a commit every step: each step computes a
gradient (a fixed amount of arithmetic, the same on every rank: `--work`), allreduces it
(`--params` float64 values) and applies it; the commit copies the parameters and the step
in memory. The victim (a different rank each trial, rank 0 included) writes the time
(CLOCK_MONOTONIC: the emulated hosts share one kernel) and SIGKILLs itself before step
`--kill-step`. Each survivor catches ddl_core.ProcessFailedError, shrinks the world
(ddl_core.shrink_world), agrees with the others on the newest commit any of them holds (its
step, then its parameters broadcast from the lowest rank holding it: a survivor whose
previous step had not yet finished when the victim died catches up, nobody goes back) and
redoes the step that failed. Reported per trial: the time from the kill to the last
survivor finishing that step (target <= 1.0 s), whether the job ended (no hang: each job
has a deadline), whether the step restored was the one committed before the kill (no
committed step lost), and whether every survivor ended with bit-identical parameters.

The healthy-job cost: the same loop without a victim, `--healthy-reps` jobs each of plain
`ddlrun` (no commit, no fault tolerance) and of `ddlrun --elastic` (ULFM, and a commit
every step), alternated in one run; the figure is the slowest rank's median step time,
the median over the jobs of each kind (target: elastic within 3% of plain).

Losing a whole host is not a row: with the Open MPI 5.0.11 this project ships, PRRTE 3.0
ends the job when a daemon is lost (docs/elastic.md, "Under Slurm, and losing a whole
host").
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: a job's deadline: a hang is a failed trial, not a stuck benchmark
JOB_TIMEOUT_S = 180.0


# -- the ranks' side ---------------------------------------------------------------------

def worker(a: argparse.Namespace) -> int:
    """One rank of a trial (see the module's docstring); writes rank-R.json into --out."""
    import numpy as np

    import ddl_core as ddl

    ddl.init()
    me0, n0 = ddl.rank(), ddl.size()
    elastic = ddl.fault_tolerant()
    rng = np.random.default_rng(1234)
    mat = rng.standard_normal((96, 96)) / 96  # the step's arithmetic (--work products)
    params = np.zeros(a.params)
    saved = (0, params.copy())
    step, recovering, death = 0, False, None
    record: dict[str, Any] = {"rank0": me0, "size0": n0, "elastic": elastic, "resets": 0}
    step_s: list[float] = []
    while step < a.steps:
        if me0 == a.victim and step == a.kill_step:
            a.stamp.write_text(f"{time.monotonic():.6f}")
            os.kill(os.getpid(), signal.SIGKILL)
        t = time.monotonic()
        try:
            m = mat
            for _ in range(a.work):
                m = np.tanh(m @ mat)
            grad = np.random.default_rng(step * 1009 + me0).standard_normal(a.params)
            grad[:1] += m[0, 0]
            total = ddl.allreduce(grad)
            params -= 0.01 * total / ddl.size()
        except ddl.ProcessFailedError as e:
            if death is None and a.stamp.exists():
                death = float(a.stamp.read_text())
            record["resets"] += 1
            record["lost"] = sorted(set(record.get("lost", [])) | set(e.ranks))
            record["failed_step"] = step
            ddl.shrink_world()
            step, params = _newest_commit(ddl, np, saved)
            record["restored_step"] = step
            recovering = True
            continue
        step += 1
        if elastic:
            saved = (step, params.copy())
        dt = time.monotonic() - t
        if recovering:
            record["recovered_s"] = time.monotonic() - death if death is not None else None
            recovering = False
        elif step > 2:  # (the first steps warm up)
            step_s.append(dt)
    digest = np.frombuffer(hashlib.sha256(params.tobytes()).digest(), dtype=np.uint8)
    every = ddl.allgather(digest).reshape(ddl.size(), -1)
    record.update(size=ddl.size(), identical=bool((every == every[0]).all()),
                  step_s=statistics.median(step_s) if step_s else None,
                  kill_step=a.kill_step if a.victim >= 0 else None)
    (a.out / f"rank-{me0}.json").write_text(json.dumps(record))
    return 0


def _newest_commit(ddl: Any, np: Any, saved: tuple[int, Any]) -> tuple[int, Any]:
    """The newest commit any survivor holds, on every survivor: the steps gathered, the
    parameters broadcast from the lowest rank that has the newest."""
    steps = ddl.allgather(np.array([saved[0]], dtype=np.int64))
    newest = int(steps.max())
    root = int(np.flatnonzero(steps == newest)[0])
    params = saved[1].copy()
    ddl.broadcast(params, root=root)
    return newest, params


# -- the driver --------------------------------------------------------------------------

def _job(a: argparse.Namespace, ddlrun_argv: Any, launch: list[str], elastic: bool,
         victim: int, tmp: Path) -> tuple[list[dict[str, Any]], str, int | None]:
    """One job; (every survivor's record, its output, ddlrun's status or None: a hang)."""
    out = tmp / f"job-{time.monotonic_ns()}"
    out.mkdir()
    args = [*launch, *(["--elastic"] if elastic else []), "-n", str(a.ranks),
           sys.executable, "-m", "ddl_core.bench", "elastic", "worker",
           "--steps", str(a.steps), "--params", str(a.params), "--work", str(a.work),
           "--victim", str(victim), "--kill-step", str(a.kill_step),
           "--stamp", str(out / "death"), "--out", str(out)]
    cmd = ddlrun_argv(args)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               DDL_TIMEOUT=str(int(JOB_TIMEOUT_S)))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    rc: int | None
    try:
        text, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:  # a hang: the whole job goes, not just ddlrun
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        rc = None
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    return records, text, rc


def _trial_row(records: list[dict[str, Any]], rc: int | None, a: argparse.Namespace,
               victim: int) -> dict[str, Any]:
    rec = [r.get("recovered_s") for r in records]
    ok_all = len(records) == a.ranks - 1 and rc == 0
    return {
        "victim": victim, "rc": rc, "survivors": len(records),
        "finished": ok_all,
        "recovered_s": max(rec) if ok_all and None not in rec else None,
        "no_lost_step": ok_all and all(r.get("restored_step") == a.kill_step
                                       for r in records),
        "identical": ok_all and all(r["identical"] for r in records),
        "size": records[0]["size"] if records else None,
    }


def measure(a: argparse.Namespace) -> int:
    # SIGTERM (a stopped run, a job's time limit) unwinds like Ctrl-C, so the emulated
    # cluster and the scratch directory go with it
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    hosts_list = [int(h) for h in a.hosts.split(",") if h]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    print(f"# ddl_core.bench elastic: {shlex.join(sys.argv)}\n# {a.ranks} ranks, {a.steps} "
          f"steps (a commit every step), {a.params} float64 parameters, --work {a.work}; "
          f"victim SIGKILLs itself before step {a.kill_step}; {os.cpu_count()} cores; load "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; {started}", flush=True)
    results: dict[str, Any] = {"command": shlex.join(sys.argv), "started": started,
                               "load_start": load0, "ranks": a.ranks, "configs": []}
    failed = False
    with tempfile.TemporaryDirectory(prefix="ddl-elastic-bench-") as d:
        tmp = Path(d)
        for hosts in hosts_list:
            with _cluster(hosts) as ddlrun_argv:
                launch = ["--mpi-args=--mca mpi_yield_when_idle 1",
                          "--accelerators", str(max(1, a.ranks // hosts))]
                trials = []
                victims = a.victims or list(range(a.ranks))
                for i in range(a.trials):
                    victim = victims[i % len(victims)]
                    records, text, rc = _job(a, ddlrun_argv, launch, True, victim, tmp)
                    row = _trial_row(records, rc, a, victim)
                    trials.append(row)
                    if not (row["finished"] and row["no_lost_step"] and row["identical"]):
                        failed = True
                        seen = [{k: r.get(k) for k in ("rank0", "size", "resets", "lost")}
                                for r in records]
                        print(f"# trial {i + 1} (victim {victim}) failed: rc {rc}, "
                              f"{row}; survivors' records {seen}\n{text[-2500:]}", flush=True)
                    if (i + 1) % 10 == 0 or i + 1 == a.trials:
                        print(f"  {hosts} hosts: {i + 1}/{a.trials} trials, "
                              f"{_summary(trials)}", flush=True)
                healthy = {"plain": [], "elastic": []}
                for _ in range(a.healthy_reps):
                    for kind in ("plain", "elastic"):
                        records, text, rc = _job(a, ddlrun_argv, launch,
                                                 kind == "elastic", -1, tmp)
                        if rc != 0 or len(records) != a.ranks:
                            failed = True
                            print(f"# healthy {kind} job failed (rc {rc}):\n{text[-2500:]}")
                            continue
                        healthy[kind].append(max(r["step_s"] for r in records))
                cfg = {"hosts": hosts, "trials": trials, "healthy_step_s": healthy}
                results["configs"].append(cfg)
                print(_config_lines(cfg, a), flush=True)
                results["load_now"] = os.getloadavg()
                if a.json:
                    a.json.write_text(json.dumps(results, indent=1))
    load1 = os.getloadavg()
    print(f"# load {load0[0]:.1f} -> {load1[0]:.1f}")
    if a.plot:
        _plot(results, a.plot)
    return 1 if failed else 0


@contextlib.contextmanager
def _cluster(hosts: int):
    """A function giving the argv that runs ddlrun with the given arguments on `hosts`
    emulated hosts (this machine itself for one). The emulated cluster is the repository's
    tool (`python -m ddl_tools.cluster`), driven through its command line: the library
    does not import the repository's tools."""
    ddlrun = str(Path(sys.executable).with_name("ddlrun"))
    if hosts <= 1:
        yield lambda args: [ddlrun, "--oversubscribe", *args]
        return
    if os.geteuid() != 0:
        raise SystemExit("ddl_core.bench elastic: emulated hosts need root (network "
                         "namespaces); run as root or with --hosts 1")
    tool = [sys.executable, "-m", "ddl_tools.cluster"]
    name = f"el{os.getpid() % 100000}"[:8]
    up = subprocess.run([*tool, "up", "--name", name, "--hosts", str(hosts)],
                        capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit("ddl_core.bench elastic: no emulated cluster (it needs the "
                         "repository's tools: pip install -e tools; or --hosts 1): "
                         + (up.stderr or up.stdout)[-800:])
    try:
        yield lambda args: [*tool, "ddlrun", "--name", name, "--", *args]
    finally:
        subprocess.run([*tool, "down", "--name", name], capture_output=True)


def _summary(trials: list[dict[str, Any]]) -> str:
    rec = [t["recovered_s"] for t in trials if t["recovered_s"] is not None]
    done = sum(t["finished"] for t in trials)
    text = (f"{done} finished, {sum(t['no_lost_step'] for t in trials)} lost no step, "
            f"{sum(t['identical'] for t in trials)} identical")
    if rec:
        text += (f"; kill -> next step done: median {statistics.median(rec):.3f} s, "
                 f"max {max(rec):.3f} s, {sum(r <= 1.0 for r in rec)} <= 1.0 s")
    return text


def _config_lines(cfg: dict[str, Any], a: argparse.Namespace) -> str:
    h = cfg["healthy_step_s"]
    lines = [f"{cfg['hosts']} host(s), {a.ranks} ranks: {len(cfg['trials'])} trials: "
             f"{_summary(cfg['trials'])}"]
    if h["plain"] and h["elastic"]:
        p, e = statistics.median(h["plain"]), statistics.median(h["elastic"])
        lines.append(f"  healthy step (slowest rank's median; median of {len(h['plain'])} "
                     f"jobs each): plain {p * 1e3:.2f} ms, elastic {e * 1e3:.2f} ms = "
                     f"{e / p:.3f}x plain (jobs: plain "
                     f"{', '.join(f'{x * 1e3:.2f}' for x in h['plain'])}; elastic "
                     f"{', '.join(f'{x * 1e3:.2f}' for x in h['elastic'])} ms)")
    return "\n".join(lines)


def _plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for cfg in results["configs"]:
        rec = sorted(t["recovered_s"] for t in cfg["trials"] if t["recovered_s"] is not None)
        if rec:
            ax.plot(rec, [(i + 1) / len(cfg["trials"]) for i in range(len(rec))],
                    drawstyle="steps-post", label=f"{cfg['hosts']} hosts")
    ax.axvline(1.0, color="grey", linestyle="--", label="target 1.0 s")
    ax.set_xlabel("SIGKILL of one rank -> every survivor's next step done (s)")
    ax.set_ylabel("fraction of trials")
    ax.set_title(f"ddlrun --elastic, {results['ranks']} ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench elastic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what")
    w = sub.add_parser("worker", help="one rank of a trial (run under ddlrun)")
    w.add_argument("--victim", type=int, default=-1)
    w.add_argument("--stamp", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    for p in (ap, w):
        p.add_argument("--steps", type=int, default=20, help="training steps per job [20]")
        p.add_argument("--params", type=int, default=1 << 18,
                       help="float64 parameters allreduced every step [262144: 2 MiB]")
        p.add_argument("--work", type=int, default=20,
                       help="96x96 matrix products per step (the step's compute) [20]")
        p.add_argument("--kill-step", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hosts", default="2,4", help="emulated host counts, in turn [2,4]")
    ap.add_argument("--trials", type=int, default=100, help="killed jobs per host count")
    ap.add_argument("--victims", type=lambda v: [int(x) for x in v.split(",") if x],
                    default=None, help="the ranks killed, in turn (a failing case on its "
                    "own) [every rank in turn]")
    ap.add_argument("--healthy-reps", type=int, default=5,
                    help="healthy jobs of each kind per host count [5]")
    ap.add_argument("--json", type=Path, help="write every trial here")
    ap.add_argument("--plot", type=Path, help="a PNG of the recovery times")
    a = ap.parse_args(argv)
    if a.what == "worker":
        return worker(a)
    if a.ranks < 2 or not 0 <= a.kill_step < a.steps:
        ap.error("needs --ranks >= 2 and 0 <= --kill-step < --steps")
    return measure(a)


if __name__ == "__main__":
    sys.exit(main())
