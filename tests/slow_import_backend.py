"""A backend module that misbehaves while it is imported (tests/e2e/test_isolation.py): it takes SLOW_IMPORT_ENV
seconds (default 0), segfaults if SEGFAULT_ENV is set, and appends "pid sid" to the file IMPORT_LOG_ENV names, so
a test can tell which processes imported it."""

from __future__ import annotations

import ctypes
import os
import time

from tests.misbehaving import Misbehaving

SLOW_IMPORT_ENV = "HARNESS_TEST_SLOW_IMPORT_S"
SEGFAULT_ENV = "HARNESS_TEST_IMPORT_SEGFAULT"
IMPORT_LOG_ENV = "HARNESS_TEST_IMPORT_LOG"

if os.environ.get(IMPORT_LOG_ENV):
    with open(os.environ[IMPORT_LOG_ENV], "a") as f:
        f.write(f"{os.getpid()} {os.getsid(0)}\n")
if os.environ.get(SEGFAULT_ENV):
    ctypes.string_at(0)
time.sleep(float(os.environ.get(SLOW_IMPORT_ENV, "0")))

slow = Misbehaving("slow_import", lambda x: None)
