"""`python -m ci ...` entry point.

ci now installs and validates envs in-process through envtools' library, so py-rattler's
runtime threads live in this process too; they can abort it while Python finalizes after
a run that succeeded (envtools' CLI leaves through os._exit for the same reason). The exit
status is click's, flushed, and finalization is skipped.
"""

import os
import sys

from ci.cli import app

try:
    app(standalone_mode=True)
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
