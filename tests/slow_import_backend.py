"""A backend whose import takes SLOW_IMPORT_ENV seconds (default 3): slower than a tight --case-timeout, so its
import must not be charged to any case (tests/e2e/test_isolation.py)."""

from __future__ import annotations

import os
import time

from tests.misbehaving import Misbehaving

SLOW_IMPORT_ENV = "HARNESS_TEST_SLOW_IMPORT_S"
time.sleep(float(os.environ.get(SLOW_IMPORT_ENV, "3")))

slow = Misbehaving("slow_import", lambda x: None)
