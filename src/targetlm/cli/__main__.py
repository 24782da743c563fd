"""``python -m targetlm.cli``."""

import sys

from targetlm.cli import main

sys.exit(main())
