"""Deprecated alias of `mixer.runtime.loader` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.runtime import loader as _module

sys.modules[__name__] = _module
