"""`python -m trl_collm.cli ...` runs the command line, as the `trl-collm` script does."""

import sys

from . import main

sys.exit(main())
