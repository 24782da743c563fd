"""``python -m targetlm`` (the module ``torchrun -m targetlm train CONFIG`` runs)."""

import sys

from targetlm.cli import main

sys.exit(main())
