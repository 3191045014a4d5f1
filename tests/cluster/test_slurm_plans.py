"""ddlrun's Slurm and TF_CONFIG plans without a cluster: reading an allocation from
Slurm's environment (host lists checked against Slurm's own `scontrol show hostnames`
where it is installed), the srun command built from it, and the per-rank TF_CONFIG.
No root needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ddl_core.runner.hosts import LaunchError
from ddl_core.runner.slurmalloc import allocation, expand_counts, expand_hostlist
from ddl_core.runner.tfconfig import pick_base, workers

BIN = Path(sys.executable).parent


def ddlrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    return subprocess.run([str(BIN / "ddlrun"), *args], capture_output=True, text=True,
                          timeout=120, env=dict(base, **(env or {})))


HOSTLISTS = ["node[1-3,5]", "gpu[08-11],login", "r[1-2]n[01-02]", "a,b[3],c-d[9-10]",
             "x1", "n[1,3-4],m[7]"]


@pytest.mark.parametrize("text", HOSTLISTS)
def test_hostlists_expand_as_slurm_does(text: str, tmp_path: Path) -> None:
    got = expand_hostlist(text)
    if shutil.which("scontrol"):  # Slurm itself is the reference where it is installed
        conf = tmp_path / "slurm.conf"  # scontrol wants a configuration, any will do
        conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n"
                        "PartitionName=p Nodes=ALL\n")
        ref = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                             text=True, timeout=20,
                             env={"PATH": os.environ["PATH"], "SLURM_CONF": str(conf)})
        assert ref.returncode == 0, ref.stderr
        assert got == ref.stdout.split()
    assert expand_hostlist("node[1-3,5]") == ["node1", "node2", "node3", "node5"]
    assert expand_hostlist("gpu[08-10]") == ["gpu08", "gpu09", "gpu10"]


def test_task_counts_and_allocation() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    a = allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3,5]",
                    "SLURM_TASKS_PER_NODE": "2(x3),1"})
    assert a.nodes == [("n1", 2), ("n2", 2), ("n3", 2), ("n5", 1)] and a.ntasks == 7
    for env, msg in [({}, "not inside a Slurm allocation"),
                     ({"SLURM_JOB_ID": "7"}, "SLURM_JOB_NODELIST is not set"),
                     ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                       "SLURM_TASKS_PER_NODE": "2(x3)"}, "3 counts for 2 nodes"),
                     ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2",
                       "SLURM_TASKS_PER_NODE": "1"}, "cannot read the Slurm host list"),
                     ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                       "SLURM_TASKS_PER_NODE": "2(y2)"}, "is not N or N\\(xM\\)"),
                     ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "a;b",
                       "SLURM_TASKS_PER_NODE": "1"}, "not a valid host name")]:
        with pytest.raises(LaunchError, match=msg):
            allocation(env)


ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE":
         "2,2,1", "SLURM_NTASKS": "5"}


def test_srun_plans_come_from_the_allocation() -> None:
    p = ddlrun("--dry-run", "python", "t.py", env=ALLOC)  # auto: srun where it exists
    assert p.returncode == 0, p.stderr
    assert "# placement: node1:2, node2:2, node3:1; grid flat (uneven hosts)" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    launcher = "srun" if shutil.which("srun") else None
    if launcher:
        assert "srun --mpi=pmix --kill-on-bad-exit=1 --nodes 3 --ntasks 5 --distribution " \
            "arbitrary" in last, last
        # every rank is a TF worker, ports consecutive per host
        tfw = last.split("DDL_TF_WORKERS=")[1].split()[0].split(",")
        assert [w.rsplit(":", 1)[0] for w in tfw] == ["node1", "node1", "node2", "node2",
                                                      "node3"]
        ports = [int(w.rsplit(":", 1)[1]) for w in tfw]
        assert ports[1] == ports[0] + 1 and ports[2] == ports[0] and ports[4] == ports[0]
        # the TF_CONFIG shim runs first, then the exit-status reporter, then the program
        assert re.search(r"tfconfig\.py \S+ \S+exitreport\.py python t\.py$", last), last
    # uniform: tasks per node, and no node list when the whole allocation is used
    p = ddlrun("--dry-run", "--launcher", "srun", "--no-tf-config", "python", "t.py",
               env=dict(ALLOC, SLURM_TASKS_PER_NODE="2(x3)"))
    last = p.stderr.strip().splitlines()[-1]
    assert "--nodes 3 --ntasks 6 --ntasks-per-node 2 --distribution block --export=ALL" \
        in last and "--nodelist" not in last and "tfconfig" not in last, last
    # fewer ranks: consecutive ranks fill the first nodes
    p = ddlrun("--dry-run", "--launcher", "srun", "-n", "2", "python", "t.py", env=ALLOC)
    assert "--nodes 1 --ntasks 2 --ntasks-per-node 2 --distribution block --nodelist node1" \
        in p.stderr, p.stderr
    # more ranks than the allocation: no placement of ours, srun says no (tested live)
    p = ddlrun("--dry-run", "--launcher", "srun", "-n", "9", "python", "t.py", env=ALLOC)
    assert p.returncode == 0 and "--ntasks 9 --distribution block" in p.stderr
    # mpirun inside the allocation: Slurm's hosts in rank order, no rankfile
    p = ddlrun("--dry-run", "--launcher", "mpirun", "--no-tf-config", "python", "t.py",
               env=ALLOC)
    assert "-n 5 --host node1:2,node2:2,node3:1 --map-by slot " in p.stderr, p.stderr
    assert "rankfile" not in p.stderr


def test_srun_outside_an_allocation_is_a_clear_error() -> None:
    p = ddlrun("--launcher", "srun", "-n", "2", "python", "t.py")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "ddlrun: error: not inside a Slurm allocation (SLURM_JOB_ID is not set): run ddlrun "
        "inside `salloc -N 2 -n 8 ddlrun ...` or an sbatch script, or use --launcher mpirun")


def test_each_rank_gets_its_tf_config_unless_the_user_set_one() -> None:
    show = [sys.executable, "-c", "import os; print('TF', os.environ.get('TF_CONFIG'))"]
    p = ddlrun("-n", "3", *show)
    assert p.returncode == 0, p.stderr
    confs = [json.loads(line[3:]) for line in p.stdout.splitlines() if line.startswith("TF ")]
    assert sorted(c["task"]["index"] for c in confs) == [0, 1, 2]
    assert all(c["task"]["type"] == "worker" for c in confs)
    assert len({tuple(c["cluster"]["worker"]) for c in confs}) == 1  # one cluster for all
    assert len(set(confs[0]["cluster"]["worker"])) == 3  # distinct ports on one host
    mine = '{"cluster": {"worker": ["me:1"]}, "task": {"type": "worker", "index": 0}}'
    p = ddlrun("-n", "2", *show, env={"TF_CONFIG": mine})
    assert p.stdout.count(f"TF {mine}") == 2, p.stdout
    p = ddlrun("-n", "2", "-x", f"TF_CONFIG={mine}", *show)
    assert p.stdout.count(f"TF {mine}") == 2, p.stdout
    p = ddlrun("--no-tf-config", "-n", "2", *show)
    assert p.stdout.count("TF None") == 2, p.stdout


def test_ports_are_free_here_and_never_shared_on_a_host() -> None:
    base = pick_base(4, check_here=True)
    assert 20000 <= base < 32000 - 4
    w = workers([("a", 3), ("b", 2)], base)
    assert w == [f"a:{base}", f"a:{base + 1}", f"a:{base + 2}", f"b:{base}", f"b:{base + 1}"]
