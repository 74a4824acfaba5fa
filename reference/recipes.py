"""TransformerEngine's training recipes as frozen dataclasses mapping each tensor role to a QuantConfig.

Source: TE transformer_engine/common/recipe/__init__.py at d0067d0da6cb (DelayedScaling,
Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling, Format.HYBRID) and
transformer_engine/pytorch/module/base.py (_2X_ACC_FPROP/DGRAD/WGRAD split-accumulator defaults);
docs/numerics.md §1-§5 (per-scheme rules), §5.5 (NVFP4 default roles). Field names follow TE's.

Roles: "input" (forward activation X), "weight" (W), "grad_output" (dY). RHT in TE is applied
only to the columnwise copy of inputs and gradients; `QuantConfig.rht=True` models exactly that
(the rowwise copy of such a config is plain NVFP4).
"""

from __future__ import annotations

from dataclasses import dataclass

from .formats import E4M3, E5M2, QuantConfig

ROLES = ("input", "weight", "grad_output")
GEMMS = ("fprop", "dgrad", "wgrad")
FP8_FORMATS = ("e4m3", "hybrid")  # TE Format.E4M3 / Format.HYBRID; pure E5M2 is rejected (as in TE)

# TE pytorch/module/base.py: _2X_ACC_FPROP = False, _2X_ACC_DGRAD = True, _2X_ACC_WGRAD = True.
_DEFAULT_SPLIT_ACC = {"fprop": False, "dgrad": True, "wgrad": True}


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role={role!r} is invalid: expected one of {ROLES}")


def _check_gemm(gemm: str) -> None:
    if gemm not in GEMMS:
        raise ValueError(f"gemm={gemm!r} is invalid: expected one of {GEMMS}")


def _element(fp8_format: str, role: str) -> str:
    """HYBRID = E4M3 for forward tensors (input, weight), E5M2 for gradients (docs/numerics.md §1)."""
    if fp8_format not in FP8_FORMATS:
        raise ValueError(
            f"fp8_format={fp8_format!r} is invalid: expected one of {FP8_FORMATS} (pure E5M2 training is not supported)"
        )
    if fp8_format == "hybrid" and role == "grad_output":
        return E5M2.name
    return E4M3.name


class _Recipe:
    """Shared helpers: `configs()` for every role, `split_accumulator(gemm)`."""

    def config(self, role: str) -> QuantConfig:  # pragma: no cover - overridden
        raise NotImplementedError

    def configs(self) -> dict[str, QuantConfig]:
        return {role: self.config(role) for role in ROLES}

    def split_accumulator(self, gemm: str) -> bool:
        """Whether the Hopper FP8 GEMM uses the split (full-precision) accumulator (TE MMParams)."""
        _check_gemm(gemm)
        return _DEFAULT_SPLIT_ACC[gemm]


@dataclass(frozen=True)
class DelayedScaling(_Recipe):
    """Per-tensor FP8 with a delayed scale from an amax history (docs/numerics.md §2; TE defaults)."""

    margin: int = 0
    fp8_format: str = "hybrid"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def __post_init__(self) -> None:
        _element(self.fp8_format, "input")

    def config(self, role: str) -> QuantConfig:
        _check_role(role)
        return QuantConfig(
            "fp8_delayed",
            element=_element(self.fp8_format, role),
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
            margin=self.margin,
        )


@dataclass(frozen=True)
class Float8CurrentScaling(_Recipe):
    """Per-tensor FP8 current scaling (docs/numerics.md §1; TE: HYBRID, pow2 off, amax_epsilon 0)."""

    fp8_format: str = "hybrid"
    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        _element(self.fp8_format, "input")

    def config(self, role: str) -> QuantConfig:
        _check_role(role)
        return QuantConfig(
            "fp8_current",
            element=_element(self.fp8_format, role),
            pow2_scales=self.use_power_2_scales,
            eps=self.amax_epsilon,
        )


@dataclass(frozen=True)
class MXFP8BlockScaling(_Recipe):
    """MXFP8, 1x32 blocks with E8M0 scales (docs/numerics.md §3; TE default fp8_format E4M3).

    `enable_2d_quantization` gives weights one exponent per 32x32 tile. `e8m0_rule` is not a TE
    field: TE and cuBLAS use `ceil`; `floor` is the OCP MX rule (docs/numerics.md §3, §7.14).
    """

    fp8_format: str = "e4m3"
    enable_2d_quantization: bool = False
    e8m0_rule: str = "ceil"

    def __post_init__(self) -> None:
        _element(self.fp8_format, "input")

    def config(self, role: str) -> QuantConfig:
        _check_role(role)
        tile = (32, 32) if (self.enable_2d_quantization and role == "weight") else (1, 32)
        return QuantConfig("mxfp8", element=_element(self.fp8_format, role), tile=tile, e8m0_rule=self.e8m0_rule)

    def split_accumulator(self, gemm: str) -> bool:
        _check_gemm(gemm)
        return True  # block-scaled MMA on sm_100+: no Hopper fast-accumulation mode applies


@dataclass(frozen=True)
class Float8BlockScaling(_Recipe):
    """FP8 blockwise (docs/numerics.md §4; TE: E4M3, pow2 scales, inputs/grads 1x128, weights 128x128).

    `use_f32_scales` is TE's NVTE_FP8_BLOCK_SCALING_FP32_SCALES (pow2 = not use_f32_scales).
    A 2-D x 2-D GEMM is not allowed, so TE's combinations with two 2-D roles are rejected.
    """

    fp8_format: str = "e4m3"
    use_f32_scales: bool = False
    amax_epsilon: float = 0.0
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1

    def __post_init__(self) -> None:
        _element(self.fp8_format, "input")
        dims = {"x": self.x_block_scaling_dim, "w": self.w_block_scaling_dim, "grad": self.grad_block_scaling_dim}
        for name, d in dims.items():
            if d not in (1, 2):
                raise ValueError(f"{name}_block_scaling_dim={d!r} is invalid: expected 1 or 2")
        for p, q in (("x", "w"), ("x", "grad"), ("w", "grad")):
            if dims[p] == 2 and dims[q] == 2:
                raise ValueError(
                    f"{p}_block_scaling_dim=2 with {q}_block_scaling_dim=2 is invalid: "
                    "a 2-D x 2-D blockwise GEMM is not supported (docs/numerics.md §4, §6)"
                )

    def config(self, role: str) -> QuantConfig:
        _check_role(role)
        dim = {"input": self.x_block_scaling_dim, "weight": self.w_block_scaling_dim}.get(
            role, self.grad_block_scaling_dim
        )
        tile = (128, 128) if dim == 2 else (1, 128)
        return QuantConfig(
            "fp8_block",
            element=_element(self.fp8_format, role),
            tile=tile,
            pow2_scales=not self.use_f32_scales,
            eps=self.amax_epsilon,
        )

    def split_accumulator(self, gemm: str) -> bool:
        _check_gemm(gemm)
        return True  # TE asserts use_split_accumulator for fprop, dgrad and wgrad


@dataclass(frozen=True)
class NVFP4BlockScaling(_Recipe):
    """NVFP4 (docs/numerics.md §5.5 default roles; TE NVFP4BlockScaling and its three toggles).

    input: 1x16, RN, RHT on the colwise copy; weight: 16x16, RN, no RHT; grad_output: 1x16, SR,
    RHT on the colwise copy. disable_rht / disable_stochastic_rounding / disable_2d_quantization
    switch those off (TE's NVTE_NVFP4_DISABLE_* env vars).
    """

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False

    def config(self, role: str) -> QuantConfig:
        _check_role(role)
        if role == "weight":
            tile = (16, 16) if not self.disable_2d_quantization else (1, 16)
            return QuantConfig("nvfp4", tile=tile)
        return QuantConfig(
            "nvfp4",
            tile=(1, 16),
            rht=not self.disable_rht,
            stochastic=(role == "grad_output") and not self.disable_stochastic_rounding,
        )

    def split_accumulator(self, gemm: str) -> bool:
        _check_gemm(gemm)
        return True  # block-scaled MMA on sm_100+: no Hopper fast-accumulation mode applies


RECIPES = {
    cls.__name__: cls
    for cls in (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling)
}
