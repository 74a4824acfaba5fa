"""PNG plots of a report: mismatch heatmap over shapes, ULP histograms, SQNR by scheme and toggle.

Source: docs/design.md §6 (`python -m harness report DIR` draws error heatmaps over shapes and ULP
histograms). matplotlib (Agg backend) is optional: without it the plots are skipped with a message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

NO_MATPLOTLIB = "matplotlib is not installed; skipping plots (pip install matplotlib)"


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    return plt


def _toggle_label(r) -> str:
    """scheme/element[/tile][/rht][/sr][/pow2][/floor]: the config toggles that shape accuracy."""
    parts = [r.scheme, r.element]
    if r.tile:
        parts.append(r.tile)
    for flag, name in (("rht", "rht"), ("stochastic", "sr")):
        if str(getattr(r, flag)).lower() == "true":
            parts.append(name)
    if str(r.pow2_scales).lower() == "true":
        parts.append("pow2")
    if r.e8m0_rule and r.e8m0_rule != "ceil":
        parts.append(r.e8m0_rule)
    return "/".join(str(p) for p in parts)


def _heatmap(plt, df: pd.DataFrame, path: Path) -> bool:
    conf = df[(df["kind"] == "conformance") & df["mismatch_frac"].notna()]
    if conf.empty:
        return False
    conf = conf.assign(col=conf["scheme"] + "/" + conf["backend"])
    pv = conf.pivot_table(index="shape", columns="col", values="mismatch_frac", aggfunc="max")
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * pv.shape[1] + 3), max(3, 0.35 * pv.shape[0] + 2)))
    worst = float(pv.max().max())
    im = ax.imshow(pv.values.astype(float), aspect="auto", cmap="Reds", vmin=0.0, vmax=max(1e-3, worst))
    ax.set_xticks(range(pv.shape[1]), pv.columns, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(pv.shape[0]), pv.index, fontsize=8)
    ax.set_title("max mismatch fraction per shape (conformance rows)" + ("" if worst > 0 else ": none"))
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _ulp_hists(plt, df: pd.DataFrame, path: Path) -> bool:
    totals: dict[str, dict[str, int]] = {}
    for r in df[df["ulp_hist"].astype(str).str.len() > 2].itertuples(index=False):
        try:
            h = json.loads(r.ulp_hist)
        except ValueError:
            continue
        if not isinstance(h, dict):
            continue
        key = f"{r.scheme}/{r.backend}"
        acc = totals.setdefault(key, {})
        for bucket, count in h.items():
            try:
                acc[str(bucket)] = acc.get(str(bucket), 0) + int(count)
            except (TypeError, ValueError):
                continue
    totals = {k: v for k, v in totals.items() if v}
    if not totals:
        return False

    try:
        from .compare import ULP_BUCKETS  # noqa: PLC0415 - the bucket order the comparison writes
    except ImportError:  # pragma: no cover
        ULP_BUCKETS = ()

    def order(b: str):
        if b in ULP_BUCKETS:
            return (0, ULP_BUCKETS.index(b), b)
        try:
            return (1, float(b.rstrip("+*").split("-")[0]), b)
        except ValueError:
            return (2, 0.0, b)

    fig, axes = plt.subplots(len(totals), 1, figsize=(7, 2.2 * len(totals)), squeeze=False)
    for ax, (key, h) in zip(axes[:, 0], sorted(totals.items()), strict=True):
        buckets = sorted(h, key=order)
        ax.bar(range(len(buckets)), [h[b] for b in buckets], color="tab:blue")
        ax.set_xticks(range(len(buckets)), buckets, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"ULP distance histogram: {key}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _sqnr(plt, df: pd.DataFrame, path: Path) -> bool:
    acc = df[(df["kind"] == "accuracy") & df["sqnr_db"].notna()]
    acc = acc[acc["sqnr_db"].abs() != float("inf")]
    if acc.empty:
        return False
    acc = acc.assign(label=[_toggle_label(r) for r in acc.itertuples(index=False)])
    labels = sorted(acc["label"].unique())
    backends = sorted(acc["backend"].unique())
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(labels) + 3), 4))
    for j, b in enumerate(backends):
        sub = acc[acc["backend"] == b]
        xs = [labels.index(lbl) + (j - (len(backends) - 1) / 2) * 0.15 for lbl in sub["label"]]
        ax.scatter(xs, sub["sqnr_db"], s=12, alpha=0.7, label=b)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("SQNR (dB) vs high-precision truth")
    ax.set_title("accuracy by scheme / toggle")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_plots(df: pd.DataFrame, out_dir: str | Path) -> tuple[list[Path], str]:
    """Draw every plot with data into `out_dir`; returns (files written, message or '')."""
    plt = _pyplot()
    if plt is None:
        return [], NO_MATPLOTLIB
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, fn in (("mismatch_heatmap.png", _heatmap), ("ulp_hist.png", _ulp_hists), ("sqnr_by_toggle.png", _sqnr)):
        p = out / name
        if fn(plt, df, p):
            written.append(p)
    return written, "" if written else "no plottable rows (no mismatch fractions, ULP histograms or SQNR values)"
