"""One exception type for problems the user can fix, so the CLI can print them cleanly
(and the library, :mod:`envtools.api`, can raise them); a system error becomes one too."""

from __future__ import annotations

import errno


class EnvtoolsError(Exception):
    """A problem with the user's input or environment, with the fix in ``hint``.

    The CLI prints ``error: <message>`` and ``hint: <hint>`` and exits with ``exit_code``
    instead of a traceback, because these are expected, actionable failures.
    """

    def __init__(self, message: str, hint: str = "", exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code


#: what to do about a system error, by errno
_OS_HINTS = {
    errno.ENOSPC: "the filesystem is full: free space there (df -h shows it) or choose a "
    "destination on another filesystem; nothing of this run was kept",
    errno.EDQUOT: "your disk quota is used up: free space (quota -s shows it) or choose "
    "another destination; nothing of this run was kept",
    errno.EACCES: "check the permissions of that path, or choose a destination you can "
    "write to",
    errno.EPERM: "check the permissions and owner of that path",
    errno.EROFS: "that filesystem is mounted read-only: choose a destination elsewhere",
    errno.ENOENT: "it disappeared while envtools ran (removed by someone else?): run again",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or set ENVTOOLS_WORKERS=1",
}


def os_error(e: OSError) -> EnvtoolsError:
    """A system call's failure as one error naming the path, with a hint for the usual ones."""
    where = f": {e.filename}" if e.filename else ""
    return EnvtoolsError(f"{e.strerror or e}{where}", _OS_HINTS.get(e.errno or 0, ""),
                         exit_code=1)
