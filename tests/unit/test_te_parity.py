"""TE-parity of NVFP4 and its variants (docs/numerics.md §5, §5.10) against TE's own Python reference.

`NVFP4QuantizerRef` (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py) is loaded from a TE
source tree by `tests/te_reference.py` (env `TE_ROOT`, default the mirror; skipped when absent, as in CI)
and run on our own inputs next to `reference.quantize`: data codes, E4M3 scale bytes of the valid region
and the global / per-row amaxes of every copy TE produces, for plain 1x16 and 16x16, 4over6 (1x16 and
16x16; MAE and MSE; e4m3_max 448 and 256), row-scaled and row-scaled 4over6. Where TE's reference and
our contract differ by a documented rule (§7.7 negative zero, §7.8 / §5.10 the S_enc of an all-zero
amax), the test asserts that rule instead of equality.

TE's reference has no NVFP4 dequantization (`supports_dequantize` is False), so none is compared here.

Layout map, TE's `NVFP4QuantizerRef._quantize` -> `reference.QuantizedTensor` (§5.9):
- `qx` uint8 [M, K/2], `cast_to_fp4x2`: byte j = code[2j] + 16 * code[2j+1], the even element in the low
  nibble; ours `rowwise_data` [M, K/2], the same packing (§5.4), so bytes compare directly.
- `qx_t` uint8 [K, M/2]: the same packing of NVFP4(Xᵀ) (TE quantizes `tensor.t()`); ours `colwise_data`
  [K, M/2], also the rows of Xᵀ (§5.5): no transpose between the two.
- `sx` / `sx_t` float8_e4m3fn [M, K/16] / [K, M/16] (padded only to the tile, never to 128 x 4; 2-D tiles
  repeat the tile scale on its 16 rows, as ours); ours uint8 E4M3 bits [roundup(M,128), roundup(K/16,4)]:
  the valid region is ours[:M, :K/16], compared with TE's bytes viewed as uint8. Our padding is 0 (§5.9).
- `global_amax_row` / `global_amax_col`: fp32 [1] (per tensor) or [M] / [K] (row-scaled, the amax of each
  row of X / of Xᵀ); ours `rowwise_amax` / `colwise_amax`, same shapes.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from reference import QuantConfig, quantize
from reference.types import SpecViolation
from tests import te_reference

ROOT = te_reference.te_root()
pytestmark = pytest.mark.skipif(
    not te_reference.has_sources(ROOT),
    reason=f"TransformerEngine sources not found at {ROOT} (set TE_ROOT to a TE checkout or git directory)",
)


@pytest.fixture(scope="module")
def te():
    return te_reference.load(ROOT)


# ---- the variants: TE's quantizer keywords, our QuantConfig, and which copies TE produces -------------


def _variants():
    out = {"plain_1x16": (dict(quant_tile_shape=(1, 16)), QuantConfig("nvfp4"), True),
           "plain_16x16": (dict(quant_tile_shape=(16, 16)), QuantConfig("nvfp4", tile=(16, 16)), True)}
    for tile in ((1, 16), (16, 16)):
        for mode in ("mae", "mse"):
            for e4m3_max in (448, 256):
                te_kw = dict(quant_tile_shape=tile, nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max,
                             nvfp4_4over6_err_mode=mode.upper())
                cfg = QuantConfig("nvfp4", tile=tile, variant="4over6", e4m3_max=e4m3_max, err_mode=mode)
                out[f"4over6_{tile[0]}x{tile[1]}_{mode}_{e4m3_max}"] = (te_kw, cfg, True)
    out["row_scaled"] = (dict(row_scaled_nvfp4=True), QuantConfig("nvfp4", variant="row_scaled"), True)
    for mode in ("mae", "mse"):
        for e4m3_max in (448, 256):
            te_kw = dict(row_scaled_nvfp4=True, nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max,
                         nvfp4_4over6_err_mode=mode.upper())
            cfg = QuantConfig("nvfp4", variant="row_scaled_4over6", e4m3_max=e4m3_max, err_mode=mode)
            # Rowwise only: TE's kernel rejects the columnwise row-scaled 4over6 copy and so does our
            # contract (§5.10); TE's Python reference would still build one (test below).
            out[f"row_scaled_4over6_{mode}_{e4m3_max}"] = (te_kw, cfg, False)
    return out


VARIANTS = _variants()


# ---- our inputs -------------------------------------------------------------------------------------

# E2M1 grid midpoints (round-half-to-even ties of §5.4) and the block maximum 6.
_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _ties(shape, g):
    """Blocks of 16: element 0 = ±6·2^e, the rest E2M1 midpoints ·2^e (every 3rd nudged by ±1 ulp);
    every 4th block is constant or a single spike, whose 4over6 candidates both reproduce it (error ties)."""
    m, k = shape
    nb = m * k // 16
    e = torch.randint(-6, 7, (nb, 1), generator=g).float()
    vals = _MIDPOINTS[torch.randint(0, 7, (nb, 16), generator=g)]
    vals[:, 0] = 6.0
    sign = torch.where(torch.rand(nb, 16, generator=g) < 0.5, -1.0, 1.0)
    x = vals * sign * torch.exp2(e)
    nudge = torch.randint(-1, 2, (nb, 16), generator=g).float() * (torch.arange(16) % 3 == 1)
    x = torch.where(nudge > 0, torch.nextafter(x, torch.tensor(float("inf"))), x)
    x = torch.where(nudge < 0, torch.nextafter(x, torch.tensor(float("-inf"))), x)
    x[0::8] = x[0::8, :1].expand(-1, 16)  # constant blocks
    x[4::8, 1:] = 0.0  # single spikes
    return x.reshape(m, k)


def _tie_tiles() -> torch.Tensor:
    """[32, 48] whose 16x16 4over6 tiles (0, 0) (MAE) and (0, 1) (MSE) are exact error ties that fp32 rounding
    breaks one way in the rowwise sum order and the other way in the columnwise one (§5.10).

    A_g = 2688 (at [0, 32]) makes S_enc = S_dec = 1; tile amax 6 makes base = 1, map6 scale 1.0 (0x38), map4
    1.5 (0x3C), and every error term exact: x = 1.0 costs map4 0.25 (y = 2/3 -> 0.5 -> 0.75) and map6 0;
    x = 0.75 costs map6 0.25 (the tie 0.75 -> 1.0) and map4 0; x = 6 costs neither. Row 0 of a tile holds
    1.0, t, t, 0.75 and x[1, 0] = 6, with t a half ulp of the 0.25 (MAE: t = 2^-26; MSE: t² = 2^-28 of 0.0625).
    Rowwise (elements 0..15 of row 0 in order): err4 = 0.25 (t absorbed twice, ties to even), err6 = 2t + 0.25
    rounds up: map4. Columnwise (each element its own row of Xᵀ, tree-summed): both sums 0.25: tie, map6.
    """
    x = torch.zeros(32, 48)
    for col, tiny in ((0, 2.0**-26), (16, 2.0**-14)):
        x[0, col:col + 4] = torch.tensor([1.0, tiny, tiny, 0.75])
        x[1, col] = 6.0
    x[0, 32] = 2688.0
    return x


def _input(kind: str, shape, dtype):
    g = torch.Generator().manual_seed(zlib.crc32(f"{kind}{shape}".encode()))
    m, k = shape
    if kind == "normal":
        x = torch.randn(shape, generator=g)
    elif kind == "heavy":  # Cauchy-like: a ratio of normals, magnitudes over ~20 binades
        x = torch.randn(shape, generator=g) / torch.randn(shape, generator=g).abs().clamp_min(1e-6)
    elif kind == "ties":
        x = _ties(shape, g)
    elif kind == "zeros":
        x = torch.zeros(shape)
    elif kind == "zero_row":  # one all-zero row and one all-zero column (row-scaled: A_g = 0, §5.10)
        x = torch.randn(shape, generator=g)
        x[m // 2] = 0.0
        x[:, k // 3] = 0.0
    elif kind == "subnormal":  # fp32 / bf16 subnormals: whole rows, half rows, and mixed with normals in a block
        x = torch.randn(shape, generator=g) * 2.0**-133
        x[::3] *= 2.0**133  # normal rows
        x[1::3, : k // 2] *= 2.0**133  # rows half normal, half subnormal (whole blocks of each)
        x[2::3, ::5] *= 2.0**130  # blocks holding subnormals next to normals
    elif kind == "negzero":  # signed zeros among normals (§7.7)
        x = torch.randn(shape, generator=g)
        r = torch.rand(shape, generator=g)
        x = torch.where(r < 0.2, torch.tensor(-0.0), torch.where(r < 0.3, torch.tensor(0.0), x))
    elif kind == "tie_tiles":
        x = _tie_tiles()
        x[16:] = torch.randn(m - 16, k, generator=g)
    elif kind == "tiny_all":  # the whole tensor subnormal: S_enc = RN(2688 / A_g) overflows, FLT_MAX (§5.1)
        x = torch.randn(shape, generator=g) * 2.0**-140
    else:
        raise ValueError(kind)
    return x.to(dtype)


# (kind, shape): every shape a multiple of 16 (§5.5) and, apart from none, not of 128.
INPUTS = [
    ("normal", (16, 32)),
    ("normal", (144, 208)),
    ("heavy", (48, 80)),
    ("ties", (32, 64)),
    ("zeros", (16, 48)),
    ("zero_row", (48, 32)),
    ("subnormal", (48, 96)),
    ("negzero", (32, 48)),
    ("tiny_all", (16, 32)),
    ("tie_tiles", (32, 48)),
]


# ---- comparison -------------------------------------------------------------------------------------


def _nibbles(data: torch.Tensor) -> torch.Tensor:
    """[R, C/2] packed bytes -> [R, C] codes, even element from the low nibble (§5.4; TE's cast_to_fp4x2)."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], -1)


def _assert_codes(te_data: torch.Tensor, ours: torch.Tensor, x_copy: torch.Tensor):
    """TE's codes equal ours except where our scaled y is −0.0: §7.7, TE's `cast_to_fp4x2` maps −0.0 to
    0x0 (it tests `x < -0.0`), the kernels and the contract to 0x8."""
    assert te_data.dtype == torch.uint8 and te_data.shape == ours.shape
    t, o = _nibbles(te_data), _nibbles(ours)
    diff = t != o
    if diff.any():
        # NUMERICS: docs/numerics.md §7.7 — the only allowed difference: ours 0x8 (−0), TE 0x0.
        assert bool((o[diff] == 0x8).all() and (t[diff] == 0x0).all()), "codes differ beyond §7.7"
        xs = x_copy.float()[diff]
        # y = RN(x·f) is −0.0 only for x = −0.0 or a negative x so small that x·f underflows.
        assert bool((xs <= 0).all() and (xs.abs() < 2.0**-126).all()), "a §7.7 difference at a non-zero y"
    # Every −0.0 input is such a position (f > 0, so y = −0.0 · f = −0.0).
    negz = (x_copy.float() == 0) & torch.signbit(x_copy.float())
    assert bool((o[negz] == 0x8).all() and (t[negz] == 0x0).all())


def _assert_scales(te_scale: torch.Tensor, ours: torch.Tensor, rows: int, blocks: int):
    assert te_scale.dtype == torch.float8_e4m3fn and tuple(te_scale.shape) == (rows, blocks)
    assert torch.equal(te_scale.view(torch.uint8), ours[:rows, :blocks])
    pad = ours.clone()
    pad[:rows, :blocks] = 0
    assert not pad.any(), "our scale padding is 0 (§5.9)"


def _te_quantize(te, te_kw: dict, x: torch.Tensor, colwise: bool):
    q = te.nvfp4.NVFP4QuantizerRef(te.utils.Fp4Formats.E2M1, rowwise=True, columnwise=colwise, **te_kw)
    return q.quantize(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind,shape", INPUTS, ids=[f"{k}-{m}x{n}" for k, (m, n) in INPUTS])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_quantize_matches_te_reference(te, variant, kind, shape, dtype):
    te_kw, cfg, colwise = VARIANTS[variant]
    x = _input(kind, shape, dtype)
    m, k = shape
    t = _te_quantize(te, te_kw, x, colwise)
    ours = quantize(x, cfg, rowwise=True, colwise=colwise)
    row_scaled = cfg.variant.startswith("row_scaled") if cfg.variant else False

    _assert_codes(t.data, ours.rowwise_data, x)
    _assert_scales(t.scale, ours.rowwise_scale, m, k // 16)
    # Amax: fp32 [1], or [M] for a row-scaled copy. An all-zero row has A_g = 0 in both; its S_enc is FLT_MAX
    # in TE's reference and 1 in the contract (§5.10, §7.8), which no output holds: the bytes above agree.
    assert t.global_amax_row.dtype == torch.float32
    assert torch.equal(t.global_amax_row, ours.rowwise_amax)
    assert tuple(ours.rowwise_amax.shape) == ((m,) if row_scaled else (1,))
    if colwise:
        xt = x.t()
        _assert_codes(t.data_t, ours.colwise_data, xt)
        _assert_scales(t.scale_t, ours.colwise_scale, k, m // 16)
        assert torch.equal(t.global_amax_col, ours.colwise_amax)
        assert tuple(ours.colwise_amax.shape) == ((k,) if row_scaled else (1,))


def test_row_scaled_4over6_columnwise_is_ours_to_reject(te):
    """§5.10: TE's Python reference builds a columnwise row-scaled 4over6 copy, TE's kernel and our contract
    do not; the rowwise copy above is the whole comparison."""
    x = _input("normal", (16, 32), torch.float32)
    te_kw, cfg, _ = VARIANTS["row_scaled_4over6_mae_448"]
    assert _te_quantize(te, te_kw, x, True).data_t is not None
    with pytest.raises(SpecViolation):
        quantize(x, cfg, rowwise=True, colwise=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode,tile_col", [("mae", 0), ("mse", 1)])
def test_4over6_16x16_columnwise_copy_is_not_the_transpose(te, mode, tile_col, dtype):
    """§5.10: the 16x16 4over6 columnwise copy is quantized from Xᵀ on its own; on `_tie_tiles` TE's reference
    and ours pick map4 (scale 1.5 = 0x3C) rowwise and map6 (1.0 = 0x38) columnwise for the same tile."""
    x = _input("tie_tiles", (32, 48), dtype)
    te_kw, cfg, _ = VARIANTS[f"4over6_16x16_{mode}_448"]
    t = _te_quantize(te, te_kw, x, True)
    ours = quantize(x, cfg, rowwise=True, colwise=True)
    for scale, colwise_scale in ((t.scale.view(torch.uint8), t.scale_t.view(torch.uint8)),
                                 (ours.rowwise_scale, ours.colwise_scale)):
        assert scale[0:16, tile_col].tolist() == [0x3C] * 16  # tile (0, tile_col), rowwise: map4
        assert colwise_scale[16 * tile_col:16 * tile_col + 16, 0].tolist() == [0x38] * 16  # columnwise: map6
    assert not torch.equal(_nibbles(ours.rowwise_data).t(), _nibbles(ours.colwise_data))
