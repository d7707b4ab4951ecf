"""``python -m lazynn``: see ``lazynn._cli``."""

import sys

from ._cli import main

sys.exit(main())
