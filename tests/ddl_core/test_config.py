"""Configuration checked once, everywhere the same: hostile values, settings that differ
between ranks, a rank that never calls init, tune files, and ddlrun's impossible sizes.

Short DDL_TIMEOUTs (3-5 s) keep it quick; nothing here may hang.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mpirun_cmd, ok_lines, run_mpi
from ddl_core.model import Fabric

import ddl_core as ddl
from ddl_core import settings

BIN = Path(sys.executable).parent


# ---- the number rule (libddl's config.c, called from Python) ----------------------------

@pytest.mark.parametrize("text,integer,ok", [
    ("300", False, True), ("0.5", False, True), ("1e3", False, True), ("+7", False, True),
    ("nan", False, False), ("NaN", False, False), ("inf", False, False),
    ("-inf", False, False), ("infinity", False, False), ("1e400", False, False),
    ("12abc", False, False), ("", False, False), (" 5", False, False), ("5 ", False, False),
    ("0x10", False, False), ("1_000", False, False), ("--1", False, False),
    ("4096", True, True), ("4096.0", True, False), ("1e3", True, False),
    ("1" + "0" * 30, True, False), ("-1", True, False),
])
def test_one_number_rule(text: str, integer: bool, ok: bool) -> None:
    if ok:
        assert settings.number("DDL_X", text, 0, 1e9, integer=integer) >= 0
    else:
        with pytest.raises(ddl.InvalidArgumentError, match=r"DDL_X.*\[0, 1000000000\]"):
            settings.number("DDL_X", text, 0, 1e9, integer=integer)


def test_libddl_settings_checked_as_init_checks_them() -> None:
    assert settings.check("DDL_TIMEOUT", "2.5") == 2.5
    assert settings.check("DDL_TOPOLOGY", "4x2x2") == 16  # the number of ranks
    assert settings.check("DDL_NOT_A_SETTING", "nan") is None
    with pytest.raises(ddl.InvalidArgumentError, match="DDL_WINDOW=65 is out of range"):
        settings.check("DDL_WINDOW", "65")  # at most 64 pieces in flight, said so
    with pytest.raises(ddl.InvalidArgumentError, match="DDL_TOPOLOGY=02x2"):
        settings.check("DDL_TOPOLOGY", "02x2")
    assert settings.env_number("DDL_GPUS_PER_HOST", 0, 64, 0, integer=True, environ={}) == 0
    with pytest.raises(ValueError, match="DDL_GPUS_PER_HOST=two"):
        settings.env_number("DDL_GPUS_PER_HOST", 0, 64, 0, integer=True,
                            environ={"DDL_GPUS_PER_HOST": "two"})


# ---- init: every rank gets the same clear error, within DDL_TIMEOUT ----------------------

def test_hostile_values_fail_init_on_every_rank() -> None:
    # 9 variables x 10 values, each a failed init on both ranks, then a clean init works
    proc = run_mpi(2, "config.py", "hostile", env={"DDL_TIMEOUT": "5"}, timeout=120)
    assert ok_lines(proc, "hostile 90 values") == 2


def test_a_bad_value_is_a_nonzero_exit_not_a_hang() -> None:
    code = "import ddl_core as d; d.init(); print('INITIALIZED')"
    proc = subprocess.run(
        [*mpirun_cmd(2, "-x", "DDL_WINDOW=nan", "-x", "DDL_TIMEOUT=5"), sys.executable, "-c",
         code], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    assert proc.returncode != 0 and "INITIALIZED" not in proc.stdout
    assert "DDL_WINDOW=nan is not an integer" in proc.stderr, proc.stderr[-3000:]


def test_settings_that_differ_between_ranks_fail_on_every_rank() -> None:
    proc = run_mpi(3, "config.py", "differs", env={"DDL_TIMEOUT": "5"}, timeout=120)
    assert ok_lines(proc, "differs") == 3


def test_one_rank_with_a_bad_value_fails_every_rank() -> None:
    proc = run_mpi(3, "config.py", "one_bad", env={"DDL_TIMEOUT": "5"}, timeout=60)
    assert ok_lines(proc, "one_bad") == 3


def test_run_time_settings_changed_on_one_rank_are_a_mismatch_not_a_hang() -> None:
    proc = run_mpi(2, "config.py", "setters", env={"DDL_TIMEOUT": "5"}, timeout=60)
    assert ok_lines(proc, "setters") == 2


@pytest.mark.parametrize("missing", [0, 2])
def test_a_rank_that_never_calls_init_is_named(missing: int) -> None:
    proc = run_mpi(3, "config.py", "missing", env={"DDL_TIMEOUT": "3", "MISSING": str(missing)},
                   timeout=90)
    found = re.findall(r"OK missing after ([\d.]+)s: (.*)", proc.stdout)
    assert len(found) == 2, proc.stdout
    for _, msg in found:
        assert f"rank {missing}" in msg


def test_a_rank_that_comes_after_the_others_gave_up_times_out_too() -> None:
    proc = run_mpi(3, "config.py", "late", env={"DDL_TIMEOUT": "3", "LATE": "1"}, timeout=90)
    assert len(re.findall(r"OK late after", proc.stdout)) == 3, proc.stdout


# ---- tune files: one reader's rule in C and Python; rank 0's figures everywhere ----------

def tune_file(path: Path, alpha: str, grid: str = "2") -> Path:
    path.write_text(f"# test\ntopology {grid}\ngamma 1e-10\nlevel 0 {alpha} 1e-9\n")
    return path


def test_a_bad_tune_file_fails_init_on_every_rank_and_in_python(tmp_path: Path) -> None:
    bad = tune_file(tmp_path / "bad.txt", "nan")
    code = ("import ddl_core as d\ntry:\n    d.init()\nexcept d.InvalidArgumentError as e:\n"
            "    print('REJECTED', e, flush=True)\n")
    script = tmp_path / "init.py"
    script.write_text(code)
    # (a rank whose init failed exits without MPI_Finalize: the job's status is non-zero)
    proc = run_mpi(2, str(script), env={"DDL_TUNE_FILE": str(bad), "DDL_TIMEOUT": "5"},
                   check=False)
    assert proc.stdout.count(f"tuning file {bad} line 4: alpha=nan") == 2, proc.stdout
    with pytest.raises(ValueError, match=f"tuning file {bad} line 4: alpha=nan"):
        Fabric.from_tune_file(bad)


def test_every_rank_plans_with_rank_0s_figures(tmp_path: Path) -> None:
    # rank 1's file says something else (or nothing): rank 0's figures are used everywhere
    tune_file(tmp_path / "rank0.txt", "3e-06")
    tune_file(tmp_path / "rank1.txt", "9e-03")
    script = tmp_path / "plan.py"
    script.write_text(
        "import os\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
        f"os.environ['DDL_TUNE_FILE'] = '{tmp_path}/rank%d.txt' % r\n"
        "import ddl_core as d\nd.init()\n"
        "print('ALPHA', d._ddl.get_level_cost(0)[0], flush=True)\n")
    proc = run_mpi(2, str(script), env={"DDL_TIMEOUT": "5"})
    assert sorted(re.findall(r"ALPHA (\S+)", proc.stdout)) == ["3e-06", "3e-06"], proc.stdout


# ---- ddlrun: impossible sizes and bad values refused before anything is launched ---------

def ddlrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ddlrun"), *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("args,message", [
    (["-n", "0"], "-n=0 is out of range"),
    (["-n", "-1"], "-n=-1 is out of range"),
    (["-n", "2.5"], "-n=2.5 is not an integer"),
    (["-n", "two"], "-n=two is not an integer"),
    (["-n", ""], "-n is set but empty"),
    (["-n", "99999999999"], "out of range"),
    (["-H", "localhost:0"], "slots must be a positive number"),
    (["-H", "localhost:2", "-n", "3"], "-n 3 ranks, but the hosts hold 2"),
    (["--accelerators", "0", "-H", "localhost"], "--accelerators=0 is out of range"),
    (["--racks", "0", "-H", "localhost"], "--racks=0 is out of range"),
    (["-n", "3", "--topology", "2x2"], "--topology 2x2 describes 4 ranks but ddlrun starts 3"),
    (["--topology", "2x2"], "describes 4 ranks but ddlrun starts 1"),
    (["--topology", "2x0", "-n", "4"], "DDL_TOPOLOGY=2x0 is not a grid"),
    (["-n", "2", "-x", "DDL_TIMEOUT=nan"], "DDL_TIMEOUT=nan is not a decimal number"),
    (["-n", "3", "-x", "DDL_TOPOLOGY=2x2"], "DDL_TOPOLOGY=2x2 describes 4 ranks"),
])
def test_impossible_sizes_are_refused_before_launch(tmp_path: Path, args: list[str],
                                                    message: str) -> None:
    marker = tmp_path / "launched"
    proc = ddlrun(*args, sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "ddlrun: error:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


def test_bad_ddl_values_in_the_environment_are_refused_before_launch() -> None:
    proc = ddlrun("-n", "2", "true", env={"DDL_SEGMENT": "12abc"})
    assert proc.returncode == 2
    assert "DDL_SEGMENT=12abc is not an integer" in proc.stderr
    assert "ddlrun's environment" in proc.stderr


def test_possible_sizes_still_launch() -> None:
    assert ddlrun("--dry-run", "-n", "4", "--topology", "2x2", "true").returncode == 0
    over = ddlrun("--dry-run", "-H", "localhost:2", "-n", "3", "--oversubscribe", "true")
    assert over.returncode == 0, over.stderr
    assert "localhost:3" in over.stderr and "OVERSUBSCRIBE" in over.stderr
