"""``python -m lazynn``: see ``lazynn._cli.main``."""

import sys

from ._cli.main import main

sys.exit(main())
