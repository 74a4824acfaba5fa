"""torchao's MX, NVFP4 and float8 casts as harness backends (torchao 0.18; optional extra `[torchao]`).

    python -m harness run --tier smoke --backend harness.adapters.torchao:mx --device cpu --out reports/torchao_mx

Objects: `mx` (to_mx in the scale mode of the case's e8m0_rule: RCEIL for `ceil`, FLOOR for `floor`),
`mx_floor`, `mx_ceil`, `mx_even`, `mx_rceil` (one mode whatever the rule); `nvfp4` (NVFP4Tensor.to_nvfp4, two-level scaling); `float8` (hp_tensor_to_float8_dynamic,
tensorwise). Under a case whose config names a torchao convention (`torchao_floor`, ...,
`torchao_nvfp4`, `torchao_float8`) the adapter uses that mode, so the golden under the same convention
must match it bit for bit (docs/numerics.md §10.3-§10.6).

Layout conversions (torchao -> ours, docs/numerics.md §1, §3, §5.9):
- MX: data [M, K] fp8 and E8M0 scales [M, K/32] -> bytes, scales zero-padded to S_r; the colwise copy is
  to_mx of X^T ([K, M], scales [K, M/32]) transposed back to data [M, K] and S_c [M/32, K].
- NVFP4: packed data [M, K/2] (even element in the low nibble, as ours) and E4M3 scales [M, K/16] ->
  scales zero-padded; torchao's per_tensor_scale is A_g / 2688, so the copy's amax is the A_g the
  adapter passed (torch.max(|X|), as torchao's NVFP4 workflows compute it); the colwise copy is
  to_nvfp4 of X^T with the same per-tensor scale.
- float8: torchao stores the encode scale s and decodes by x / s; our layout stores sinv = RN(1 / s)
  (torch.reciprocal); amax = torchao's tensor_to_amax(X); the colwise copy is the transposed bytes.
`supports(case, device)` refuses other ops, schemes, tiles and input dtypes (float16 for MX and NVFP4)
before the golden runs; `conventions` names the catalogue rows each cast follows under a `te` config.
`q.extra["torchao"]` holds torchao's own scale tensors (E8M0 / E4M3 bytes as torchao laid them out,
the float8 `_scale`, the NVFP4 `per_tensor_scale`) for showing beside the contract's chain.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch

from reference import QuantConfig, QuantizedTensor, Unsupported

from . import build

PACKAGE = "torchao"
_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_MX_MODES = ("floor", "ceil", "even", "rceil")
# The ScaleCalculationMode nearest each e8m0_rule of docs/numerics.md §3: RCEIL is TE's ceil of
# amax / fp8_max (§10.4), FLOOR the OCP floor exponent (§10.3: equal to `floor` for finite normal amax).
# torchao's CEIL (ceil of log2 amax) and EVEN are no rule of ours.
RULE_MODES = {"ceil": "rceil", "floor": "floor"}


def version() -> str | None:
    """The installed torchao version, or None."""
    if importlib.util.find_spec(PACKAGE) is None:
        return None
    return importlib.metadata.version(PACKAGE)


def _need_torchao(name: str) -> tuple[bool, str]:
    if version() is None:
        return False, f"{name}: torchao is not installed (pip install 'numerics-harness[torchao]')"
    return True, ""


class _Adapter:
    """Shared parts: `name`, the case-form `supports` (docs/adapters.md §4), the torchao package version.

    `accepts`: the config conventions the adapter runs (a torchao one selects that rule); `conventions`:
    the catalogue conventions its cast follows under a `te` config, tried first when the harness looks
    for the convention a non-exact result matches (docs/adapters.md §4, docs/numerics.md §11);
    `in_dtypes`: the input dtypes torchao's cast takes.
    """

    name = "torchao"
    accepts: tuple[str, ...] = ("te",)
    conventions: tuple[str, ...] = ()
    in_dtypes: tuple[str, ...] = ("float32", "bfloat16")

    @property
    def package(self) -> str:
        return PACKAGE

    @property
    def package_version(self) -> str | None:
        return version()

    def supports(self, case, device) -> tuple[bool, str]:
        """The answer for a whole `harness.cases.Case`, before the harness draws its input or runs the golden."""
        if case.op != "quantize":
            return False, f"{self.name}: only quantize is adapted (torchao's {case.op} is not)"
        ok, why = self.supports_config(case.config)
        if ok and case.in_dtype not in self.in_dtypes:
            return False, f"{self.name}: torchao's cast takes {' or '.join(self.in_dtypes)} input, not {case.in_dtype}"
        return ok, why

    def supports_config(self, config: QuantConfig) -> tuple[bool, str]:
        """Whether the cast runs `config` (torchao installed, a convention it follows, its scheme and tile)."""
        ok, why = _need_torchao(self.name)
        if not ok:
            return ok, why
        if config.convention not in self.accepts:
            return False, f"{self.name}: follows conventions {self.accepts}, not {config.convention}"
        return self._supports(config)

    def _supports(self, config: QuantConfig) -> tuple[bool, str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _check(self, config: QuantConfig, x: torch.Tensor) -> None:
        """What `supports` refuses, raised at call time for a direct caller (the harness never gets here)."""
        ok, why = self.supports_config(config)
        if not ok:
            raise Unsupported(why)
        if str(x.dtype).removeprefix("torch.") not in self.in_dtypes:
            raise Unsupported(f"{self.name}: torchao's cast takes {' or '.join(self.in_dtypes)} input, not {x.dtype}")


class TorchaoMX(_Adapter):
    """torchao MXTensor.to_mx (prototype/mx_formats/mx_tensor.py to_mx) for mxfp8 1x32.

    With `follow_rule` (the `mx` object) the scale mode follows the case's `e8m0_rule` through
    `RULE_MODES`, and a rule torchao has no mode for is refused in `supports`; without it (`mx_floor`,
    ...) the adapter is a kernel fixed to `mode`, which ignores the rule (the report says so).
    """

    accepts = ("te",) + tuple(f"torchao_{m}" for m in _MX_MODES)

    def __init__(self, mode: str = "rceil", name: str | None = None, follow_rule: bool = False) -> None:
        if mode not in _MX_MODES:
            raise ValueError(f"mode={mode!r} is invalid: expected one of {_MX_MODES}")
        self.mode = mode
        self.name = name or f"torchao_mx_{mode}"
        self.follow_rule = follow_rule
        # Under a te config this cast is torchao's rule of its mode (docs/numerics.md §10.3, §10.4).
        self.conventions = tuple(f"torchao_{m}" for m in (RULE_MODES.values() if follow_rule else (mode,)))

    def _supports(self, config):
        if config.scheme != "mxfp8" or config.tile != (1, 32):
            return False, f"{self.name}: torchao's MX cast is 1x32 mxfp8 only, not {config.id}"
        if self.follow_rule and config.convention == "te" and config.e8m0_rule not in RULE_MODES:
            return False, f"{self.name}: torchao 0.18 has no ScaleCalculationMode for e8m0_rule={config.e8m0_rule}"
        return True, ""

    def mode_for(self, config: QuantConfig) -> str:
        """The scale mode used for `config`: its torchao convention's; else, following the rule, the mode of
        its e8m0_rule; else the adapter's own."""
        if config.convention != "te":
            return config.convention.removeprefix("torchao_")
        return RULE_MODES[config.e8m0_rule] if self.follow_rule else self.mode

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None) -> QuantizedTensor:
        self._check(config, x)
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        x2d = build.two_d(x)
        mode = ScaleCalculationMode(self.mode_for(config))
        q = build.empty(config, x)
        q.extra["torchao"] = {"scale_mode": mode.value}
        for orientation, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):  # colwise: blocks along M
            if not (rowwise if orientation == "rowwise" else colwise):
                continue
            t = MXTensor.to_mx(src, _FP8[config.element], 32, mode)
            s = t.scale.view(torch.uint8)  # (rows, cols/32) of src; build orients MXFP8's colwise copy to [M, K]
            build.put_copy(q, orientation, data=t.qdata.reshape(src.shape), scale=s)
            q.extra["torchao"][f"{orientation}_scale"] = s
        return q


class TorchaoNVFP4(_Adapter):
    """torchao NVFP4Tensor.to_nvfp4 (prototype/mx_formats/nvfp4_tensor.py) with a per-tensor scale, nvfp4 1x16."""

    name = "torchao_nvfp4"
    accepts = ("te", "torchao_nvfp4")
    conventions = ("torchao_nvfp4",)

    def _supports(self, config):
        if (config.scheme != "nvfp4" or config.tile != (1, 16) or config.rht or config.stochastic
                or config.variant is not None):
            return False, f"{self.name}: torchao's NVFP4 cast is 1x16, round-to-nearest, no RHT; not {config.id}"
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None) -> QuantizedTensor:
        self._check(config, x)
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

        x2d = build.two_d(x)
        a_g = torch.max(torch.abs(x2d))  # as torchao's NVFP4 workflows compute the tensor amax
        pts = per_tensor_amax_to_scale(a_g)
        q = build.empty(config, x)
        q.extra["torchao"] = {"per_tensor_scale": pts}
        for orientation, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):
            if not (rowwise if orientation == "rowwise" else colwise):
                continue
            t = NVFP4Tensor.to_nvfp4(src, block_size=16, per_tensor_scale=pts)
            # packed [rows, cols/2] (even element low, as ours) and E4M3 scales (rows, cols/16) of src;
            # pts = RN(A_g / 2688) does not determine A_g, so the copy's amax is the A_g passed in
            build.put_copy(q, orientation, data=t.qdata, scale=t.scale, amax=a_g)
        return q


class TorchaoFloat8(_Adapter):
    """torchao float8 tensorwise dynamic scaling (float8/float8_scaling_utils.py hp_tensor_to_float8_dynamic)."""

    name = "torchao_float8"
    accepts = ("te", "torchao_float8")
    conventions = ("torchao_float8",)
    in_dtypes = ("float32", "bfloat16", "float16")

    def _supports(self, config):
        if config.scheme != "fp8_current" or config.pow2_scales or config.eps:
            return False, f"{self.name}: torchao's float8 cast is plain tensorwise fp8_current (no pow2, eps 0); not {config.id}"
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None) -> QuantizedTensor:
        self._check(config, x)
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import LinearMMConfig
        from torchao.float8.float8_utils import tensor_to_amax

        x2d = build.two_d(x)
        t = hp_tensor_to_float8_dynamic(x2d, _FP8[config.element], LinearMMConfig())
        amax = tensor_to_amax(x2d)
        q = build.empty(config, x)
        q.extra["torchao"] = {"scale": t._scale}
        for orientation in ("rowwise", "colwise"):
            if rowwise if orientation == "rowwise" else colwise:
                # torchao stores the encode scale s; ours stores RN(1/s). The colwise copy is the transposed codes.
                build.put_copy(q, orientation, data=t._data, scale=t._scale, kind="encode", amax=amax, by="logical")
        return q


mx = TorchaoMX("rceil", name="torchao_mx", follow_rule=True)
mx_floor = TorchaoMX("floor")
mx_ceil = TorchaoMX("ceil")
mx_even = TorchaoMX("even")
mx_rceil = TorchaoMX("rceil")
nvfp4 = TorchaoNVFP4()
float8 = TorchaoFloat8()
