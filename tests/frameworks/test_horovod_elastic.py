"""horovod-ddl's elastic Horovod: hvd.elastic's state and run-loop semantics in a real
2-rank job, and horovodrun's elastic options (-np, --min-np, --max-np,
--host-discovery-script, --reset-limit) checked and translated to ddlrun --elastic as
Horovod defines them."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN, WORKERS, mpirun, need, ok_lines, run_job

pytestmark = pytest.mark.timeout(600)


def test_elastic_state_and_run_loop_on_a_healthy_job() -> None:
    need("torch")
    proc = mpirun(2, WORKERS / "hvd_elastic.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_elastic") == 2, proc.stdout


def test_keras_state_and_callbacks_on_a_healthy_job() -> None:
    need("tensorflow")
    proc = mpirun(2, WORKERS / "hvd_elastic_keras.py", env={"DDL_TIMEOUT": "60"})
    assert ok_lines(proc, "hvd_elastic_keras") == 2, proc.stdout


def _need_fault_tolerance() -> None:
    import ddl_core

    if not hasattr(ddl_core, "shrink_world"):
        pytest.skip("this ddl_core has no fault tolerance (ddl_core.shrink_world)")


def _survivors(proc: object, n: int) -> list[str]:
    out = proc.stdout  # type: ignore[attr-defined]
    lines = re.findall(r"^OK hvd_elastic_kill .*$", out, re.M)
    assert len(lines) == n, out[-4000:] + proc.stderr[-4000:]  # type: ignore[attr-defined]
    digests = {line.rsplit("params=", 1)[1] for line in lines}
    assert len(digests) == 1, lines
    return lines


@pytest.mark.parametrize("n,args,survivors", [
    (3, ["20", "5"], 2),          # the last rank
    (4, ["20", "5", "0"], 3),     # rank 0, the one the state is synchronised from
    (4, ["20", "3", "1,2"], 2),   # two at once
])
def test_training_goes_on_through_a_sigkill(n: int, args: list[str], survivors: int) -> None:
    """horovodrun -np N --min-np 2 (ddlrun --elastic: ULFM): the survivors of SIGKILLed
    ranks restore the last commit, shrink the world, finish every step, and end with the
    same parameters; the job's status is theirs (0) and ddlrun names the ranks lost."""
    need("torch")
    _need_fault_tolerance()
    _need_ddlrun_elastic()
    proc = run_job([str(BIN / "horovodrun"), "-np", str(n), "--min-np", "2", "--mpi-args",
                    "--mca mpi_yield_when_idle 1", sys.executable,
                    str(WORKERS / "hvd_elastic_kill.py"), *args],
                   env={"DDL_TIMEOUT": "60"}, check=False, timeout=300)
    lines = _survivors(proc, survivors)
    assert all(f"size={survivors}" in line for line in lines), lines
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{n - survivors} rank{'s' if n - survivors > 1 else ''} lost" in proc.stderr, \
        proc.stderr[-3000:]


def test_a_job_below_min_np_fails() -> None:
    """--min-np 3 of 3: a death leaves too few, and the job ends with an error."""
    need("torch")
    _need_fault_tolerance()
    _need_ddlrun_elastic()
    proc = run_job([str(BIN / "horovodrun"), "-np", "3", "--min-np", "3", "--mpi-args",
                    "--mca mpi_yield_when_idle 1", sys.executable,
                    str(WORKERS / "hvd_elastic_kill.py"), "20", "5"],
                   env={"DDL_TIMEOUT": "60"}, check=False, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    # (ddlrun ends the job when it sees too few left; survivors quicker than that may
    # finish first, which does not change the job's status)
    assert "--min-np 3" in proc.stderr, proc.stderr[-3000:]


def _grow(tmp_path: Path, discover: str, max_np: int, *worker_args: str, timeout: float
          ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """horovodrun -np 2 --max-np MAX_NP of workers/hvd_elastic_grow.py with `discover` as
    the discovery script's body; (the finished job, its ranks' OK lines)."""
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\n{discover}\n")
    script.chmod(0o755)
    proc = run_job([str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np",
                    str(max_np), "--host-discovery-script", str(script), "--mpi-args",
                    "--mca mpi_yield_when_idle 1", sys.executable,
                    str(WORKERS / "hvd_elastic_grow.py"), *worker_args],
                   env={"DDL_TIMEOUT": "60"}, check=False, timeout=timeout)
    return proc, re.findall(r"^OK hvd_elastic_grow .*$", proc.stdout, re.M)


def test_a_host_update_grows_the_job(tmp_path: Path) -> None:
    """horovodrun --host-discovery-script: the script reports a third slot after epoch 0;
    the job grows from 2 ranks to 3 at the next commit (the new rank spawned, merged,
    synchronised) and all three finish with the same parameters."""
    need("torch")
    need("mpi4py")
    _need_fault_tolerance()
    _need_ddlrun_elastic()
    flag = tmp_path / "epoch1"
    proc, lines = _grow(tmp_path, f"if [ -e {flag} ]; then echo localhost:3; "
                        "else echo localhost:2; fi", 3, str(flag), "3", timeout=300)
    assert proc.returncode == 0 and len(lines) == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all("size=3" in x and "same=True" in x and "epoch=3" in x for x in lines), lines
    assert sorted(x.split()[2] for x in lines) == ["start_rank=0", "start_rank=1",
                                                  "start_rank=2"], lines
    assert sum("resets=[3]" in x for x in lines) == 2, lines  # the two that were there


def test_two_host_updates_grow_the_job_twice(tmp_path: Path) -> None:
    """Two growths, 2 -> 3 -> 4 ranks: the second reset shrinks and spawns from a world a
    spawn made (Open MPI marks it as holding another job's ranks). Every rank then exits
    0: MPI_Finalize crashed (a heap corruption in Open MPI's disconnect of such
    communicators) while a replaced world was still alive at exit."""
    need("torch")
    need("mpi4py")
    _need_fault_tolerance()
    _need_ddlrun_elastic()
    flag = tmp_path / "grows"
    proc, lines = _grow(tmp_path, f"n=$(cat {flag} 2>/dev/null || echo 0)\n"
                        "echo localhost:$((2 + n))", 4, str(flag), "3", "0,1", timeout=400)
    assert proc.returncode == 0 and len(lines) == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all("size=4" in x and "same=True" in x and "epoch=3" in x for x in lines), lines
    assert "free()" not in proc.stderr and "Signal:" not in proc.stderr, proc.stderr[-3000:]


def _translate(*argv: str) -> list[str]:
    from horovod.runner.launch import translate

    return translate(list(argv))


def _script(tmp_path: Path) -> str:
    s = tmp_path / "discover.sh"
    s.write_text("#!/bin/sh\necho localhost:2\n")
    s.chmod(s.stat().st_mode | stat.S_IXUSR)
    return str(s)


def _need_ddlrun_elastic() -> None:
    from ddl_core.runner import run

    if "--elastic" not in run.parser()._option_string_actions:
        pytest.skip("this ddl_core's ddlrun has no --elastic")


def test_horovodrun_elastic_options_become_ddlrun_elastic(tmp_path: Path) -> None:
    _need_ddlrun_elastic()
    script = _script(tmp_path)
    out = _translate("-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script",
                     script, "--reset-limit", "3", "python", "train.py")
    assert out[:out.index("--")] == [
        "--elastic", "--min-np", "1", "--max-np", "4", "--host-discovery-script", script,
        "-x", "HOROVOD_RESET_LIMIT=3", "-x", "HOROVOD_ELASTIC=1", "-n", "2"]
    assert out[out.index("--") + 1:] == ["python", "train.py"]
    # Horovod's defaults: --min-np alone makes a job elastic, -np defaults to it; the
    # minimum defaults to -np when only the script is given.
    assert _translate("--min-np", "2", "-H", "a:2,b:2", "x")[:5] == [
        "--elastic", "--min-np", "2", "-x", "HOROVOD_ELASTIC=1"]
    assert "-n" in (o := _translate("--min-np", "2", "x")) and o[o.index("-n") + 1] == "2"
    o = _translate("-np", "3", "--host-discovery-script", script, "x")
    assert o[:3] == ["--elastic", "--min-np", "3"]
    # Horovod's long spellings
    assert _translate("-np", "2", "--min-num-proc", "2", "--max-num-proc", "2", "x")[:5] == [
        "--elastic", "--min-np", "2", "--max-np", "2"]
    # a fixed-size job is unchanged
    assert _translate("-np", "2", "x") == ["-n", "2", "--", "x"]


@pytest.mark.parametrize("argv,words", [
    (["-np", "2", "--min-np", "3"], "--min-np 3 is above -np 2"),
    (["-np", "4", "--min-np", "2", "--max-np", "3"], "--max-np 3 is below -np 4"),
    (["-np", "2", "--min-np", "0"], "--min-np 0: must be at least 1"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1"], "--reset-limit -1"),
    (["-np", "2", "--max-np", "4"], "only apply to an elastic job"),
    (["-np", "2", "--reset-limit", "2"], "only apply to an elastic job"),
    (["--host-discovery-script", "/nonexistent/discover.sh"], "needs -np N"),
    (["-np", "2", "--host-discovery-script", "/nonexistent/discover.sh"],
     "not an executable file"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "5", "1"], "0 <= MIN <= MAX"),
])
def test_horovodrun_refuses_elastic_options_that_cannot_hold(argv: list[str], words: str
                                                              ) -> None:
    with pytest.raises(SystemExit) as e:
        _translate(*argv, "python", "train.py")
    assert words in str(e.value), e.value


def test_horovodrun_elastic_says_when_ddlrun_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ddl_core whose ddlrun predates elastic jobs: a clear refusal, not ddlrun's usage
    error."""
    import argparse

    from ddl_core.runner import run

    monkeypatch.setattr(run, "parser", lambda: argparse.ArgumentParser())
    with pytest.raises(SystemExit, match="has no --elastic"):
        _translate("-np", "2", "--min-np", "1", "x")


def test_horovodrun_refuses_a_script_together_with_fixed_hosts(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not both"):
        _translate("-np", "2", "--host-discovery-script", _script(tmp_path), "-H", "a:2", "x")


def test_worker_env_comes_from_the_launcher() -> None:
    from horovod.common.worker_env import export_launch_env

    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "HOROVOD_HOSTNAME": "given"}
    export_launch_env(env)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"],
            env["HOROVOD_LOCAL_SIZE"], env["HOROVOD_HOSTNAME"]) == ("3", "4", "1", "2", "given")
    plain: dict[str, str] = {}
    export_launch_env(plain)
    assert plain == {}, "a process no launcher started got HOROVOD_* variables"
    assert os.environ.get("HOROVOD_RESET_LIMIT") is None
