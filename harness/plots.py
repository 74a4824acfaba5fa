"""PNG plots of a report: mismatch heatmap over shapes, ULP histograms per unit, SQNR and SQNR against the golden's.

Source: docs/design.md §6 (`python -m harness report DIR` draws error heatmaps over shapes and ULP
histograms), docs/numerics.md §11 (delta_sqnr_db). Special-value inputs (`special`: NaN, Inf, zeros,
subnormals) are drawn apart from the finite distributions, whose SQNR they would swamp. Titles wrap
instead of running off the figure. matplotlib (Agg backend) is optional: without it the plots are
skipped with a message.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd

NO_MATPLOTLIB = "matplotlib is not installed; skipping plots (pip install matplotlib)"
SPECIAL_DISTRIBUTIONS = ("special", "special_nan", "special_inf")  # inputs with NaN / Inf / subnormals: plotted apart
_TITLE_WIDTH = 60
ULP_MAX_ROWS = 30  # rows of the ULP chart (series with elements off the golden's bits, the most mismatched first)


def _title(ax, text: str, fontsize: int = 10) -> None:
    ax.set_title(textwrap.fill(text, _TITLE_WIDTH), fontsize=fontsize)


def ulp_unit(tensor: str, out_dtype: str = "") -> str:
    """The unit a row's ULP histogram counts in: element codes, scale codes, or ULPs of a float dtype."""
    if tensor.endswith("_amax") or tensor.startswith("state_"):
        return "fp32 ULPs"
    if tensor.endswith("_data"):
        return "element codes"
    if tensor.endswith("_scale"):
        return "scale codes"
    return f"{out_dtype or 'output'} ULPs"


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
    if not (conf["mismatch_frac"] > 0).any():
        return False  # every conformance row matches: an all-white heatmap teaches nothing (the summary says so)
    conf = conf.assign(col=conf["scheme"] + "/" + conf["backend"])
    pv = conf.pivot_table(index="shape", columns="col", values="mismatch_frac", aggfunc="max")
    pv = pv.loc[(pv > 0).any(axis=1), (pv > 0).any(axis=0)]  # only shapes and columns with a mismatch
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * pv.shape[1] + 3), max(3, 0.35 * pv.shape[0] + 2)))
    worst = float(pv.max().max())
    im = ax.imshow(pv.values.astype(float), aspect="auto", cmap="Reds", vmin=0.0, vmax=max(1e-3, worst))
    ax.set_xticks(range(pv.shape[1]), pv.columns, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(pv.shape[0]), pv.index, fontsize=8)
    _title(ax, "max mismatch fraction per shape (conformance rows; shapes and columns with a mismatch)")
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
        key = f"{r.scheme}/{r.backend}, {ulp_unit(str(r.tensor), str(r.out_dtype))}"
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

    # One compact chart: a row per series (scheme/backend, unit) that has an element off the golden's bits, a
    # column per bucket, each cell the fraction of that series' elements (log colour, the count written in it).
    # Series whose elements are all at distance 0 are counted in the title, not drawn (a bar of one bucket each
    # made a 700x9900 px column of identical panels); at most ULP_MAX_ROWS rows, the most mismatched first.
    off = {k: h for k, h in totals.items() if any(c for b, c in h.items() if b != "0")}
    if not off:
        return False
    buckets = sorted({b for h in off.values() for b in h}, key=order)
    share = {k: sum(c for b, c in h.items() if b != "0") / max(1, sum(h.values())) for k, h in off.items()}
    keys = sorted(off, key=lambda k: (-share[k], k))[:ULP_MAX_ROWS]
    import numpy as np  # noqa: PLC0415

    frac = np.array([[off[k].get(b, 0) / max(1, sum(off[k].values())) for b in buckets] for k in keys])
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(buckets) + 4), max(2.5, 0.4 * len(keys) + 1.5)))
    shown = np.where(frac > 0, np.log10(np.maximum(frac, 1e-12)), np.nan)
    im = ax.imshow(shown, aspect="auto", cmap="viridis", vmin=min(-6.0, float(np.nanmin(shown))), vmax=0.0)
    for i, k in enumerate(keys):
        for j, b in enumerate(buckets):
            if off[k].get(b, 0):
                ax.text(j, i, str(off[k][b]), ha="center", va="center", fontsize=7,
                        color="black" if frac[i, j] > 0.1 else "white")
    ax.set_xticks(range(len(buckets)), buckets, fontsize=8)
    ax.set_yticks(range(len(keys)), [textwrap.shorten(k, 60) for k in keys], fontsize=8)
    ax.set_xlabel("distance from the golden (codes or ULPs)")
    rest = len(totals) - len(keys)
    _title(ax, "ULP distance histogram: elements per bucket (colour: log10 fraction)"
           + (f"; {rest} other series not drawn (all at 0, or past the first {ULP_MAX_ROWS})" if rest else ""),
           fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _scatter_by_toggle(plt, acc: pd.DataFrame, column: str, ylabel: str, title: str, path: Path) -> bool:
    """One panel per input family (finite distributions, special values): `column` by config toggle and backend."""
    acc = acc[acc[column].notna() & (acc[column].abs() != float("inf"))]
    if acc.empty:
        return False
    acc = acc.assign(label=[_toggle_label(r) for r in acc.itertuples(index=False)],
                     family=["special values" if d in SPECIAL_DISTRIBUTIONS else "finite inputs"
                             for d in acc["distribution"]])
    families = [f for f in ("finite inputs", "special values") if (acc["family"] == f).any()]
    labels = sorted(acc["label"].unique())
    backends = sorted(acc["backend"].unique())
    fig, axes = plt.subplots(len(families), 1, figsize=(max(6, 0.5 * len(labels) + 3), 4 * len(families)),
                             squeeze=False)
    for ax, fam in zip(axes[:, 0], families, strict=True):
        for j, b in enumerate(backends):
            sub = acc[(acc["backend"] == b) & (acc["family"] == fam)]
            if sub.empty:
                continue
            xs = [labels.index(lbl) + (j - (len(backends) - 1) / 2) * 0.15 for lbl in sub["label"]]
            ax.scatter(xs, sub[column], s=12, alpha=0.7, label=b)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        _title(ax, f"{title} ({fam})")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _sqnr(plt, df: pd.DataFrame, path: Path) -> bool:
    acc = df[df["kind"] == "accuracy"]
    return _scatter_by_toggle(plt, acc, "sqnr_db", "SQNR (dB) vs high-precision truth", "accuracy by scheme / toggle",
                              path)


def _delta_sqnr(plt, df: pd.DataFrame, path: Path) -> bool:
    acc = df[df["kind"] == "accuracy"]
    return _scatter_by_toggle(plt, acc, "delta_sqnr_db", "SQNR - golden's SQNR (dB)",
                              "accuracy against the golden's (0: as accurate; below 0: less accurate)", path)


def write_plots(df: pd.DataFrame, out_dir: str | Path) -> tuple[list[Path], str]:
    """Draw every plot with data into `out_dir`; returns (files written, message or '')."""
    plt = _pyplot()
    if plt is None:
        return [], NO_MATPLOTLIB
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, fn in (("mismatch_heatmap.png", _heatmap), ("ulp_hist.png", _ulp_hists), ("sqnr_by_toggle.png", _sqnr),
                     ("delta_sqnr_by_toggle.png", _delta_sqnr)):
        p = out / name
        if fn(plt, df, p):
            written.append(p)
    return written, "" if written else "no plottable rows (no mismatch fractions, ULP histograms or SQNR values)"
