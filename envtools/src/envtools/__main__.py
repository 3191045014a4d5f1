"""``python -m envtools`` and the ``envtools`` console script.

Ctrl-C while Python is still importing the command line would print a traceback from
whatever import it hit. Until :func:`envtools.cli.main` installs the normal handler, a
Ctrl-C ends the process at once with status 130 (nothing has been written yet).
"""

import os
import signal


def _interrupted_early(signum, frame) -> None:
    os.write(2, b"envtools: interrupted\n")
    os._exit(130)


signal.signal(signal.SIGINT, _interrupted_early)

from envtools.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
