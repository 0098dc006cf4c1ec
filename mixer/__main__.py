"""`python -m mixer`: the `mixer` command."""

import sys

from mixer.tools.cli import main

sys.exit(main())
