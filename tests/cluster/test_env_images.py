"""`ddlrun --env IMAGE` across emulated hosts: staged once per node, every rank inside it,
and nothing left afterwards (at the end, after SIGKILL of ddlrun, after SIGKILL of
everything), bad stage dirs refused before anything is copied.

The image is a small env (python, numpy, ddl with Open MPI, from the repository's
channel) sealed by `envtools seal`, cached under ~/.cache/ddl-ce/env-images/ by the
channel's repodata and the sealing code (building and sealing it takes ~2 minutes here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import BIN, WORKERS, ddlrun, needs_netns
from ddl_core.runner.stage import NODE
from ddl_tools import cluster, metafs

pytestmark = [pytest.mark.cluster, needs_netns]

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = ROOT / "channel"
WORKER = WORKERS / "in_image.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce" / "env-images"


def _image_key() -> str:
    h = hashlib.sha256()
    for p in [CHANNEL / "linux-64" / "repodata.json", CHANNEL / "noarch" / "repodata.json",
              *sorted((ROOT / "envtools" / "src" / "envtools" / "image").glob("*.py"))]:
        h.update(p.name.encode() + (p.read_bytes() if p.exists() else b""))
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def image() -> Path:
    """A sealed fixture env with ddl_core and Open MPI (made once per channel change)."""
    if not (CHANNEL / "linux-64" / "repodata.json").exists():
        pytest.skip("no channel/ (make channel builds it)")
    base = CACHE / _image_key()
    img = base / "ddl.sqsh"
    if img.exists() and img.with_name(img.name + ".json").exists():
        return img
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    env = base / "env"
    for cmd in ([str(BIN / "envtools"), "install", "--channel", str(CHANNEL), "--channel",
                 str(ROOT / "channel-upstream"), "--prefix", str(env), "ddl=*=*openmpi*"],
                [str(BIN / "envtools"), "seal", str(env), "--out", str(img)]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return img


def _env_prefix(img: Path) -> str:
    return json.loads(img.with_name(img.name + ".json").read_text())["prefix"]


def _rows(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    rows = [json.loads(line[6:]) for line in proc.stdout.splitlines()
            if line.startswith("IMAGE ")]
    return sorted(rows, key=lambda r: r["rank"])


def _staged(stage: Path) -> list[Path]:
    """Every staged copy (live or left over) under a stage dir, all users."""
    return sorted(p for d in stage.glob("ddl-stage-*") for p in d.iterdir())


def _on(copy: Path) -> str:
    """The host a staged copy was made on (its name: .<job>-<host>.envtools-tmp-*)."""
    return copy.name.split(".envtools-")[0].split("-", 2)[2]


def _job_pids(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (this test's stage dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _kill_all(marker: str) -> None:
    """SIGKILL every process of the job at once (stopped first, so that none of them sees
    another die and cleans up: the case of a node whose processes are all killed)."""
    for _ in range(3):
        pids = _job_pids(marker)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.5)


def _mounted_anywhere(prefix: str) -> list[str]:
    """Mounts of ``prefix`` in any process's mount namespace on this machine."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                text = (d / "mountinfo").read_text()
            except OSError:
                continue
            found |= {d.name for line in text.splitlines() if line.split()[4] == prefix}
    return sorted(found)


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "stage"
    d.mkdir()
    yield d
    _kill_all(str(d))


def _args(c: cluster.Cluster, img: Path, stage: Path, *more: str) -> list[str]:
    return [*c.ddlrun_args(), "-H", ",".join(c.hosts[:2]), "--env", str(img),
            "--stage-dir", str(stage), *more]


def test_env_runs_every_rank_inside_the_staged_image(cluster3: cluster.Cluster, image: Path,
                                                     stage: Path) -> None:
    prefix = _env_prefix(image)
    proc = ddlrun(*_args(cluster3, image, stage, "--accelerators", "2"), "python",
                  str(WORKER), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = _rows(proc)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["host"] == cluster3.hosts[r["rank"] // 2]
        assert r["prefix"] == prefix and r["conda_prefix"] == prefix
        assert r["ddl"].startswith(prefix + "/")
        assert r["fstype"] and r["fstype"][0] in ("squashfs", "fuse.squashfuse"), r
        assert r["sum"] == 10.0  # 1+2+3+4 over both hosts
    # one mount per node: the ranks of a node share it, the nodes do not
    assert rows[0]["mntns"] == rows[1]["mntns"] and rows[2]["mntns"] == rows[3]["mntns"]
    assert rows[0]["mntns"] != rows[2]["mntns"]
    # nothing left: no staged copy, no mount of the prefix, no stage process
    assert _staged(stage) == []
    assert _mounted_anywhere(prefix) == []
    assert _job_pids(str(stage)) == []


def test_sigkill_of_ddlrun_removes_every_staged_copy(cluster3: cluster.Cluster,
                                                     image: Path, stage: Path) -> None:
    """ddlrun killed: each node's stage process sees its stream end and removes its copy."""
    job = subprocess.Popen([str(BIN / "ddlrun"), *_args(cluster3, image, stage), "python",
                            str(WORKER), "sleep"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True,
                           env=dict(os.environ, PYTHONUNBUFFERED="1", DDL_TIMEOUT="60"))
    try:
        # a copy is complete (received and hashed) once its stat key is written beside it
        _wait_for(lambda: sum((p / "image.sqsh.stat").exists() for p in _staged(stage)) == 3,
                  240, "3 staged copies")
        assert job.stdout is not None
        ups = 0
        while ups < 2:
            line = job.stdout.readline()
            assert line, "the job ended before its ranks were up"
            ups += line.startswith("UP")
        job.send_signal(signal.SIGKILL)
        job.wait(10)
        _wait_for(lambda: _staged(stage) == [], 30, "the staged copies to go")
    finally:
        job.kill()
        _kill_all(str(stage))
    _wait_for(lambda: _mounted_anywhere(_env_prefix(image)) == [], 30, "the mounts to go")


def test_copies_left_by_sigkill_are_reclaimed_by_gc_and_the_next_run(
        cluster3: cluster.Cluster, image: Path, stage: Path) -> None:
    """Everything SIGKILLed, stage processes too: the copies stay, owned by dead processes;
    `envtools gc` on a node removes that node's, the next run on a node removes the rest."""
    job = subprocess.Popen([str(BIN / "ddlrun"), *_args(cluster3, image, stage), "python",
                            str(WORKER), "sleep"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL,
                           env=dict(os.environ, DDL_TIMEOUT="60"))
    try:
        # a copy is complete (received and hashed) once its stat key is written beside it
        _wait_for(lambda: sum((p / "image.sqsh.stat").exists() for p in _staged(stage)) == 3,
                  240, "3 staged copies")
        _kill_all(str(stage))  # ddlrun among them
    finally:
        job.kill()
        job.wait(10)
    left = _staged(stage)
    assert len(left) == 3, left
    owners = [json.loads((p / "conda-meta/envtools/tmp-owner.json").read_text())["pid"]
              for p in left]
    _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in owners), 30,
              "the killed stage processes to be reaped")
    h0, h1 = cluster3.hosts[:2]
    user = stage / f"ddl-stage-{os.geteuid()}"
    # gc elsewhere keeps them: their owners ran on other hosts
    gc_here = subprocess.run([str(BIN / "envtools"), "gc", str(user)], capture_output=True,
                             text=True, timeout=60)
    assert gc_here.returncode == 0, gc_here.stderr
    assert "another host" in gc_here.stdout, gc_here.stdout
    assert sorted(_on(p) for p in _staged(stage)) == [h0, h1]  # this machine's is gone
    gc = subprocess.run(cluster3.exec_argv(h0, [str(BIN / "envtools"), "gc", str(user)]),
                        capture_output=True, text=True, timeout=60)
    assert gc.returncode == 0, gc.stderr
    assert [_on(p) for p in _staged(stage)] == [h1], gc.stdout
    proc = ddlrun(*_args(cluster3, image, stage), "python", str(WORKER), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _staged(stage) == []


def test_full_stage_dir_is_refused_before_copying(cluster3: cluster.Cluster, image: Path,
                                                  tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        proc = ddlrun(*_args(cluster3, image, small), "python", str(WORKER), timeout=120)
        assert proc.returncode == 2
        err = proc.stderr.strip().splitlines()[-1]
        assert "MiB free, the image needs" in err and "--stage-dir" in err, proc.stderr
        assert _staged(small) == []  # nothing half copied
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_stage_dir_on_a_shared_filesystem_is_refused(cluster3: cluster.Cluster, image: Path,
                                                     tmp_path: Path) -> None:
    why = metafs.skip_reason()
    if why:
        pytest.skip(f"emulated shared filesystem: {why}")
    src = tmp_path / "src"
    src.mkdir()
    with metafs.mounted(src, tmp_path / "shared", latency_us=0):
        proc = ddlrun(*_args(cluster3, image, tmp_path / "shared"), "python", str(WORKER),
                      timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]
    assert "fuse.metafs filesystem" in err and "node-local" in err, proc.stderr
    assert list(src.iterdir()) == []


def test_altered_image_is_refused_on_every_node(cluster3: cluster.Cluster, image: Path,
                                                tmp_path: Path, stage: Path) -> None:
    bad = tmp_path / "bad.sqsh"
    shutil.copyfile(image, bad)
    for side in (".sha256", ".json"):
        shutil.copyfile(image.with_name(image.name + side), bad.with_name(bad.name + side))
    with open(bad, "r+b") as fh:  # one byte in the middle, same size
        fh.seek(bad.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    proc = ddlrun(*_args(cluster3, bad, stage), "python", str(WORKER), timeout=120)
    assert proc.returncode == 2
    assert "altered or truncated" in proc.stderr, proc.stderr
    assert _staged(stage) == []


def test_altered_staged_copy_is_not_mounted(cluster3: cluster.Cluster, image: Path,
                                            stage: Path) -> None:
    """A staged copy changed after staging (a bad disk, someone else): the node's
    `envtools run` checks it against its sha256 before mounting and refuses."""
    job = subprocess.Popen([str(BIN / "ddlrun"), *_args(cluster3, image, stage), "python",
                            str(WORKER), "sleep"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL,
                           env=dict(os.environ, DDL_TIMEOUT="60"))
    try:
        # a copy is complete (received and hashed) once its stat key is written beside it
        _wait_for(lambda: sum((p / "image.sqsh.stat").exists() for p in _staged(stage)) == 3,
                  240, "3 staged copies")
        h1 = cluster3.hosts[1]
        (copy,) = [p for p in _staged(stage) if _on(p) == h1]
        img = copy / "image.sqsh"
        img.chmod(0o600)
        with open(img, "r+b") as fh:
            fh.seek(img.stat().st_size // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0xFF]))
        tag = copy.name[1:].split(f"-{h1}.envtools-tmp-")[0]
        run = subprocess.run(cluster3.exec_argv(h1, [
            sys.executable, str(NODE), "exec", str(stage), tag, str(BIN / "envtools"),
            "--", "true"]), capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        assert "sha256" in run.stderr, run.stderr
    finally:
        job.kill()
        job.wait(10)
        _kill_all(str(stage))


POWERAI = ROOT / "envs" / "powerai"


@pytest.fixture(scope="session")
def powerai_image() -> Path:
    """envs/powerai (made by make channel) sealed once per change of its records."""
    if not (POWERAI / "conda-meta").is_dir():
        pytest.skip("no envs/powerai (make channel makes it)")
    h = hashlib.sha256(_image_key().encode())
    for p in sorted((POWERAI / "conda-meta").glob("*.json")):
        h.update(p.name.encode() + p.read_bytes())
    base = CACHE / f"powerai-{h.hexdigest()[:16]}"
    img = base / "powerai.sqsh"
    if img.exists() and img.with_name(img.name + ".json").exists():
        return img
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    proc = subprocess.run([str(BIN / "envtools"), "seal", str(POWERAI), "--out", str(img)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return img


EXAMPLES = ROOT / "ddl_core" / "examples"


@pytest.mark.parametrize("script,args", [
    ("pytorch_ddp_ddl.py", ["--samples", "256"]),  # the 2-rank DDP example
    ("keras_mnist_ddl.py", ["--samples", "256", "--epochs", "1"]),  # the seeds' tf.keras
])
def test_sealed_powerai_runs_the_examples(cluster3: cluster.Cluster, powerai_image: Path,
                                          stage: Path, script: str, args: list[str]) -> None:
    proc = ddlrun(*_args(cluster3, powerai_image, stage), "python", str(EXAMPLES / script),
                  *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "total images/sec" in proc.stdout
    assert _staged(stage) == []


def test_env_inside_a_slurm_allocation(image: Path, stage: Path) -> None:
    """salloc + ddlrun --env: the image staged by one srun step (stdin broadcast to every
    node), each rank started by srun inside its node's copy, nothing left."""
    from ddl_tools import slurmcluster

    try:
        slurmcluster.check_installed()
    except slurmcluster.SlurmError as e:
        pytest.skip(f"Slurm: {e}")
    with cluster.running(f"es{os.getpid() % 100000:05d}"[:8], hosts=2, slurm=True) as c:
        cmd, env = cluster.run_argv(c, ["salloc", "-N", "2", "-n", "2", str(BIN / "ddlrun"),
                                        "--env", str(image), "--stage-dir", str(stage),
                                        "python", str(WORKER)])
        env.update({"PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "60"})
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        rows = _rows(proc)
        assert [r["host"] for r in rows] == c.hosts
        assert all(r["sum"] == 3.0 and r["prefix"] == _env_prefix(image) for r in rows)
        assert all(r["fstype"] and r["fstype"][0] in ("squashfs", "fuse.squashfuse")
                   for r in rows)
        assert _staged(stage) == []


def test_staging_reads_the_image_with_few_requests(image: Path, tmp_path: Path) -> None:
    """The launch node's whole share of the shared filesystem's metadata traffic for one
    job: the image and IMAGE.json, each looked up and opened once (<= 10 requests, the
    issue's budget per node, whatever the ranks and the env's size)."""
    why = metafs.skip_reason()
    if why:
        pytest.skip(f"emulated shared filesystem: {why}")
    from ddl_core.runner.stage import stage as stage_image

    src = tmp_path / "src"
    src.mkdir()
    for side in ("", ".json"):  # IMAGE.sha256 is for people (sha256sum -c), not read
        os.link(str(image) + side, src / f"env.sqsh{side}")
    out = tmp_path / "stage"
    out.mkdir()
    with metafs.mounted(src, tmp_path / "shared", latency_us=0) as fs:
        before = fs.counts()
        st = stage_image(str(tmp_path / "shared" / "env.sqsh"), [], None, str(out))
        try:
            after = fs.counts()
        finally:
            st.close()
    asked = {k: after[k] - before[k] for k in before if after[k] != before[k]}
    assert asked["metadata"] <= 10, asked
    assert asked["read"] > 0  # the data did come through the shared filesystem
    assert _staged(out) == []  # and the copy went with the job


def test_image_longer_than_sealed_is_refused(cluster3: cluster.Cluster, image: Path,
                                             tmp_path: Path, stage: Path) -> None:
    """Bytes appended to a sealed image: its size no longer matches IMAGE.json, so ddlrun
    refuses it (naming both sizes) and no node keeps a copy."""
    bad = tmp_path / "long.sqsh"
    shutil.copyfile(image, bad)
    shutil.copyfile(image.with_name(image.name + ".json"), bad.with_name(bad.name + ".json"))
    with open(bad, "ab") as fh:
        fh.write(b"\0" * 4096)
    proc = ddlrun(*_args(cluster3, bad, stage), "python", str(WORKER), timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]
    assert "altered or truncated" in err and str(image.stat().st_size) in err, proc.stderr
    assert _staged(stage) == []
