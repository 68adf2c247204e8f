"""`python -m lmsuite ...`: the same as the `lmsuite` command."""

import sys

from lmsuite.cli import main

sys.exit(main())
