"""`python -m mixer.tools.cli`."""

import sys

from mixer.tools.cli import main

sys.exit(main())
