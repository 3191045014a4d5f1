"""`ddlrun --env IMAGE`: stage a sealed env image to every node and run the job inside it.

Why: a Python job's start at scale is bounded by the shared filesystem's metadata
server (every rank looks up every module along every search path: ~15,000 requests per
rank for `import torch, ddl_core`). A sealed image (`envtools seal`) is one file: it is
read once, here, from the shared filesystem, streamed to every node's local storage
(--stage-dir, default the temp dir; /dev/shm allowed), checked against its sha256
there, and every rank's lookups then stay on the node.

How, with mpirun (the emulated cluster's and ssh clusters' launcher):
- a keeper (stagenode.py keep) starts on each node through the same way in as mpirun's
  daemons (ssh, or --launch-agent), receives the stream on stdin, and holds the staged
  copy for the job; closing its stdin (here, at the end; or by ddlrun's death) removes it;
- mpirun itself runs inside `envtools run STAGED --` on this node (the image's own
  mpirun when it has one, so daemons and ranks use the image's MPI), and PRRTE's launch
  agent (`prte_launch_agent`, the command that starts `prted` on each node) becomes
  `stagenode.py exec`, which starts the node's prted inside that node's copy: one mount
  per node, which the node's ranks share (Open MPI's shared memory works between them);
- the ranks' PATH and CONDA_PREFIX are the image's.
Under Slurm (srun), each rank runs inside `envtools run` itself (srun starts the ranks
directly, no daemon of ours), and the keepers start as one `srun --overlap` step with
stdin broadcast to every node (srun --input=all): our own broadcast, no sbcast (an
sbcast copy has no owner, so nothing reclaims it after a kill).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .hosts import LaunchError, is_local
from .probe import agent_argv
from .stagenode import CHUNK, SESSION, SESSION_ENV, run_flags, widen_pipe

NODE = Path(__file__).with_name("stagenode.py")
READY_S = 600.0
HERE = "this node"  # a node must have its copy within this long after the stream ended


def find_envtools() -> str:
    """envtools beside this Python first (the same install as ddlrun), then PATH."""
    env = os.environ.get("DDL_ENVTOOLS")
    if env:
        return env
    here = Path(sys.executable).parent / "envtools"
    if here.exists():
        return str(here)
    found = shutil.which("envtools")
    if found:
        return found
    raise LaunchError("--env needs envtools (it mounts the image on each node): install it "
                      "beside ddlrun, put it on PATH, or set DDL_ENVTOOLS")


def _read_small(path: Path, limit: int = 1 << 20) -> bytes:
    """A small file's bytes by raw reads: one lookup, one open and one attribute check on
    a shared filesystem (Python's open() and read_bytes() add an fstat per call, each a
    metadata request there)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts: list[bytes] = []
        while data := os.read(fd, limit):
            parts.append(data)
            if sum(map(len, parts)) > limit:
                raise OSError(0, f"larger than {limit} bytes", str(path))
        return b"".join(parts)
    finally:
        os.close(fd)


def read_image(image: Path) -> tuple[str, int, str, bytes]:
    """(sha256, size, prefix, IMAGE.json's bytes) from the manifest `envtools seal` wrote
    beside the image, read and checked by envtools' own manifest reader. Only IMAGE.json
    is read (it names the image's sha256 and size; IMAGE.sha256 says the same for
    sha256sum): on a shared filesystem every file looked at is metadata requests."""
    try:
        from envtools.errors import EnvtoolsError
        from envtools.image.manifest import parse, sidecars
    except ImportError:
        raise LaunchError("--env needs envtools (its image manifests and `envtools run`): "
                          "install envtools beside ddlrun") from None
    json_file = sidecars(image)[1]
    try:
        data = _read_small(json_file)
    except OSError as e:
        raise LaunchError(f"--env {image}: cannot read {json_file.name} beside it "
                          f"({e.strerror}); staged images are checked against what "
                          "`envtools seal` writes there: seal the env with envtools seal "
                          "PREFIX --out IMAGE") from None
    try:
        manifest = parse(data, str(json_file), beside=True)
    except EnvtoolsError as e:
        raise LaunchError(f"--env {image}: {e}") from None
    return manifest.image_sha256, manifest.image_bytes, manifest.prefix, data


@dataclass
class Keeper:
    """One node's stage process (stagenode.py keep), fed on its stdin."""

    host: str
    proc: subprocess.Popen[bytes]
    staged: str | None = None
    error: str | None = None
    expect: int = 1  # READY lines to wait for (an srun step: one per node)


#: run as the command inside the staged copy: the image's own mpirun when it has one
#: (its daemons, started by absolute path, and the ranks' MPI then match), else ddlrun's
PICK_MPIRUN = 'm="$0"; if [ -x "$DDL_STAGE_PREFIX/bin/mpirun" ]; then ' \
    'm="$DDL_STAGE_PREFIX/bin/mpirun"; fi; unset DDL_STAGE_PREFIX; exec "$m" "$@"'


@dataclass
class Staging:
    """The staged image of one job: where it is on each node, and how to run in it."""

    image: Path
    root: str  # the stage dir, the same path on every node
    tag: str  # the job's private name
    envtools: str
    prefix: str
    size: int = 0  # the image's bytes
    keepers: list[Keeper] = field(default_factory=list)  # this node's first

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run inside this node's staged copy."""
        staged = next((k.staged for k in self.keepers if k.host == HERE), None)
        if staged is None:
            raise LaunchError("internal: no staged copy on this node")
        return [self.envtools, "run", *run_flags(Path(staged)), staged, "--", *argv]

    def wrap_mpirun(self, argv: list[str]) -> list[str]:
        """mpirun's argv (argv[0]: ddlrun's mpirun) run inside this node's copy, with the
        image's mpirun in its place where the image has one."""
        session = str(Path(self.wrap([])[-2]).parent / SESSION)  # see stagenode.SESSION
        return self.wrap(["env", f"DDL_STAGE_PREFIX={self.prefix}", f"{SESSION_ENV}={session}",
                          "sh", "-c", PICK_MPIRUN, *argv])

    def node_exec(self) -> str:
        """The command that runs what follows it inside the staged copy of the node it
        runs on (PRRTE's launch agent; srun's ranks): `python stagenode.py exec ROOT TAG
        ENVTOOLS --`. No spaces may be in it: PRRTE splits its launch agent on them."""
        return " ".join([sys.executable, "-I", "-S", str(NODE), "exec", self.root, self.tag,
                         self.envtools, "--"])

    def activate(self, environ: dict[str, str]) -> None:
        """The ranks' environment: the image's bin first, CONDA_PREFIX the image's."""
        environ["PATH"] = f"{self.prefix}/bin" + (
            f":{environ['PATH']}" if environ.get("PATH") else "")
        environ["CONDA_PREFIX"] = self.prefix
        environ.pop("VIRTUAL_ENV", None)

    def close(self) -> None:
        """End every keeper (each removes its copy) and wait for them."""
        for k in self.keepers:
            try:
                if k.proc.stdin:
                    k.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 30
        for k in self.keepers:
            try:
                k.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                k.proc.kill()
                k.proc.wait()


def keeper_cmd(root: str, tag: str, size: int, sha: str, extra: int) -> list[str]:
    return [sys.executable, "-I", str(NODE), "keep", root, tag, str(size), sha, str(extra)]


def remote(host: str, agent: str | None, cmd: list[str]) -> list[str]:
    """argv that runs ``cmd`` on ``host`` the way mpirun reaches it (agent, else ssh)."""
    if agent:
        return [*agent_argv(agent), host, shlex.join(cmd)]
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, shlex.join(cmd)]


def _read_answer(k: Keeper) -> None:
    """Wait for the keeper's READY line(s); the first ERROR line ends the wait."""
    assert k.proc.stdout is not None
    ready: list[str] = []
    for raw in k.proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("ERROR "):
            k.error = line[6:]
            return
        if line.startswith("READY "):
            ready.append(line[6:])
            if len(ready) == k.expect:
                k.staged = ready[0]
                return


def check_names(root: str, tag: str) -> None:
    for what, v in (("--stage-dir", root), ("job tag", tag)):
        if not v or any(c.isspace() for c in v):
            raise LaunchError(f"{what} {v!r}: a path without spaces is needed (it becomes "
                              "part of PRRTE's launch agent, which is split on spaces)")


def stage(image: str, hosts: list[str], agent: str | None, root: str | None,
          slurm_nodes: int | None = None, here: bool = True) -> Staging:
    """Stream the image to every one of ``hosts`` (names of this machine share this
    node's copy) and, with ``here``, to this node; return once every node holds a
    checked copy. ``slurm_nodes``: instead of ``hosts``, the allocation's first nodes, their
    keepers started as one srun step."""
    path = Path(os.path.abspath(image))
    try:  # opened first: on a shared filesystem each extra look costs a metadata request
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(f"--env {image}: cannot open it ({e.strerror}); make an image "
                          "with envtools seal PREFIX --out IMAGE") from None
    try:
        sha, size, prefix, manifest = read_image(path)
    except BaseException:
        os.close(fd)
        raise
    try:
        envtools = find_envtools()
        root = os.path.abspath(root or tempfile.gettempdir())
        tag = f"j{os.getpid()}-{secrets.token_hex(4)}"
        check_names(root, tag)
    except BaseException:
        os.close(fd)
        raise
    st = Staging(path, root, tag, envtools, prefix, size)
    try:
        cmd = keeper_cmd(root, tag, size, sha, len(manifest))
        starts = [(HERE, cmd)] if here else []
        if slurm_nodes:
            starts.append(("the allocation's nodes",
                           ["srun", "--overlap", "--input=all", f"--nodes={slurm_nodes}",
                            f"--ntasks={slurm_nodes}", "--ntasks-per-node=1", *cmd]))
        else:
            starts += [(h, remote(h, agent, cmd))
                       for h in dict.fromkeys(hosts) if not is_local(h)]
        for host, argv in starts:
            try:
                p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            except OSError as e:
                raise LaunchError(f"--env: cannot start staging on {host}: {e.strerror}"
                                  ) from None
            if p.stdin:
                widen_pipe(p.stdin.fileno())
            st.keepers.append(Keeper(host, p, expect=(slurm_nodes or 1) if host != HERE else 1))
        readers = [threading.Thread(target=_read_answer, args=(k,), daemon=True)
                   for k in st.keepers]
        for t in readers:
            t.start()
        actual = _stream(fd, size, manifest, st.keepers)
        if actual is not None:
            raise LaunchError(f"--env {image}: the image is {actual} bytes, its "
                              f"{path.name}.json says {size}: it was altered or truncated "
                              "after it was sealed; seal the env again (envtools seal)")
        deadline = time.monotonic() + READY_S
        for t in readers:
            t.join(max(0.1, deadline - time.monotonic()))
        for k in st.keepers:
            if k.staged is None:
                why = k.error or (f"its stage process exited with status {k.proc.poll()}"
                                  if k.proc.poll() is not None else "no answer in time")
                raise LaunchError(f"--env: staging {path.name} on {k.host} failed: {why}")
    except BaseException:
        st.close()
        raise
    finally:
        os.close(fd)
    return st


def _stream(fd: int, size: int, head: bytes, keepers: list[Keeper]) -> int | None:
    """Write ``head`` (the image's manifest: its chunk digests, which the keepers check
    the chunks against as they come), then read the image once and write every chunk,
    to every keeper still listening. The image's size when it is not the ``size`` sealed (the
    streams are then ended short: no keeper keeps a copy), else None."""
    left = size
    alive = [k for k in keepers if k.proc.stdin]

    def send(data: bytes | memoryview) -> None:
        for k in list(alive):
            try:
                k.proc.stdin.write(data)  # type: ignore[union-attr]
            except OSError:
                alive.remove(k)

    send(head)
    buf = bytearray(CHUNK)  # one buffer, reused: a fresh one per chunk costs page faults
    while left and alive:
        n = os.readv(fd, [memoryview(buf)[:min(CHUNK, left)]])
        if not n:
            break
        left -= n
        with memoryview(buf) as view:
            send(view[:n])
    if not alive:
        return None  # every keeper stopped: their ERROR lines say why
    if left or os.read(fd, 1):  # shorter or longer than sealed
        for k in keepers:
            try:
                k.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        return os.fstat(fd).st_size
    for k in alive:
        try:
            k.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass
    return None


def launch(st: Staging, launcher: str, flavor: str | None, cmd: list[str]) -> list[str]:
    """The launcher's argv made to run the job inside the staged copies.

    Open MPI's mpirun: run inside this node's copy, its daemons started inside their
    node's copy (PRRTE's launch agent), so each node has one mount. srun and MPICH's
    Hydra start the ranks without a daemon of ours in between: there each rank runs
    inside the copy itself (`plan.command` was wrapped by :func:`wrap_ranks`)."""
    if launcher == "mpirun" and flavor == "openmpi":
        agent = st.node_exec() + " prted"
        return st.wrap_mpirun([cmd[0], "--prtemca", "prte_launch_agent", agent, *cmd[1:]])
    if launcher == "mpirun":
        return st.wrap(cmd)
    return cmd


def per_rank(launcher: str, flavor: str | None) -> bool:
    """Whether each rank must be wrapped itself (no per-node daemon to wrap)."""
    return not (launcher == "mpirun" and flavor == "openmpi")


def wrap_ranks(st: Staging, command: list[str]) -> list[str]:
    return [*st.node_exec().split(" "), *command]
