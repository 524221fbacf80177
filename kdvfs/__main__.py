"""`python -m kdvfs` runs the `kdvfs` command line."""

import sys

from kdvfs.cli import main

sys.exit(main())
