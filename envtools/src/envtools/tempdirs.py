"""Build a directory beside its destination and rename it into place, or leave nothing.

Used by install and clone: a half-made environment at the destination would look real
to users and to ``module load``, so all work happens in ``.<name>.envtools-tmp-*`` in the
same parent (same filesystem, so the final rename is atomic) and is removed on any
failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envtools.errors import EnvtoolsError


def _rmtree(path: Path) -> None:
    if not path.exists():
        return
    for dirpath, _dirs, _files in os.walk(path):  # read-only dirs would block removal
        try:
            os.chmod(dirpath, 0o700)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a fresh temp dir beside ``dest``; rename it to ``dest`` if the block succeeds."""
    dest = Path(os.path.abspath(dest))
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.envtools-tmp-", dir=parent))
    except OSError as e:
        raise EnvtoolsError(
            f"cannot create a directory in {parent}: {e.strerror}",
            "choose a destination in a directory you can write to",
        ) from e

    def on_term(signum, frame):  # turn SIGTERM into the same clean-up path as Ctrl-C
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    try:
        yield tmp
        if dest.exists():
            dest.rmdir()  # callers checked it is empty; rmdir fails loudly otherwise
        os.rename(tmp, dest)
    except BaseException:
        _rmtree(tmp)
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
