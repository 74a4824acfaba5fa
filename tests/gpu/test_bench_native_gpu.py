"""benchmarks/bench_native.py runs end to end on a GPU (small input, few iterations; no timing asserted).

Checks that every quantizer row prints (or prints why native skips it, e.g. a given amax without a kernel),
that the GEMM host-cost table prints next to torch._scaled_mm, and that the CSV carries both byte counts.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_bench_native_small_run(tmp_path, capsys):
    import bench_native as bn

    out = tmp_path / "bench.csv"
    assert bn.main(["--size", "256", "--iters", "3", "--warmup", "1", "--copy-mib", "16", "--gemm-size", "256",
                    "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for r in bn.ROWS:
        assert any(ln.startswith(r.name + " ") for ln in text.splitlines()), r.name
    assert "torch._scaled_mm" in text and "native.gemm" in text
    rows = {r["name"]: r for r in csv.DictReader(out.open())}
    own = rows["nvfp4 1x16 row+col"]
    assert int(own["bytes"]) - int(own["bytes_1read"]) == 256 * 256 * 2  # the second read of X
    assert own["verify"] == "ok" and float(own["issue_us"]) > 0
