"""`python -m ddl_core.bench NAME ...`: see ddl_core.bench."""

import sys

from . import main

sys.exit(main())
