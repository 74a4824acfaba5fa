"""benchmarks/bench_reference.py's table and goals on hand-made timings, and one tiny real run (no TE)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_reference as br  # noqa: E402

MIB = 2**20


def test_ratio_is_te_median_over_ours_median():
    r = br.Result("fp8_block", [0.10, 0.30, 0.20], 10 * MIB, [0.33, 0.29, 0.90], 20 * MIB)
    assert r.ratio == 0.33 / 0.20  # medians 0.33 and 0.20
    ok, line = br.verdict(r, 32 * MIB)
    assert ok and "TE/ours >= 1.5: ok" in line
    slow = br.Result("fp8_block", [0.25], 10 * MIB, [0.33], 20 * MIB)  # 1.32x
    assert br.verdict(slow, 32 * MIB) == (False, "TE/ours >= 1.5: MISSED; extra memory <= 6x input: ok")


def test_nvfp4_needs_5x_and_memory_goal():
    assert not br.verdict(br.Result("nvfp4_rht", [0.4], 0, [1.9], 0), MIB)[0]  # 4.75x
    assert br.verdict(br.Result("nvfp4_rht", [0.38], 0, [1.9], 0), MIB)[0]  # 5.0x
    assert not br.verdict(br.Result("mxfp8", [0.1], 7 * MIB), MIB)[0]  # 7x the input
    assert not br.verdict(br.Result("mxfp8", [2.5], 0), MIB)[0]  # over 2 s


def test_table_lines():
    res = [br.Result("fp8_block", [0.1, 0.2], 4 * MIB, [0.3, 0.3], 5 * MIB), br.Result("mxfp8", [0.1], 0)]
    lines = br.table(res, 2 * MIB)
    assert lines[1].split() == ["fp8_block", "ours", "0.150", "0.100", "0.200", "4", "2.00", "2.00"]
    assert lines[2].split() == ["fp8_block", "TE", "0.300", "0.300", "0.300", "5", "2.50"]
    assert lines[4].split()[:2] == ["mxfp8", "ours"] and "time <= 2.0 s: ok" in lines[5]


def test_main_without_te(capsys):
    # At 256x256 the resident-size noise can exceed 6x the 128 KiB input, so only the run and its table count.
    assert br.main(["--size", "256", "--schemes", "fp8_block,mxfp8", "--repeat", "2"]) in (0, 1)
    out = capsys.readouterr().out
    assert "fp8_block  ours" in out and "mxfp8      ours" in out and "TE " not in out
