"""Deprecated alias of `mixer.tools.metrics_log` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.tools import metrics_log as _module

sys.modules[__name__] = _module
