"""`python -m kdvfs` runs the `kdvfs` command line."""

import sys

from kdvfs.tuner.cli import main

sys.exit(main())
