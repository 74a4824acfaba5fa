"""native NVFP4 variants (4over6, row-scaled, row-scaled 4over6) against the golden, bit for bit.

Source: docs/numerics.md §5.10 (the variants), §5.1-§5.5 (scale chain, 16x16 tiles), §5.8 (dequantization,
alpha), §6 (GEMM). Quantize: data, scales (padding zero), amaxes, and dequantize (fp32 / bf16 / fp16) of
both copies for every variant build (e4m3_max 448 / 256, mae / mse, 1x16 / 16x16), fp32 / bf16 / fp16
inputs, shapes 16x16 .. 256x512 (M, K not multiples of the 128-row tile), the special inputs of
test_native_nvfp4 and the hand vector of tests/unit/test_nvfp4_variants.py; the nvfp4 tier's variant
cases through the harness. GEMM: row-scaled operands in TE's kernel-path order (§5.10) and 4over6 alpha
with each operand's e4m3_max, on operands whose fp32 sums are exact (checked: then the summation order
cannot matter and native must equal reference.gemm bit for bit). The reference runs on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import reference
from harness import runner
from harness.cases import load_cases
from reference.formats import QuantConfig
from reference.gemm import operands
from reference.nvfp4 import gemm_alpha
from reference.types import QuantizedTensor

from ..unit.test_nvfp4_variants import HAND_CODES, HAND_SCALES, HAND_X, _packed
from ..unit.test_nvfp4_variants import _inputs as tie_inputs
from .test_native_nvfp4 import DTYPES, assert_dequant_equal, assert_fields_equal, make_input

pytestmark = pytest.mark.gpu


def _cfg(variant: str, tile=(1, 16), e4m3_max: int = 448, err_mode: str = "mae") -> QuantConfig:
    kw = {"e4m3_max": e4m3_max, "err_mode": err_mode} if "4over6" in variant else {}
    return QuantConfig("nvfp4", tile=tile, variant=variant, **kw)


CONFIGS = {
    f"{t[0]}x{t[1]}-4over6-e{e}-{err}": _cfg("4over6", t, e, err)
    for t in ((1, 16), (16, 16))
    for e in (448, 256)
    for err in ("mae", "mse")
}
CONFIGS["1x16-row_scaled"] = _cfg("row_scaled")
for _e, _err in ((448, "mae"), (256, "mse"), (448, "mse"), (256, "mae")):
    CONFIGS[f"1x16-row_scaled_4over6-e{_e}-{_err}"] = _cfg("row_scaled_4over6", e4m3_max=_e, err_mode=_err)
SHAPES = [(16, 16), (48, 80), (144, 96), (256, 512)]
KINDS = ["zeros", "signed_zeros", "specials", "nan_only", "subnormal", "tiny_amax", "huge"]


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")


def _has_colwise(cfg: QuantConfig) -> bool:
    return cfg.variant != "row_scaled_4over6"  # §5.10: TE's check, reference.spec.copies_rule


def run_variant(cfg: QuantConfig, x_cpu: torch.Tensor, label: str, *, rowwise=True, colwise=None):
    """Native quantize == reference.quantize (every field), and native dequantize == reference.dequantize."""
    from native import nvfp4

    colwise = _has_colwise(cfg) if colwise is None else colwise
    golden = reference.quantize(x_cpu, cfg, rowwise=rowwise, colwise=colwise)
    fields = nvfp4.quantize_2d(x_cpu.cuda(), cfg, rowwise=rowwise, colwise=colwise)
    torch.cuda.synchronize()
    m, k = x_cpu.shape
    assert_fields_equal(golden, fields, m, k, label)
    cand = QuantizedTensor(cfg, tuple(x_cpu.shape), golden.hp_dtype, **fields)
    assert_dequant_equal(golden, cand, label, dtypes=(torch.float32, torch.bfloat16, torch.float16))
    return golden, cand


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_variant_matches_reference(cfg_name, dtype_name, shape):
    cfg = CONFIGS[cfg_name]
    for seed, x in enumerate((make_input("normal", shape, DTYPES[dtype_name], 1), tie_inputs(2, *shape, torch.float32))):
        run_variant(cfg, x.to(DTYPES[dtype_name]), f"{cfg.id} {dtype_name} {shape} input {seed}")


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_variant_special_inputs_match_reference(cfg_name, dtype_name, kind):
    cfg = CONFIGS[cfg_name]
    x = make_input(kind, (48, 80), DTYPES[dtype_name], 3)
    x[5] = 0  # an all-zero row: row-scaled A_g = 0 -> S_enc = 1 (§5.10)
    run_variant(cfg, x, f"{cfg.id} {dtype_name} {kind}")


@pytest.mark.parametrize("cfg_name", [n for n in CONFIGS if "row_scaled_4over6" not in n])
@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
def test_variant_single_copy_matches_reference(cfg_name, orientation):
    cfg = CONFIGS[cfg_name]
    x = make_input("normal", (64, 48), torch.bfloat16, 4)
    run_variant(cfg, x, f"{cfg.id} {orientation} only", rowwise=orientation == "rowwise",
                colwise=orientation == "colwise")  # fmt: skip


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_4over6_hand_vector(tile):
    """tests/unit/test_nvfp4_variants.py's hand-checked blocks (A_g = 2688: S_enc = 1) on every row."""
    x = torch.tensor(HAND_X, dtype=torch.float32).repeat(16, 1)
    golden, cand = run_variant(_cfg("4over6", tile), x, f"hand vector {tile}")
    want = torch.tensor([b for c in HAND_CODES for b in _packed(c)], dtype=torch.uint8)
    for r in range(16):
        assert torch.equal(cand.rowwise_data[r].cpu(), want), r
        assert cand.rowwise_scale[r, :4].cpu().tolist() == HAND_SCALES, r


# ---- the nvfp4 tier's variant cases ------------------------------------------------------------

def _variant_cases(tier: str) -> list:
    return [c for c in load_cases(tier) if c.config.variant is not None
            or (c.b_config is not None and c.b_config.variant is not None)]  # fmt: skip


_TIERS = {"nvfp4": _variant_cases("nvfp4"), "gemm": _variant_cases("gemm")}


def test_tiers_have_variant_cases():
    # python -m harness list --tier T | grep -cE "4over6|row_scaled" (at c5d6631: 1395 and 240)
    assert len(_TIERS["nvfp4"]) >= 1395 and len(_TIERS["gemm"]) >= 240


@pytest.mark.parametrize("tier,chunk", [("nvfp4", i) for i in range(8)] + [("gemm", i) for i in range(2)])
def test_tier_variant_cases_pass_on_native(tier, chunk):
    """The harness's own verdicts (quantize / dequantize: bit-exact; GEMM: the §6 rules) for native."""
    n_chunks = 8 if tier == "nvfp4" else 2
    bad = []
    for case in _TIERS[tier][chunk::n_chunks]:
        for row in runner.run_case(case, "native", "cuda"):
            if row.get("status") not in ("pass", "info"):  # info: the accuracy rows (no verdict)
                bad.append((case.id, row.get("tensor"), row.get("status"), row.get("reason")))
    assert not bad, f"{len(bad)} rows not passing; first: {bad[:5]}"


# ---- GEMM -------------------------------------------------------------------------------------


def _lsb_exp(v: torch.Tensor) -> int:
    """The smallest exponent of a lowest set significand bit over the non-zero fp64 values of v."""
    nz = v[v != 0].abs()
    mant, e = torch.frexp(nz)  # nz = mant * 2^e, 0.5 <= mant < 1
    i = torch.ldexp(mant, torch.full_like(e, 53)).to(torch.int64)  # exact integer significand
    tz = torch.log2((i & -i).to(torch.float64)).to(torch.int64)  # trailing zero bits
    return int((e.to(torch.int64) - 53 + tz).min())


def _assert_fp32_sums_exact(qa, qb, layout: str) -> None:
    """Test construction: every product and partial sum of the GEMM is a multiple of 2^q and the sum
    of |products| of each output is below 2^(q + 24), so the fp32 sums are exact in any order."""
    oa, ob, _ = operands(qa, qb, layout)

    def deq(o):
        return o.values * o.scale.to(torch.float64).repeat_interleave(o.block, dim=1)[:, : o.depth]

    da, db = deq(oa), deq(ob)
    q = _lsb_exp(da) + _lsb_exp(db)
    bound = float((da.abs() @ db.abs().t()).max())
    assert bound < 2.0 ** (q + 23), f"test construction: fp32 sums may round (bound {bound}, q {q})"


def _gemm_input(shape, amax: float, seed: int, row_scaled: bool) -> torch.Tensor:
    """A copy's source [rows, cols] whose 16-element blocks all have amax A_r, the row's amax: A_r = amax,
    or (row-scaled) amax * 2^-3 .. 2^3 per row; the other elements are multiples of A_r / 12 in
    [-A_r, A_r]. Every block scale is then 448 (or 256 / 384 under 4over6 with e4m3_max = 256): the
    dequantized values share a few binades and the GEMM's fp32 sums stay exact (checked per test)."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = shape
    a_r = torch.full((rows, 1), amax)
    if row_scaled:
        a_r = a_r * torch.exp2(torch.randint(-3, 4, (rows, 1), generator=g).float())
    x = torch.randint(-12, 13, shape, generator=g).to(torch.float32) * 0.5 * (a_r / 6)  # exact
    x[:, ::16] = a_r
    return x


def _operand(cfg: QuantConfig, logical, amax, seed, orientation):
    """cfg's `orientation` copy of a logical [rows, cols] operand built by _gemm_input in the copy's layout."""
    copy_shape = logical if orientation == "rowwise" else logical[::-1]
    src = _gemm_input(copy_shape, amax, seed, cfg.row_scaled)
    x = src if orientation == "rowwise" else src.t().contiguous()
    return reference.quantize(x, cfg, rowwise=orientation == "rowwise", colwise=orientation == "colwise")


_LAYOUT_COPIES = {"TN": ("rowwise", "rowwise"), "NN": ("rowwise", "colwise"), "NT": ("colwise", "colwise")}
GEMM_PAIRS = [
    ("row_scaled", "row_scaled", ("TN", "NN", "NT")),
    ("row_scaled", "plain", ("TN", "NN", "NT")),
    ("plain", "row_scaled", ("TN", "NN")),
    ("row_scaled_4over6-e256", "row_scaled_4over6-e448", ("TN",)),
    ("row_scaled_4over6-e256", "4over6-e448", ("TN",)),
    ("4over6-e256", "4over6-e448", ("TN", "NN", "NT")),
    ("16x16-4over6-e256", "plain", ("TN", "NN")),
]
_GEMM_CFGS = {
    "plain": QuantConfig("nvfp4"),
    "row_scaled": _cfg("row_scaled"),
    "row_scaled_4over6-e256": _cfg("row_scaled_4over6", e4m3_max=256, err_mode="mse"),
    "row_scaled_4over6-e448": _cfg("row_scaled_4over6"),
    "4over6-e256": _cfg("4over6", e4m3_max=256, err_mode="mse"),
    "4over6-e448": _cfg("4over6"),
    "16x16-4over6-e256": _cfg("4over6", (16, 16), 256),
}
_GEMM_CASES = [(a, b, lay) for a, b, lays in GEMM_PAIRS for lay in lays]


@pytest.mark.parametrize("a_name,b_name,layout", _GEMM_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("method", ["portable", "auto"])
@pytest.mark.parametrize("epilogue", ["none", "bias_c"])
def test_variant_gemm_matches_reference(a_name, b_name, layout, out_dtype, method, epilogue):
    from native.gemm import gemm as native_gemm

    ca, cb = _GEMM_CFGS[a_name], _GEMM_CFGS[b_name]
    m, n, k = 48, 80, 64
    oa, ob = _LAYOUT_COPIES[layout]
    # A_g = 6 * e4m3_max for the per-tensor operands: S_enc = 1 and alpha = 1 (checked below), so the
    # non-row-scaled GEMMs round once (alpha * y exact) as the golden's fp64 epilogue does.
    a_amax, b_amax = 6.0 * ca.e4m3_max, 6.0 * cb.e4m3_max
    qa = _operand(ca, (m, k) if oa == "rowwise" else (k, m), a_amax, 21, oa)
    qb = _operand(cb, (n, k) if layout == "TN" else (k, n), b_amax, 22, ob)
    if not (ca.row_scaled or cb.row_scaled):
        one = gemm_alpha(torch.tensor([a_amax]), torch.tensor([b_amax]), ca.e4m3_max, cb.e4m3_max)
        assert float(one) == 1.0, "test construction: alpha must be 1"
    _assert_fp32_sums_exact(qa, qb, layout)
    g = torch.Generator().manual_seed(5)
    bias = c = None
    if epilogue == "bias_c":
        bias = (torch.randint(-64, 65, (n,), generator=g).float() * 0.25).to(torch.bfloat16).float()
        c = torch.randn(m, n, generator=g).to(out_dtype)
    want = reference.gemm(qa, qb, layout=layout, out_dtype=out_dtype, bias=bias, c=c)
    got = native_gemm(qa.to("cuda"), qb.to("cuda"), layout=layout, out_dtype=out_dtype,
                      bias=None if bias is None else bias.cuda(), c=None if c is None else c.cuda(),
                      method=method).cpu()  # fmt: skip
    bits = torch.int32 if out_dtype == torch.float32 else torch.int16
    bad = (got.view(bits) != want.view(bits)).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} of {want.numel()} differ; first {tuple(bad[0].tolist())}: " \
                             f"native {got[tuple(bad[0])].item()} golden {want[tuple(bad[0])].item()}"


def test_row_scaled_gemm_of_native_operands():
    """Operands quantized natively (row-scaled, amax vectors on the GPU) give the golden's GEMM."""
    from native.gemm import gemm as native_gemm

    cfg = _cfg("row_scaled")
    xa, xb = _gemm_input((64, 32), 3.0, 31, True), _gemm_input((96, 32), 5.0, 32, True)
    import native

    qa, qb = native.quantize(xa.cuda(), cfg), native.quantize(xb.cuda(), cfg)
    ra, rb = reference.quantize(xa, cfg), reference.quantize(xb, cfg)
    _assert_fp32_sums_exact(ra, rb, "TN")
    want = reference.gemm(ra, rb, layout="TN", out_dtype=torch.bfloat16)
    got = native_gemm(qa, qb, layout="TN", out_dtype=torch.bfloat16).cpu()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
