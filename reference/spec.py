"""The spec rules: what input a quantize, dequantize or GEMM accepts, one function and one message per rule.

Source: docs/design.md §3 (errors: SpecViolation for input that breaks the spec, naming what was
expected and what was given), docs/numerics.md §0.1 (a tensor [..., K] is a 2-D [M, K]), §3 / §5.5
(no partial blocks), §5.6 (RHT needs bfloat16), §5.7 (stochastic rounding needs a seed), §6 (GEMM
operands, no 2-D x 2-D fp8_block). The reference, the native backend and the case generator all
call these functions, so the same bad input raises the same exception with the same message
everywhere. The `*_rule` functions take only names and shapes (no tensors): the case generator
uses them to exclude cases the spec forbids.
"""

from __future__ import annotations

import math

import torch

from .formats import ORIENTATIONS, SCHEMES, QuantConfig
from .layouts import copy_geometry, gemm_layout
from .types import QuantizedTensor, SpecViolation, SRSeed

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_DTYPES = {name: dt for dt, name in DTYPE_NAMES.items()}
OUT_DTYPES = tuple(DTYPE_NAMES)  # GEMM and dequantize outputs


def dtype_name(dtype: torch.dtype) -> str:
    """The spelling of a torch dtype in cases, reports and messages ("bfloat16", "float64", ...)."""
    return DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


# ---- rules on names and shapes (the case generator's view) -----------------------------------


def quantize_rule(config: QuantConfig, shape: tuple[int, ...], dtype: str, *, what: str = "x") -> None:
    """The quantize rules that depend only on (config, shape, dtype name); SpecViolation if broken."""
    sch = config.scheme_row
    if dtype not in sch.input_dtypes:
        raise SpecViolation(f"{config.scheme}: input dtype {dtype} is not allowed; expected one of {sch.input_dtypes}",
                            rule="dtype")
    if config.rht and dtype != "bfloat16":
        raise SpecViolation(f"{config.id}: RHT needs a bfloat16 input (docs/numerics.md §5.6), got {dtype}", rule="rht")
    if len(shape) == 0:
        raise SpecViolation(f"{config.scheme}: a 0-d tensor cannot be quantized; expected [..., K]", rule="shape")
    if math.prod(shape) == 0:
        raise SpecViolation(f"{config.scheme}: empty tensor of shape {tuple(shape)} cannot be quantized", rule="shape")
    if not sch.partial_tiles:
        blk = config.block
        m, k = math.prod(shape[:-1]), shape[-1]
        for dim_name, n in (("M", m), ("K", k)):
            if n % blk:
                # NUMERICS: §3 / §5.5 - no partial blocks for mxfp8 and nvfp4.
                raise SpecViolation(
                    f"{config.id}: {what} {dim_name}={n} (shape {tuple(shape)}) is not a multiple of {blk}; "
                    f"{config.scheme} does not support partial blocks (docs/numerics.md §3/§5.5)",
                    rule="shape",
                )


def copies_rule(config: QuantConfig, *, rowwise: bool, colwise: bool) -> None:
    """The copies a config can produce; SpecViolation if a requested one does not exist."""
    if colwise and config.variant == "row_scaled_4over6":
        # NUMERICS: §5.10 - TE's check: the 4over6 kernel does not consume per-column amaxes.
        raise SpecViolation(
            f"{config.id}: row-scaled 4over6 has no columnwise copy (TE's check; docs/numerics.md §5.10); "
            "quantize with colwise=False",
            rule="copies",
        )


def gemm_rule(a: QuantConfig, b: QuantConfig, layout: str) -> None:
    """The GEMM rules that depend only on the two configs and the layout; SpecViolation if broken."""
    lay = gemm_layout(layout)
    if a.scheme != b.scheme:
        raise SpecViolation(
            f"a.config.scheme={a.scheme!r} and b.config.scheme={b.scheme!r} differ: a GEMM takes one scheme",
            rule="gemm",
        )
    if a.block != b.block:
        raise SpecViolation(f"K block mismatch: a.config.tile={a.tile}, b.config.tile={b.tile}", rule="gemm")
    if a.is_2d and b.is_2d and not a.scheme_row.gemm_2d_x_2d:
        # NUMERICS: §4 / §6 - a 2-D x 2-D blockwise GEMM is not allowed (cuBLASLt rejects it).
        raise SpecViolation(
            f"a.config.tile={a.tile} and b.config.tile={b.tile}: a 2-D x 2-D {a.scheme} GEMM is not allowed "
            "(docs/numerics.md §6)",
            rule="gemm",
        )
    if a.element == b.element == "e5m2" and a.scheme_row.scale_format == "fp32" and not a.scheme_row.per_tensor:
        # NUMERICS: §12.2 - cuBLASLt's fp32-block-scaled FP8 GEMMs (VEC128_32F, BLK128x128_32F) take
        # e4m3 x e4m3, e4m3 x e5m2 and e5m2 x e4m3, never e5m2 x e5m2.
        raise SpecViolation(f"a and b are both e5m2: a {a.scheme} GEMM takes at most one e5m2 operand "
                            "(docs/numerics.md §12.2)", rule="gemm")
    rht_a, rht_b = a.rht and lay.a == "colwise", b.rht and lay.b == "colwise"  # NUMERICS: §5.6 colwise only
    if rht_a != rht_b:
        raise SpecViolation(
            f"a.config.rht={a.rht} ({lay.a}) and b.config.rht={b.rht} ({lay.b}): only one consumed "
            "copy is in the Hadamard domain, so the product is meaningless (RHT is for the wgrad NT GEMM, both colwise)",
            rule="gemm",
        )


# ---- rules on tensors -------------------------------------------------------------------------


def check_orientation(orientation: str) -> None:
    if orientation not in ORIENTATIONS:
        raise SpecViolation(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")


def check_quantize(
    x: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
) -> tuple[torch.Tensor, SRSeed | None]:
    """Validate a quantize call; return x as a contiguous 2-D [M, K] tensor and the SR seed."""
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
    if not isinstance(x, torch.Tensor):
        raise SpecViolation(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not (rowwise or colwise):
        raise SpecViolation("quantize needs rowwise=True or colwise=True; both were False")
    quantize_rule(config, tuple(x.shape), dtype_name(x.dtype))
    copies_rule(config, rowwise=rowwise, colwise=colwise)
    seed = SRSeed.coerce(rng)
    if config.stochastic and seed is None:
        raise SpecViolation(f"{config.id}: stochastic rounding needs rng=(seed, stream) (docs/numerics.md §5.7)")
    # NUMERICS: §0.1 - leading dims flatten into M; a 1-D input is [1, K].
    return x.reshape(-1, x.shape[-1]).contiguous(), seed


def check_given_amax(amax: object, config: QuantConfig) -> torch.Tensor:
    """Validate a given amax (TE's quantize_with_amax; docs/numerics.md §1, §5.1): a float32 tensor of
    shape [] or [1], >= 0 (+inf allowed, NaN not; the value is checked for a host tensor only), for a scheme
    that takes one and a copy that uses amax(X). Returns it as fp32 [1]."""
    if not config.scheme_row.given_amax:
        takers = ", ".join(s.name for s in SCHEMES.values() if s.given_amax)
        raise SpecViolation(f"{config.id}: a given amax exists only for {takers} (docs/numerics.md §1, §5.1)",
                            rule="amax")
    if config.convention != "te":
        raise SpecViolation(f"{config.id}: a given amax is defined for convention 'te' only", rule="amax")
    if config.rht:
        raise SpecViolation(f"{config.id}: a given amax does not apply with RHT: the columnwise A_g is the "
                            "post-RHT amax (docs/numerics.md §5.6)", rule="amax")
    if config.row_scaled:
        raise SpecViolation(f"{config.id}: row-scaled NVFP4 takes no given or reduced amax: its A_g is one "
                            "amax per row (TE's check; docs/numerics.md §5.10)", rule="amax")
    if not isinstance(amax, torch.Tensor):
        raise SpecViolation(f"amax must be a torch.Tensor, got {type(amax).__name__}", rule="amax")
    if tuple(amax.shape) not in ((), (1,)):
        raise SpecViolation(f"amax has shape {tuple(amax.shape)}, expected [] or [1] (one tensor amax)", rule="amax")
    if amax.dtype != torch.float32:
        raise SpecViolation(f"amax has dtype {amax.dtype}, expected torch.float32", rule="amax")
    if amax.device.type != "cpu":
        # docs/numerics.md §5.1: a device amax is taken as given; reading its value back would synchronize the
        # stream on every call (the native NVFP4 given-amax path lost half its throughput to it).
        return amax.reshape(1)
    v = float(amax.reshape(()))
    if math.isnan(v) or v < 0 or (v == 0 and math.copysign(1.0, v) < 0):
        raise SpecViolation(f"amax = {v!r} is invalid: an amax is >= +0 (NaN and negatives are not amaxes; "
                            "docs/numerics.md §0.1)", rule="amax")
    return amax.reshape(1)


def reduce_amax(shard_amaxes) -> torch.Tensor:
    """The amax of a tensor sharded over ranks: the max of the shards' amaxes (TE's with_amax_reduction).

    NUMERICS: §0.1 - amax is exact in any order, so max over shards = amax of the whole tensor.
    Each shard amax is checked as a given amax would be (shape [] or [1], fp32, >= 0).
    """
    items = list(shard_amaxes)
    if not items:
        raise SpecViolation("reduce_amax needs at least one shard amax, got none", rule="amax")
    for i, a in enumerate(items):
        if not isinstance(a, torch.Tensor) or a.dtype != torch.float32 or tuple(a.shape) not in ((), (1,)):
            got = (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
            raise SpecViolation(f"shard amax {i} must be a float32 tensor of shape [] or [1], got {got}", rule="amax")
        v = float(a.reshape(()))
        if math.isnan(v) or v < 0:
            raise SpecViolation(f"shard amax {i} = {v!r} is invalid: an amax is >= 0", rule="amax")
    dev = items[0].device
    return torch.stack([a.reshape(()).to(dev) for a in items]).amax().reshape(1)


def _tensor_field(q: QuantizedTensor, fld: str, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                  why: str) -> torch.Tensor:
    t = getattr(q, fld, None)
    if t is None:
        raise SpecViolation(f"{name}.{fld} is None: {why}")
    if not isinstance(t, torch.Tensor):
        raise SpecViolation(f"{name}.{fld} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise SpecViolation(
            f"{name}.{fld} has shape {tuple(t.shape)}, expected {tuple(shape)} for {q.config.id} "
            f"logical [{q.m}, {q.k}] (reference.layouts.copy_geometry)"
        )
    if t.dtype != dtype:
        raise SpecViolation(f"{name}.{fld} has dtype {t.dtype}, expected {dtype} for {q.config.id}")
    return t


def check_quantized(q: QuantizedTensor, orientation: str, *, name: str = "q", why: str | None = None) -> None:
    """Validate a QuantizedTensor handed back in: the `orientation` copy's fields are present, with the
    shapes and dtypes of its `CopyGeometry`, data and scales on one device. SpecViolation naming the field otherwise."""
    if not isinstance(q, QuantizedTensor):
        raise SpecViolation(f"{name} must be a QuantizedTensor, got {type(q).__name__}")
    check_orientation(orientation)
    if not isinstance(q.config, QuantConfig):
        raise SpecViolation(f"{name}.config must be a QuantConfig, got {type(q.config).__name__}")
    shape = q.shape
    if (not isinstance(shape, tuple) or len(shape) == 0
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise SpecViolation(f"{name}.shape={shape!r} is invalid: expected a non-empty tuple of positive ints")
    if q.hp_dtype not in q.config.scheme_row.input_dtypes:
        raise SpecViolation(
            f"{name}.hp_dtype={q.hp_dtype!r} is invalid: expected one of {q.config.scheme_row.input_dtypes}"
        )
    g = copy_geometry(q.config, orientation, q.m, q.k)
    why = why or f"this QuantizedTensor has no {orientation} copy (quantize with {orientation}=True)"
    data = _tensor_field(q, f"{orientation}_data", name, g.data_shape, torch.uint8, why)
    scale = _tensor_field(q, f"{orientation}_scale", name, g.scale_padded_shape, g.scale_dtype, why)
    amax_field = f"{orientation}_amax"
    if g.amax_shape is not None and (g.scheme.global_amax or getattr(q, amax_field) is not None):
        # NUMERICS: §5.2 the NVFP4 global amax is consumed (S_dec, alpha); a per-tensor amax is informational.
        _tensor_field(q, amax_field, name, g.amax_shape, torch.float32, why)
    if data.device != scale.device:
        raise SpecViolation(
            f"{name}.{orientation}_data is on {data.device} and {name}.{orientation}_scale on {scale.device}: "
            "a copy's data and scales must share one device"
        )


def check_dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> None:
    """Validate a dequantize call (the copy, then the output dtype)."""
    check_orientation(orientation)
    if isinstance(q, QuantizedTensor) and not q.has(orientation):
        raise SpecViolation(f"this QuantizedTensor has no {orientation} copy (quantize with {orientation}=True)")
    check_quantized(q, orientation)
    if dtype not in OUT_DTYPES:
        raise SpecViolation(f"dtype={dtype} is invalid: expected float32, bfloat16 or float16")


def check_gemm(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    layout: str = "TN",
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
) -> tuple[int, int, int]:
    """Validate a GEMM call: both consumed copies well formed, one scheme, matching K, the §6 rules,
    bias [N] and c [M, N] in an output dtype. Returns (M, N, K)."""
    lay = gemm_layout(layout)
    for nm, q in (("a", a), ("b", b)):
        if not isinstance(q, QuantizedTensor):
            raise SpecViolation(f"{nm} must be a QuantizedTensor, got {type(q).__name__}")
    for nm, q, o in (("a", a, lay.a), ("b", b, lay.b)):
        check_quantized(q, o, name=nm, why=f"layout {layout} consumes {nm}'s {o} copy (quantize it with {o}=True)")
    # The consumed K is the copy's block axis: K of a rowwise copy, M of a colwise one.
    m, ka = (a.m, a.k) if lay.a == "rowwise" else (a.k, a.m)
    n, kb = (b.m, b.k) if lay.b == "rowwise" else (b.k, b.m)
    gemm_rule(a.config, b.config, layout)
    if ka != kb:
        raise SpecViolation(
            f"K mismatch for layout {layout}: a (logical {tuple(a.shape)}, {lay.a}) has K={ka}, "
            f"b (logical {tuple(b.shape)}, {lay.b}) has K={kb}"
        )
    if out_dtype not in OUT_DTYPES:
        raise SpecViolation(f"out_dtype={out_dtype} is invalid: expected one of {OUT_DTYPES}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,) or bias.dtype not in OUT_DTYPES):
        got = (tuple(bias.shape), bias.dtype) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise SpecViolation(f"bias must be a float32/bfloat16/float16 tensor of shape [N] = [{n}], got {got}")
    if c is not None and (not isinstance(c, torch.Tensor) or tuple(c.shape) != (m, n) or c.dtype not in OUT_DTYPES):
        got = (tuple(c.shape), c.dtype) if isinstance(c, torch.Tensor) else type(c).__name__
        raise SpecViolation(f"c must be a float32/bfloat16/float16 tensor of shape [M, N] = [{m}, {n}], got {got}")
    return m, n, ka
