"""Build a contract `QuantizedTensor` from a library's natural outputs (docs/adapters.md §2, §8).

An adapter around a library gets codes as float8 tensors or packed bytes, scales one per block in the
layout the library computed them in, and NVFP4's second level as a global scale, an amax or a decode
factor. These helpers map each onto the contract's stored fields, asking `reference.layouts.copy_geometry`
for every shape and dtype, so no adapter pads, transposes or packs by hand:

    q = build.empty(config, x)
    build.put_copy(q, "rowwise", data=codes_fp8, scale=e8m0_bytes)          # pads, orients, checks shapes
    build.put_copy(q, "colwise", data=codes_of_xt, scale=scales_of_xt)      # what the library gave for X^T

`by` says how the library's codes and scales are indexed:
- `"source"` (default): as the library returns them when it quantizes the matrix the copy is built from,
  X for the rowwise copy and Xᵀ for the colwise copy, with blocks along its rows: codes [rows, cols] of
  that matrix, scales [rows, cols/B] (a 2-D tile-scaled scheme, fp8_block 128×128: the tile grid
  [rows/b, cols/b]).
- `"logical"`: indexed in X's own [M, K] coordinates whatever the copy: codes [M, K], rowwise scales
  [M, K/B], colwise scales [M/B, K] (blocks along M). Use it when the library quantizes X along dim 0,
  or to reuse the rowwise codes of a per-tensor or 2-D copy as its transposed colwise copy.
The helpers then transpose to the contract's orientation (the colwise copy is stored [K, ...] except
MXFP8's, whose data stays [M, K]; blockwise 1×128 rowwise scales are stored [K/128, M]) and zero-pad the
scales to the compact padded shape (`q.extra["zero_fills_padding"]` is set).

Every conversion is exact or raises ValueError: nothing is silently rounded.
"""

from __future__ import annotations

from typing import Callable

import torch

from reference import QuantConfig, QuantizedTensor
from reference.layouts import CopyGeometry, copy_geometry

__all__ = [
    "empty", "two_d", "geometry", "codes", "scales", "e8m0_bytes", "e4m3_bytes", "global_amax", "put_copy",
    "E2M1_GLOBAL",
]

E2M1_GLOBAL = 2688.0  # 6 · 448: S_enc = 2688 / A_g (docs/numerics.md §5.1)
_FP8_VIEWS = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu") if hasattr(torch, n))


def two_d(x: torch.Tensor) -> torch.Tensor:
    """x viewed as the contract's [M, K] (docs/numerics.md §0.1), contiguous."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def empty(config: QuantConfig, x: torch.Tensor) -> QuantizedTensor:
    """A `QuantizedTensor` for input `x` with no copy filled yet."""
    return QuantizedTensor(config=config, shape=tuple(x.shape), hp_dtype=str(x.dtype).removeprefix("torch."))


def geometry(q_or_config, orientation: str, m: int | None = None, k: int | None = None) -> CopyGeometry:
    """`copy_geometry` of a `QuantizedTensor`'s copy, or of (config, orientation, m, k)."""
    if isinstance(q_or_config, QuantizedTensor):
        return copy_geometry(q_or_config.config, orientation, q_or_config.m, q_or_config.k)
    return copy_geometry(q_or_config, orientation, m, k)


def _check_by(by: str) -> None:
    if by not in ("source", "logical"):
        raise ValueError(f"by={by!r} is invalid: expected 'source' or 'logical'")


def _to_stored(t: torch.Tensor, g: CopyGeometry, by: str) -> torch.Tensor:
    """A [rows, cols]-indexed tensor of the copy's source (or of X, `by='logical'`) in stored data coordinates."""
    _check_by(by)
    if g.orientation == "rowwise":
        return t
    if by == "source":  # indexed like X^T
        return t if g.transposed else t.t()
    return t.t() if g.transposed else t  # indexed like X


def _pack_e2m1(c: torch.Tensor) -> torch.Tensor:
    """Unpacked 4-bit codes [r, 2n] -> bytes [r, n], element 2j in the low nibble (docs/numerics.md §5.4)."""
    if bool((c > 0xF).any()):
        raise ValueError("unpacked E2M1 codes must be 0..15 (sign in bit 3)")
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def codes(data: torch.Tensor, g: CopyGeometry, *, by: str = "source", nibbles: str = "low_first") -> torch.Tensor:
    """The contract's data bytes of copy `g` (uint8, `g.data_shape`).

    `data`: FP8 codes as a float8 tensor or their uint8 bytes; E2M1 codes packed two per byte (uint8 or
    `float4_e2m1fn_x2`), `nibbles='low_first'` (element 2j in the low nibble, the contract's order, §5.9)
    or `'high_first'`, or unpacked, one 4-bit code per uint8 with the copy's full column count. Packed
    E2M1 bytes cannot be transposed, so they must come `by='source'` for a transposed copy.
    """
    if nibbles not in ("low_first", "high_first"):
        raise ValueError(f"nibbles={nibbles!r} is invalid: expected 'low_first' or 'high_first'")
    t = data.reshape(-1, data.shape[-1]) if data.dim() != 2 else data
    if t.dtype in _FP8_VIEWS or str(t.dtype) == "torch.float4_e2m1fn_x2":
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise ValueError(f"codes must be float8 / float4_e2m1fn_x2 or uint8 bytes, not {t.dtype}")
    per_byte = g.codes_per_byte
    if per_byte == 2:
        unpacked = (g.rows, g.cols) if by == "source" or g.orientation == "rowwise" else (g.cols, g.rows)
        if tuple(t.shape) == unpacked:  # one code per byte: pack (transposing first if needed)
            return _pack_e2m1(_to_stored(t, g, by).contiguous())
        if by == "logical" and g.transposed:
            raise ValueError("packed E2M1 bytes of X cannot be transposed into the colwise copy: pass the "
                             "library's codes of X^T with by='source', or unpacked codes")
        if nibbles == "high_first":
            t = ((t & 0xF) << 4) | (t >> 4)
    else:
        t = _to_stored(t, g, by)
    if tuple(t.shape) != tuple(g.data_shape):
        raise ValueError(f"{g.orientation} codes: got shape {tuple(t.shape)} (by={by!r}), the contract's "
                         f"{g.config.id} copy is {tuple(g.data_shape)}")
    return t.contiguous()


def e8m0_bytes(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scale bytes from the forms libraries use: `float8_e8m0fnu` or uint8 (biased exponents, as they
    are), a signed integer tensor (unbiased exponents e -> e + 127), or a float tensor of powers of two
    2^e (e in [-127, 127]; anything else raises ValueError)."""
    if s.dtype in _FP8_VIEWS:
        if s.dtype != getattr(torch, "float8_e8m0fnu", None):
            raise ValueError(f"an E8M0 scale given as {s.dtype} is ambiguous: give uint8 biased exponents")
        return s.view(torch.uint8)
    if s.dtype == torch.uint8:
        return s
    if not s.dtype.is_floating_point:
        e = s.to(torch.int64)
        if bool(((e < -127) | (e > 128)).any()):
            raise ValueError("unbiased E8M0 exponents must lie in [-127, 128]")
        return (e + 127).to(torch.uint8)
    f = s.to(torch.float64)
    m, e = torch.frexp(f)  # f = m · 2^e, m in [0.5, 1)
    ok = (m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)
    if not bool(ok.all()):
        bad = f[~ok].flatten()[0].item()
        raise ValueError(f"E8M0 scale {bad!r} is not a power of two in [2^-127, 2^127]")
    return (e - 1 + 127).to(torch.uint8)


def e4m3_bytes(s: torch.Tensor) -> torch.Tensor:
    """E4M3 scale bytes: a `float8_e4m3fn` tensor or uint8 bytes as they are; a float tensor must hold
    E4M3 values exactly (its cast back is bit-equal, NaN included), else ValueError."""
    if s.dtype == torch.float8_e4m3fn:
        return s.view(torch.uint8)
    if s.dtype == torch.uint8:
        return s
    if not s.dtype.is_floating_point or s.dtype in _FP8_VIEWS:
        raise ValueError(f"an E4M3 scale given as {s.dtype} is ambiguous: give float8_e4m3fn or uint8 bytes")
    c = s.to(torch.float8_e4m3fn)
    back = c.to(torch.float64)
    same = (back == s.to(torch.float64)) | (torch.isnan(back) & torch.isnan(s))
    if not bool(same.all()):
        bad = s[~same].flatten()[0].item()
        raise ValueError(f"scale {bad!r} is not an E4M3 value: the library's scale was not cast to E4M3")
    return c.view(torch.uint8)


def _fp32_exact(s: torch.Tensor, what: str) -> torch.Tensor:
    out = s.to(torch.float32)
    if s.dtype == torch.float64:
        same = (out.to(torch.float64) == s) | (torch.isnan(out) & torch.isnan(s))
        if not bool(same.all()):
            raise ValueError(f"{what} {s[~same].flatten()[0].item()!r} is not an fp32 value")
    return out


def scales(s: torch.Tensor, g: CopyGeometry, *, by: str = "source", kind: str = "decode") -> torch.Tensor:
    """The contract's compact scale tensor of copy `g`: oriented, converted exactly, zero-padded.

    `s` is one entry per scale block, indexed as `by` says (module docstring). Per-tensor schemes take
    one element. E8M0 (MXFP8) goes through `e8m0_bytes`, E4M3 (NVFP4 block scales) through `e4m3_bytes`;
    fp32 scales (per-tensor FP8, fp8_block) are the decode scale sinv: `kind='decode'` takes `s` as it is
    (exactly; a bf16 scale widens exactly), `kind='encode'` stores torch.reciprocal(s) (a library storing
    the encode scale s, as torchao's float8). A 16×16 NVFP4 tile grid [rows/16, cols/16] is repeated on
    each row of its tile, as the contract stores it (§5.5).
    """
    if kind not in ("decode", "encode"):
        raise ValueError(f"kind={kind!r} is invalid: expected 'decode' or 'encode'")
    if g.scale_dtype == torch.float32:
        v = _fp32_exact(s.detach(), "scale")
        if kind == "encode":
            v = torch.reciprocal(v)
    else:
        if kind != "decode":
            raise ValueError(f"{g.config.scheme} scales are stored as decode scales: kind='encode' does not apply")
        v = e8m0_bytes(s) if g.config.scheme == "mxfp8" else e4m3_bytes(s)
    if g.per_tensor:
        if v.numel() != 1:
            raise ValueError(f"a per-tensor scale has one element, got shape {tuple(s.shape)}")
        return v.reshape(1).clone()
    v = v.reshape(-1, v.shape[-1]) if v.dim() != 2 else v
    if by == "logical" and g.config.is_2d and g.scale_block == g.block:  # tile grid of X
        v = v.t() if g.transposed else v
    else:
        v = _to_stored(v, g, by)
    sb, b = g.scale_block, g.block[0]
    if g.config.is_2d and sb != g.block:  # a tile grid, stored on each row (column) of its tile
        if sb == (1, b) and v.shape[0] * b == g.rows:
            v = v.repeat_interleave(b, dim=0)
        elif sb == (b, 1) and v.shape[1] * b == g.cols:
            v = v.repeat_interleave(b, dim=1)
    if g.block_major:
        v = v.t()
    if tuple(v.shape) != tuple(g.scale_valid_shape):
        raise ValueError(f"{g.orientation} scales: got {tuple(s.shape)} (by={by!r}), giving {tuple(v.shape)}; "
                         f"the contract's {g.config.id} copy has {tuple(g.scale_valid_shape)} valid entries")
    out = torch.zeros(g.scale_padded_shape, dtype=g.scale_dtype, device=v.device)
    out[: v.shape[0], : v.shape[1]] = v
    return out


def _true_div(num: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: torch.div(torch.full_like(a, num), a)


def _recover(target: torch.Tensor, guess: torch.Tensor, forward, what: str, dtype, span: int = 6) -> torch.Tensor:
    """The one fp32 A near `guess` with forward(A) bit-equal to `target`, per element; ValueError otherwise."""
    out = torch.empty_like(target)
    tb, gb = target.reshape(-1), guess.reshape(-1)
    for i in range(tb.numel()):
        t = tb[i : i + 1]
        if not bool(torch.isfinite(t)) or float(t) <= 0:
            raise ValueError(f"{what} {float(t)!r}: A_g is not recoverable from a zero, negative or non-finite value")
        bits = gb[i : i + 1].view(torch.int32) + torch.arange(-span, span + 1, dtype=torch.int32)
        cand = bits[bits >= 0].view(torch.float32)
        cand = cand[torch.isfinite(cand)]
        if dtype is not None:
            cand = cand[cand.to(dtype).to(torch.float32) == cand].unique()
        hit = cand[forward(cand).view(torch.int32) == t.view(torch.int32)]
        if hit.numel() != 1:
            how = "no fp32 amax gives it" if hit.numel() == 0 else (
                f"{hit.numel()} fp32 amaxes give it ({hit.min().item()!r} .. {hit.max().item()!r})")
            raise ValueError(f"{what} {float(t)!r}: A_g is not recoverable exactly, {how}; pass amax= (the "
                             f"library's own amax) instead" + ("" if dtype is not None else
                                                               ", or amax_dtype= if the amax was taken in bf16/fp16"))
        out.view(-1)[i] = hit[0]
    return out


def global_amax(*, amax: torch.Tensor | None = None, global_scale: torch.Tensor | None = None,
                decode_scale: torch.Tensor | None = None, forward: Callable | None = None,
                amax_dtype: torch.dtype | None = None) -> torch.Tensor:
    """NVFP4's A_g (fp32, flattened to [n]: [1], or one per row when row-scaled) from one of:

    - `amax`: taken as it is (a bf16/fp16 amax widens exactly; an fp64 one must be an fp32 value);
    - `global_scale` (TE's / ModelOpt's / compressed-tensors' "global_scale", S = 2688 / A_g), or
    - `decode_scale` (A_g / 2688: torchao's per_tensor_scale, ModelOpt's weights_scaling_factor_2).

    The last two are not injective: two fp32 amaxes can round to one value (RN(A/2688) often does, e.g.
    A = 1.5 and nextafter(1.5); RN(2688/A) less often), so A_g is returned only where exactly one fp32 A near the quotient maps to
    the given value under `forward` (default: the fp32 true division RN(2688 / A), resp. RN(A / 2688);
    pass the library's own expression if it computes it otherwise, e.g. `lambda a: 2688 * (1 / a)`).
    `amax_dtype` restricts the candidates to that dtype's values (an amax the library took in bf16),
    which usually makes the answer unique. Otherwise ValueError: pass the library's amax instead.
    """
    given = [v is not None for v in (amax, global_scale, decode_scale)]
    if sum(given) != 1:
        raise ValueError("give exactly one of amax=, global_scale=, decode_scale=")
    if amax is not None:
        return _fp32_exact(amax.detach(), "amax").reshape(-1).clone()
    if global_scale is not None:
        s = _fp32_exact(global_scale.detach(), "global_scale").reshape(-1)
        guess = (E2M1_GLOBAL / s.to(torch.float64)).to(torch.float32)
        return _recover(s, guess, forward or _true_div(E2M1_GLOBAL), "global_scale", amax_dtype)
    d = _fp32_exact(decode_scale.detach(), "decode_scale").reshape(-1)
    guess = (d.to(torch.float64) * E2M1_GLOBAL).to(torch.float32)
    fwd = forward or (lambda a: torch.div(a, torch.full_like(a, E2M1_GLOBAL)))
    return _recover(d, guess, fwd, "decode_scale", amax_dtype)


def put_copy(q: QuantizedTensor, orientation: str, *, data: torch.Tensor, scale: torch.Tensor,
             amax: torch.Tensor | None = None, global_scale: torch.Tensor | None = None,
             decode_scale: torch.Tensor | None = None, by: str = "source", nibbles: str = "low_first",
             kind: str = "decode", forward: Callable | None = None,
             amax_dtype: torch.dtype | None = None) -> QuantizedTensor:
    """Fill one copy of `q` from a library's outputs: `codes(data)`, `scales(scale)` and, where the scheme
    stores one, the fp32 amax (per-tensor FP8: `amax`; NVFP4: `global_amax(amax= | global_scale= |
    decode_scale=)`). Sets `q.extra["zero_fills_padding"]`. Returns `q`."""
    g = geometry(q, orientation)
    setattr(q, f"{orientation}_data", codes(data, g, by=by, nibbles=nibbles))
    setattr(q, f"{orientation}_scale", scales(scale, g, by=by, kind=kind))
    if g.amax_shape is not None:
        if g.config.scheme == "nvfp4":
            a = global_amax(amax=amax, global_scale=global_scale, decode_scale=decode_scale, forward=forward,
                            amax_dtype=amax_dtype)
        elif amax is not None:
            a = _fp32_exact(amax.detach(), "amax").reshape(-1).clone()
        else:
            raise ValueError(f"the {g.config.scheme} copy stores its amax: pass amax=")
        if tuple(a.shape) != tuple(g.amax_shape):
            raise ValueError(f"{orientation} amax: got {tuple(a.shape)} values, the copy stores {tuple(g.amax_shape)}")
        setattr(q, f"{orientation}_amax", a.to(getattr(q, f"{orientation}_data").device))
    q.extra["zero_fills_padding"] = True
    return q
