"""Deprecated alias of `mixer.config.recipe` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.config import recipe as _module

sys.modules[__name__] = _module
