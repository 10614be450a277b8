"""``python -m distenv``."""

import sys

from distenv.cli import main

sys.exit(main())
