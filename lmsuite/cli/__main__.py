"""`python -m lmsuite.cli ...` (what `make pretrain` and the fault tests run)."""

import sys

from lmsuite.cli import main

sys.exit(main())
