"""``python -m envtools.bench``: see :mod:`envtools.bench.clone` for the flags."""

import sys

from envtools.bench.clone import main

sys.exit(main())
