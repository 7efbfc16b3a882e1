"""`python -m cudal1 ...` is the same as the `cudal1` command."""

import sys

from cudal1.cli.main import main

sys.exit(main())
