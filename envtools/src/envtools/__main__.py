"""``python -m envtools`` and the ``envtools`` console script.

Ctrl-C while Python is still importing the command line would print a traceback from
whatever import it hit. Until :func:`envtools.cli.main` installs the normal handler, a
Ctrl-C ends the process at once with status 130 (nothing has been written yet). The
handler is set through ``_signal``, the C module: ``import signal`` first builds its
enums, itself a few milliseconds in which a Ctrl-C would still print a traceback.
"""

import _signal
import os


def _interrupted_early(signum, frame) -> None:
    os.write(2, b"interrupted; nothing was left behind\n")
    os._exit(130)


_signal.signal(_signal.SIGINT, _interrupted_early)

from envtools.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
