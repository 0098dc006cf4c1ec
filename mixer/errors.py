"""Deprecated alias of `mixer.core.errors` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.core import errors as _module

sys.modules[__name__] = _module
