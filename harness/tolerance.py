"""GEMM tolerances: a table keyed by (scheme, op, out_dtype) and the per-element bound it gives.

Source: docs/numerics.md §6 (what is bit-exact and what only has a tolerance: cuBLASLt's accumulation
order and Hopper's FP8 fast-accumulation mode are unspecified), docs/design.md §5 (a tolerance table
keyed by (scheme, op, out dtype) that raises on a missing key). A missing key is a KeyError that
names the key: a new scheme or dtype needs a deliberate entry, never a silent default.

Derivation (per output element y[m, n]; all quantities are magnitudes):
  Let â, b̂ be the dequantized operands of the consumed copies (element value times every scale,
  NVFP4 alpha included) and S = Σ_k |â_k|·|b̂_k| (computed in fp64), y* = Σ_k â_k·b̂_k (+ bias)
  (+ C) exactly.
  * Candidate accumulation (recursive-summation bound, Higham §4.2, products exact in the MMA):
    |ŷ_c − y*| ≤ γ_c·S with γ_c = min(K, chunk)·u_acc + ceil(K / chunk)·u_32 + r·u_32,
    u_acc the accumulator's unit roundoff inside one chunk of K (the chunk is then promoted to an
    fp32 accumulator), r the fp32 roundings that apply scales / alpha / dequantization per term.
  * The golden reference sums in fp64 (or, for fp8_block "blockwise_order", one FMA32 per 128-K
    block): γ_g = ceil(K / 128)·u_32 + r·u_32 covers both.
  * Each output is rounded once to the out dtype: |RN_out(v) − v| ≤ u_out·|v| + tiny_out, and with
    beta = 1 (accumulate) some paths round Y before adding C: one more u_out·|Y| ≤ u_out·S_y, with
    S_y = S + |bias|.
  Hence |y_c − y_g| ≤ safety·[(γ_c + γ_g)·S + u_out·(2·|y_g| + S_y·[accumulate])] + 2·tiny_out,
  safety = 2 absorbing the (1 + u) factors of the products of these bounds.
  u_32 = 2^-24 (fp32), u_out = eps/2 of the out dtype (bf16 2^-8, fp16 2^-11, fp32 2^-24),
  tiny_out = its smallest subnormal. u_acc = u_32 for fp32 accumulation (MXFP8/NVFP4 block-scaled
  MMAs and the emulated path); u_acc = 2^-13 for Hopper FP8 tensor cores, whose accumulator keeps
  about 14 significant bits (DeepSeek-V3 report §3.3.2; the same figure as docs/numerics.md §6's
  2^13·q for fast accumulation): per-tensor FP8 in fast-accumulation mode (TE's fprop, layout TN)
  accumulates the whole K that way; with the split accumulator (dgrad NN, wgrad NT) and for fp8_block
  the partial sums are promoted to fp32 every 128 K elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .cases import Case

U32 = float(torch.finfo(torch.float32).eps) / 2  # 2^-24
# Hopper FP8 tensor-core accumulator: ~14 significant bits (see the module docstring).
HOPPER_FP8_ACC_U = 2.0**-13
PROMOTION_CHUNK = 128  # K elements accumulated in the tensor core before promotion to fp32
SAFETY = 2.0
GOLDEN_BLOCK = 128  # fp8_block golden FMA32 per 128-K block (docs/numerics.md §6)
OUT_DTYPES = ("bfloat16", "float32", "float16")
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class GemmTolerance:
    """One row of the table: the candidate's accumulator model (see the module docstring)."""

    u_acc: float  # unit roundoff inside one accumulation chunk
    chunk: dict  # layout -> K elements per chunk before promotion to fp32 (None: the whole K)
    scale_rounds: int  # fp32 roundings per term applying scales / alpha / dequantization
    note: str

    def gamma(self, k: int, layout: str) -> float:
        """γ_c + γ_g for a K-deep GEMM in `layout`."""
        chunk = self.chunk.get(layout)
        inner = k if chunk is None else min(k, chunk)
        outer = math.ceil(k / inner)
        gamma_c = inner * self.u_acc + outer * U32 + self.scale_rounds * U32
        gamma_g = math.ceil(k / GOLDEN_BLOCK) * U32 + self.scale_rounds * U32
        return gamma_c + gamma_g


_PER_TENSOR = GemmTolerance(
    HOPPER_FP8_ACC_U,
    {"TN": None, "NN": PROMOTION_CHUNK, "NT": PROMOTION_CHUNK},
    3,
    "Hopper FP8 tensor cores: fast accumulation over all K in fprop (TN), split accumulator "
    "(fp32 promotion every 128) in dgrad/wgrad; scales sinv_a*sinv_b in the epilogue",
)
_BLOCKWISE = GemmTolerance(
    HOPPER_FP8_ACC_U,
    {"TN": PROMOTION_CHUNK, "NN": PROMOTION_CHUNK, "NT": PROMOTION_CHUNK},
    3,
    "Hopper FP8 tensor cores per 128-K block, then FMA32 of the block scales (docs/numerics.md §6)",
)
_FP32_ACC = GemmTolerance(
    U32,
    {"TN": None, "NN": None, "NT": None},
    6,
    "block-scaled MMA (sm_100) or emulation with fp32 accumulation; exact products; scale and "
    "alpha roundings per term",
)

TABLE: dict[tuple[str, str, str], GemmTolerance] = {}
for _out in OUT_DTYPES:
    TABLE[("fp8_current", "gemm", _out)] = _PER_TENSOR
    TABLE[("fp8_delayed", "gemm", _out)] = _PER_TENSOR
    TABLE[("fp8_block", "gemm", _out)] = _BLOCKWISE
    TABLE[("mxfp8", "gemm", _out)] = _FP32_ACC
    TABLE[("nvfp4", "gemm", _out)] = _FP32_ACC


def lookup(scheme: str, op: str, out_dtype: str) -> GemmTolerance:
    """The table row for (scheme, op, out_dtype); KeyError naming the key when there is none."""
    key = (scheme, op, out_dtype)
    try:
        return TABLE[key]
    except KeyError:
        raise KeyError(
            f"no tolerance for (scheme, op, out_dtype) = {key}: add a row to harness/tolerance.py TABLE "
            f"(known: {sorted(TABLE)[:3]} ... {len(TABLE)} rows)"
        ) from None


def unit_roundoff(out_dtype: str) -> tuple[float, float]:
    """(u_out, tiny_out): half the machine epsilon and the smallest subnormal of the out dtype."""
    fi = torch.finfo(_TORCH[out_dtype])
    return float(fi.eps) / 2, float(fi.smallest_normal) * float(fi.eps)


def _dequantized(q, orientation: str) -> torch.Tensor:
    """A consumed copy as its logical fp64 tensor (QuantizedTensor -> reference.dequantize)."""
    if isinstance(q, torch.Tensor):
        return q.to(torch.float64)
    import reference  # noqa: PLC0415 - only when QuantizedTensors are passed

    return reference.dequantize(q, orientation, torch.float32).to(torch.float64)  # on q's own device


def abs_product_sum(case: Case, a, b) -> torch.Tensor:
    """S[m, n] = Σ_k |â|·|b̂| (fp64) in the case's layout; a, b dequantized tensors in their logical
    shapes (TN: [M, K], [N, K]; NN: [M, K], [K, N]; NT: [K, M], [K, N]) or QuantizedTensors."""
    ca, cb = case.consumed
    a64 = _dequantized(a, ca).abs()
    b64 = _dequantized(b, cb).abs().to(a64.device)
    a64 = torch.nan_to_num(a64, nan=0.0, posinf=0.0)
    b64 = torch.nan_to_num(b64, nan=0.0, posinf=0.0)
    if case.layout == "TN":
        return a64 @ b64.t()
    if case.layout == "NN":
        return a64 @ b64
    return a64.t() @ b64


def gemm_bound(case: Case, a, b, golden: torch.Tensor | None = None, *, bias=None, c=None) -> torch.Tensor:
    """Per-element bound [M, N] (fp64) on |candidate − golden| for a tolerance-mode GEMM case.

    `a`, `b`: the consumed operands (QuantizedTensors or their dequantized logical tensors);
    `golden`: the golden output (|y_g|; without it S + |bias| + |C| stands in); bias [N] / c [M, N]
    when the case has them. Raises KeyError for a (scheme, "gemm", out_dtype) without a row.
    """
    tol = lookup(case.config.scheme, "gemm", case.out_dtype)
    u_out, tiny = unit_roundoff(case.out_dtype)
    k = case.shape[2]
    s = abs_product_sum(case, a, b)
    s_y = s.clone()
    if bias is not None:
        s_y = s_y + bias.to(s.device, torch.float64).abs().unsqueeze(0)
    if golden is not None:
        y = golden.to(s.device, torch.float64).abs()
    else:
        y = s_y + (c.to(s.device, torch.float64).abs() if c is not None else 0.0)
    y = torch.nan_to_num(y, nan=0.0, posinf=0.0)
    gamma = tol.gamma(k, case.layout)
    bound = gamma * s + u_out * 2 * y
    if case.accumulate:
        bound = bound + u_out * s_y
    return SAFETY * bound + 2 * tiny


# ---- GEMM epilogues (docs/numerics.md §12.2) ----------------------------------------------------
# Derivation (per output element; pre = the fp32 epilogue input RN(α·AB + β·C + bias), z = the dGELU
# aux input, t = tanh(k (z + c z³)), G(z) = 0.5 + |z|·k·(1 + 3c z²) ≥ |∂GELU'/∂t|):
#  * the candidate's pre differs from the golden's by at most B_pre = gemm_bound(case, a, b, pre) (the
#    plain GEMM bound, out-dtype allowances included: conservative for an fp32 value);
#  * GELU: |GELU'| ≤ GELU_SLOPE_MAX carries B_pre through; a tanh with relative error TANH_REL (PTX
#    tanh.approx.f32, the fastest form a kernel may use) moves GELU by ≤ 0.5·|pre|·TANH_REL, and the
#    remaining fp32 arithmetic by ≤ FORMULA_ROUNDS·u_32·|pre|;
#  * dGELU: out = pre·GELU'(z): |GELU'(z)|·B_pre, plus |pre|·(TANH_REL·G(z) + FORMULA_ROUNDS·u_32·(1 + G(z)));
#  * bias gradient: a K-term fp32 sum in any order: K·u_32·Σ_k |b̂[n, k]| (recursive summation);
#  * then each output is rounded once to the out dtype (u_out·|y| on each side) and SAFETY applies.
TANH_REL = 2.0**-10.987  # PTX ISA: tanh.approx.f32 maximum relative error
GELU_SLOPE_MAX = 1.13  # max over z of |GELU'(z)| for the tanh approximation (1.1289 near z = 2.42)
FORMULA_ROUNDS = 16  # fp32 roundings allowed in evaluating the GELU / GELU' formula


def _out_terms(case: Case, golden: torch.Tensor, device) -> torch.Tensor:
    u_out, tiny = unit_roundoff(case.out_dtype)
    y = torch.nan_to_num(golden.to(device, torch.float64).abs(), nan=0.0, posinf=0.0)
    return u_out * 2 * y + 2 * tiny


def epilogue_bound(case: Case, a, b, golden: torch.Tensor, *, pre: torch.Tensor, aux: torch.Tensor | None = None,
                   bias=None, c=None) -> torch.Tensor:
    """Per-element bound [M, N] on |candidate − golden| of a gelu_aux or dgelu epilogue output (see above).

    `pre` is the golden fp32 epilogue input; `aux` the dgelu pre-activation input."""
    from reference.gemm import GELU_C, GELU_K, dgelu  # noqa: PLC0415

    b_pre = gemm_bound(case, a, b, pre, bias=bias, c=c)
    p = torch.nan_to_num(pre.to(b_pre.device, torch.float64).abs(), nan=0.0, posinf=0.0)
    if case.epilogue == "gelu_aux":
        bound = GELU_SLOPE_MAX * b_pre + p * (0.5 * TANH_REL + FORMULA_ROUNDS * U32)
    elif case.epilogue == "dgelu":
        z = aux.to(b_pre.device, torch.float64)
        g = 0.5 + z.abs() * GELU_K * (1 + 3 * GELU_C * z * z)
        bound = dgelu(z).abs() * b_pre + p * (TANH_REL * g + FORMULA_ROUNDS * U32 * (1 + g))
    else:
        raise ValueError(f"epilogue_bound: epilogue {case.epilogue!r} has no transcendental output")
    return SAFETY * bound + _out_terms(case, golden, b_pre.device)


def bgrad_bound(case: Case, b_abs_row_sums: torch.Tensor, golden: torch.Tensor) -> torch.Tensor:
    """Bound [N] on |candidate − golden| of the bias gradient; `b_abs_row_sums` = Σ_k |b̂[n, k]| (fp64)."""
    k = case.shape[2]
    s = b_abs_row_sums.to(torch.float64)
    return SAFETY * (k * U32 * s) + _out_terms(case, golden, s.device)
