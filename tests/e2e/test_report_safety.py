"""Tamper-proof, loss-free sweeps, the report side (issue #38): a cases file nested too deeply. Commands go through
`harness.cli.main` in this process (exit code, stdout, stderr)."""

from __future__ import annotations

from harness import cli


def main(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- a cases file nested too deeply --------------------------------------------------------------


def test_a_cases_file_nested_too_deeply_is_a_one_line_error(tmp_path, capsys):
    deep_arrays = tmp_path / "deep_arrays.toml"
    deep_arrays.write_text("[[grid]]\nscheme = \"fp8_current\"\nshape = " + "[" * 100_000 + "]" * 100_000 + "\n")
    deep_inline = tmp_path / "deep_inline.toml"
    deep_inline.write_text("x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n")
    deep_expand = tmp_path / "deep_expand.toml"  # TOML reads it; expanding the grid recursed per level
    deep_expand.write_text("[[grid]]\nscheme = \"fp8_current\"\nshape = " + "[" * 5000 + "]" * 5000 + "\n")
    for f in (deep_arrays, deep_inline, deep_expand):
        line = (f"error: cases file {f}: nested too deeply (tables or arrays nested beyond Python's recursion "
                "limit); grid values are flat lists of values or shapes\n")
        rc, _, err = main(capsys, "run", "--cases", str(f), "--out", str(tmp_path / "o"), "--device", "cpu",
                          "--no-progress")
        assert (rc, err) == (2, line)
        assert main(capsys, "list", "--cases", str(f)) == (2, "", line)
    assert not (tmp_path / "o").exists()
