"""``envtools gc``: remove what killed envtools runs left behind (``.NAME.envtools-tmp-*``),
only where the owner is certainly gone (the rule is :mod:`envtools.prefix.tempdirs`')."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.prefix.tempdirs import find_leftovers, inspect, remove_leftover, tree_bytes

#: where `ddlrun --env` keeps a job's staged image on a node: ROOT/ddl-stage-<uid>/, ROOT
#: its --stage-dir (default the temp dir; /dev/shm allowed). The copies carry envtools'
#: owner record, so a killed job's are leftovers like any other.
STAGE_ROOTS = (None, "/dev/shm")  # None: the temp dir


def stage_dirs() -> list[Path]:
    """This user's stage directories under the default stage roots that exist here."""
    found = []
    for root in STAGE_ROOTS:
        d = Path(root or tempfile.gettempdir()) / f"ddl-stage-{os.geteuid()}"
        if d.is_dir() and d not in found:
            found.append(d)
    return found


def default_dirs() -> list[Path]:
    """What a bare `envtools gc` looks at: the current directory, and where ddlrun --env
    stages images by default (a job killed with SIGKILL leaves its copy there)."""
    return [Path("."), *stage_dirs()]


def collect(dirs: list[Path], dry_run: bool) -> None:
    """Remove (or with ``dry_run`` name) each leftover in ``dirs`` whose owner is gone;
    print each one removed or kept, and the total."""
    removed = kept = freed = 0
    for d in dirs:
        if not d.is_dir():
            raise EnvtoolsError(f"{d} is not a directory",
                                "give the directories that hold envs, e.g. envtools gc ~/envs")
        for path in find_leftovers(d):
            verdict = inspect(path)[0] if dry_run else None
            size = tree_bytes(path) if (verdict is None or verdict.removable) else 0
            if verdict is None:
                verdict = remove_leftover(path)
            if verdict.removable:
                removed += 1
                freed += size
                print(f"{'would remove' if dry_run else 'removed'} {path} "
                      f"({size / 2**20:.1f} MiB): {verdict.why}")
            else:
                kept += 1
                print(f"kept {path}: {verdict.why}")
    verb = "would free" if dry_run else "freed"
    info(f"gc: {removed} {'to remove' if dry_run else 'removed'}, {kept} kept; "
         f"{verb} {freed / 2**20:.1f} MiB")
