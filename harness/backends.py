"""Backends under test: the golden reference, the native GPU backend, PyTorch's own ops, third-party adapters.

Source: docs/design.md §4. A backend is anything with `name`, `supports(case, device) -> (bool,
reason)` (or the original `supports(op, config, device)`, asked once per config) and some of `quantize`, `dequantize`, `gemm` with the reference's signatures
(docs/design.md §3). Registered by name (`reference`, `native`, `torch`), through the entry-point group
`numerics_harness.backends`, or named as `package.module:object` (an instance, a class, or a
zero-argument factory). A hardware or feature gap raises `Unsupported` (a skip with its reason),
never a silent fallback.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import torch

import reference
from reference.conventions import DEFAULT as DEFAULT_CONVENTION
from reference.formats import QuantConfig
from reference.layouts import gemm_layout
from reference.spec import TORCH_DTYPES, dtype_name, gemm_rule
from reference.types import QuantizedTensor, Unsupported

ENTRY_POINT_GROUP = "numerics_harness.backends"
OPS = ("quantize", "dequantize", "gemm", "grouped_quantize", "linear")
# The backend method each op calls (harness.ops): the linear op runs a whole module case.
METHODS = ("quantize", "dequantize", "gemm", "grouped_quantize", "run_module")


class UnknownBackend(ValueError):
    """A backend name or spec that names nothing loadable."""


@runtime_checkable
class Backend(Protocol):
    """What the runner needs from a backend; `quantize`/`dequantize`/`gemm` are optional per op.

    quantize(x, config, *, rowwise=True, colwise=False, rng=None, state=None) -> QuantizedTensor
    dequantize(q, orientation="rowwise", dtype=torch.float32) -> Tensor [M, K]
    gemm(a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None) -> Tensor [M, N]
    update_amax_history(state, reduced_amax=None)   optional: the backend's own fp8_delayed
        end-of-step update of a reference.per_tensor.AmaxHistory (else the reference's is used)
    run_module(spec, params, steps) -> reference.linear.ModuleRun   optional, the `linear` op: every step of a
        Linear / LayerNormLinear case (reference.linear's ModuleSpec, ModuleParams, StepInputs), with every
        intermediate per step (docs/numerics.md §9.7); harness.chain compares it stage by stage
    prepare(cases, device) -> str | None   optional: one-time work before a sweep (e.g. compiling
        every kernel the cases need); returns a line for the log; an exception there is reported
        and the sweep goes on (each case then fails or passes on its own)
    """

    name: str

    def supports(self, op: str, config: QuantConfig, device: str | torch.device) -> tuple[bool, str]: ...


def asks_for_case(backend: Any) -> bool:
    """Whether `backend.supports` takes the case, `supports(case, device)`, rather than the original
    `supports(op, config, device)` (docs/adapters.md §1): its first parameter is named `case`, or it
    takes two required positional parameters."""
    try:
        params = list(inspect.signature(backend.supports).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional and positional[0].name == "case":
        return True
    return len([p for p in positional if p.default is p.empty]) == 2


def supports_case(backend: Any, case: Any, device: str | torch.device) -> tuple[bool, str]:
    """`backend`'s answer for a whole case (harness.cases.Case: op, configs, dtypes, shape, orientation).

    A backend whose supports takes the case is asked once; one with `supports(op, config, device)`
    is asked for the case's config and then its B config (a GEMM), the first "no" answering."""
    if asks_for_case(backend):
        ok, why = backend.supports(case, device)
        return bool(ok), why or ""
    for cfg in (case.config, getattr(case, "b_config", None)):
        if cfg is None:
            continue
        ok, why = backend.supports(case.op, cfg, device)
        if not ok:
            return False, why or ""
    return True, ""


def one_copy(case: Any, backend: Any, device: str | torch.device) -> tuple[str, str] | None:
    """(the orientation to run, why the other is skipped) when `backend` takes one copy of a both-copies
    quantize/dequantize case and not both; None otherwise (docs/adapters.md §1)."""
    if case.op not in ("quantize", "dequantize") or case.orientation != "both" or not asks_for_case(backend):
        return None
    import dataclasses  # noqa: PLC0415

    answers = {o: supports_case(backend, dataclasses.replace(case, orientation=o), device)
               for o in ("rowwise", "colwise")}
    ok = [o for o, (yes, _) in answers.items() if yes]
    if len(ok) != 1:
        return None
    other = "colwise" if ok[0] == "rowwise" else "rowwise"
    return ok[0], answers[other][1]


def support(backend: Any, case: Any, device: str | torch.device) -> tuple[bool, str, tuple[str, str] | None]:
    """(ok, why not, split): `supports_case`, and for a "no" the one copy the backend runs (`one_copy`)."""
    ok, why = supports_case(backend, case, device)
    return ok, why, (None if ok else one_copy(case, backend, device))


def skip_reason(backend: Any, e: BaseException) -> str:
    """The skip reason of an Unsupported raised by `backend`, prefixed with its name once."""
    text = str(e)
    return text if text.startswith(f"{backend.name}:") or text.startswith(f"{backend.name} ") else f"{backend.name}: {text}"


def device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def default_device() -> str:
    """`cuda` when PyTorch sees a GPU, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    """A dtype from its docs/design.md spelling ("float32", "bfloat16", "float16")."""
    if name is None:
        return default
    if isinstance(name, torch.dtype):
        return name
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} is invalid: expected one of {sorted(TORCH_DTYPES)}") from None


# ----------------------------------------------------------------------------------------------
# reference
# ----------------------------------------------------------------------------------------------


class ReferenceBackend:
    """The golden pure-PyTorch reference run as a backend (on CPU or, for the CPU/CUDA bit check, CUDA)."""

    name = "reference"

    def supports(self, op, config, device):
        if op not in OPS:
            return False, f"reference: unknown op {op!r} (expected one of {OPS})"
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        return reference.quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state)

    def dequantize(self, q, orientation="rowwise", dtype=torch.float32):
        return reference.dequantize(q, orientation, dtype)

    def gemm(self, a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None):
        return reference.gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c, method="auto")

    def gemm_epilogue(self, a, b, *, epilogue, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None, aux=None):
        from reference.gemm import gemm_epilogue  # noqa: PLC0415 - docs/numerics.md §12.2

        return gemm_epilogue(a, b, epilogue=epilogue, layout=layout, out_dtype=out_dtype, bias=bias, c=c, aux=aux)

    def grouped_quantize(self, x, config, splits, *, rowwise=True, colwise=False, rng=None):
        from reference import grouped  # noqa: PLC0415 - docs/numerics.md §12.1

        return grouped.quantize(x, config, splits, rowwise=rowwise, colwise=colwise, rng=rng)

    def run_module(self, spec, params, steps):
        from reference.linear import run_module  # noqa: PLC0415

        return run_module(spec, params, steps)


# ----------------------------------------------------------------------------------------------
# native (imported lazily: it needs CuPy and a GPU)
# ----------------------------------------------------------------------------------------------


class NativeBackend:
    """The project's CuPy/cuBLASLt backend (`native/`), imported on first use."""

    name = "native"

    def __init__(self) -> None:
        self._mod = None
        self._import_error: str | None = None

    def _native(self):
        if self._mod is None and self._import_error is None:
            try:
                self._mod = importlib.import_module("native")
            except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
                self._import_error = f"{type(e).__name__}: {e}"
        return self._mod

    def supports(self, op, config, device):
        if device_type(device) != "cuda":
            return False, f"native: runs on CUDA only (device is {device})"
        mod = self._native()
        if mod is None:
            return False, f"native: the backend cannot be imported ({self._import_error})"
        if not hasattr(mod, "supports"):
            return False, "native: the package has no supports() yet"
        if op == "linear":  # the input role's quantizer and GEMM here; run_module checks every role
            return _supports_all(mod.supports, ("quantize", "gemm"), (config,), device)
        return mod.supports(op, config, device)

    def run_module(self, spec, params, steps):
        """native.linear: native's own module step (quantize, gemm, amax update, norms; CUDA only)."""
        mod = self._native()
        if mod is None:
            raise Unsupported(f"native: the backend cannot be imported ({self._import_error})")
        ok, why = _supports_all(mod.supports, ("quantize", "gemm"), tuple(spec.recipe.configs().values()),
                                params.weight.device)
        if not ok:
            raise Unsupported(why)
        from native.linear import run_module  # noqa: PLC0415

        return run_module(spec, params, steps)

    def _call(self, fn: str, *args, **kwargs):
        mod = self._native()
        if mod is None:
            raise Unsupported(f"native: the backend cannot be imported ({self._import_error})")
        if not hasattr(mod, fn):
            raise Unsupported(f"native: {fn} is not implemented")
        return getattr(mod, fn)(*args, **kwargs)

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        return self._call("quantize", x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state)

    def dequantize(self, q, orientation="rowwise", dtype=torch.float32):
        return self._call("dequantize", q, orientation, dtype)

    def gemm(self, a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None):
        return self._call("gemm", a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c)

    def gemm_epilogue(self, a, b, *, epilogue, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None, aux=None):
        """native.gemm's cuBLASLt epilogues (docs/numerics.md §12.2); Unsupported where cuBLASLt has none."""
        if self._native() is None:
            raise Unsupported(f"native: the backend cannot be imported ({self._import_error})")
        from native.gemm import gemm_epilogue  # noqa: PLC0415

        return gemm_epilogue(a, b, epilogue=epilogue, layout=layout, out_dtype=out_dtype, bias=bias, c=c, aux=aux)

    def grouped_quantize(self, x, config, splits, *, rowwise=True, colwise=False, rng=None):
        """native.grouped: the scheme's kernels once per group (docs/numerics.md §12.1)."""
        if self._native() is None:
            raise Unsupported(f"native: the backend cannot be imported ({self._import_error})")
        from native.grouped import quantize  # noqa: PLC0415

        return quantize(x, config, splits, rowwise=rowwise, colwise=colwise, rng=rng)

    def update_amax_history(self, state, reduced_amax=None):
        """The native fused delayed-scaling update (docs/numerics.md §2) on an AmaxHistory."""
        return self._call("update_amax_history", state, reduced_amax)

    def prepare(self, cases, device) -> str | None:
        """Compile every CUDA module the cases need, in parallel (`native.modules.precompile`), so a
        cold cubin cache costs one parallel compile instead of one compile per module mid-sweep."""
        if device_type(device) != "cuda" or self._native() is None:
            return None
        import time  # noqa: PLC0415

        from native.modules import modules_for, precompile  # noqa: PLC0415

        items = []
        ops = set()
        steps = set()  # (recipe, input dtype) of the linear cases: thousands of cases, a few dozen distinct
        for c in cases:  # a linear case loads every role's quantizer and every GEMM of the step
            if c.op != "linear":
                ops.add((c.op, c.config, c.b_config, c.out_dtype))
            else:
                steps.add((c.module.recipe, c.in_dtype))
        for recipe, in_dtype in steps:
            cfg = recipe.configs()
            ops.update(("quantize", r, None, None) for r in cfg.values())
            for a, b in (("input", "weight"), ("grad_output", "weight"), ("grad_output", "input")):
                ops.update(("gemm", cfg[a], cfg[b], out) for out in (in_dtype, "float32"))
        for op, cfg, b_cfg, out_name in ops:  # distinct only
            if self.supports(op, cfg, device)[0]:
                out = torch_dtype(out_name, torch.bfloat16 if op == "gemm" else torch.float32)
                items += modules_for(op, cfg, b_config=b_cfg, out_dtype=out, device=device)
        t0 = time.perf_counter()
        n = precompile(items, device=device)
        return f"native: {n} CUDA modules compiled or found in the cache in {time.perf_counter() - t0:.1f} s"


# ----------------------------------------------------------------------------------------------
# torch: PyTorch's own float8 casts and scaled-mm kernels
# ----------------------------------------------------------------------------------------------

_FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _supports_all(supports: Callable, ops: tuple, configs: tuple, device) -> tuple[bool, str]:
    """(True, "") when `supports(op, config, device)` holds for every op and config, else the first refusal."""
    for cfg in configs:
        for op in ops:
            ok, why = supports(op, cfg, device)
            if not ok:
                return False, f"{why} (needed by the linear step: {op} of {cfg.id})"
    return True, ""


def _per_tensor(config: QuantConfig) -> bool:
    """One fp32 scale for the tensor: what torch's float8 casts and torch._scaled_mm take."""
    return config.scheme_row.per_tensor


def _fp32_blocks(config: QuantConfig) -> bool:
    """fp32 block sinv in TE's compact layout (fp8_block): what F.scaled_mm's BlockWise recipes take."""
    return not config.scheme_row.per_tensor and config.scheme_row.scale_format == "fp32"


def _scaling_type(name: str):
    st = getattr(torch.nn.functional, "ScalingType", None)
    return None if st is None else getattr(st, name, None)


class TorchBackend:
    """PyTorch's own ops: per-tensor FP8 through torch float8 casts, GEMMs through `_scaled_mm`/`F.scaled_mm`.

    Quantize: fp8_current (scale from the NaN-ignoring amax) and fp8_delayed (scale from the state),
    data = clamp(x*s, ±max).to(float8) with NaN lanes set to the NaN code (docs/numerics.md §0.2.3).
    Other schemes are Unsupported. GEMM: per-tensor FP8 through `torch._scaled_mm`, FP8 blockwise
    through `torch.nn.functional.scaled_mm` (BlockWise1x128 / BlockWise128x128) where this torch
    has it, on CUDA only.
    """

    name = "torch"

    def supports(self, op, config, device):
        if config.convention != DEFAULT_CONVENTION:
            return False, f"torch: PyTorch's casts follow the {DEFAULT_CONVENTION!r} convention, not {config.convention!r}"
        if op == "linear":  # the step from this backend's quantize and gemm (run_module checks every role)
            return _supports_all(self.supports, ("quantize", "gemm"), (config,), device)
        if op in ("quantize", "dequantize"):
            if _per_tensor(config):
                return True, ""
            return False, f"torch: no PyTorch {op} op for {config.scheme} (only per-tensor fp8_current / fp8_delayed)"
        if op != "gemm":
            return False, f"torch: unknown op {op!r}"
        if device_type(device) != "cuda":
            return False, (f"torch: GEMMs run through torch._scaled_mm / F.scaled_mm, which need a CUDA device "
                           f"(device is {device})")
        cap = torch.cuda.get_device_capability(torch.device(device))
        if _per_tensor(config):
            if not hasattr(torch, "_scaled_mm"):
                return False, f"torch: this torch {torch.__version__} has no torch._scaled_mm"
            if cap < (8, 9):
                return False, f"torch: FP8 _scaled_mm needs sm_89+, this GPU is sm_{cap[0]}{cap[1]}"
            return True, ""
        if _fp32_blocks(config):
            if not hasattr(torch.nn.functional, "scaled_mm") or _scaling_type("BlockWise1x128") is None:
                return False, f"torch: this torch {torch.__version__} has no F.scaled_mm with BlockWise1x128"
            if cap != (9, 0):
                return False, f"torch: blockwise FP8 scaled_mm runs on sm_90 only (cuBLAS), this GPU is sm_{cap[0]}{cap[1]}"
            return True, ""
        return False, f"torch: no PyTorch GEMM wired for {config.scheme} (sm_100+ block-scaled kernels are not used here)"

    def run_module(self, spec, params, steps):
        """reference.linear's step with this backend's quantize and gemm (per-tensor FP8 recipes on CUDA,
        blockwise on sm_90); Unsupported naming the role otherwise. Norms, dbias and the grad sums are
        reference.linear's PyTorch arithmetic."""
        from reference.linear import Kernels, run_module  # noqa: PLC0415

        ok, why = _supports_all(self.supports, ("quantize", "gemm"), tuple(spec.recipe.configs().values()),
                                params.weight.device)
        if not ok:
            raise Unsupported(why)
        return run_module(spec, params, steps, kernels=Kernels(quantize=self.quantize, gemm=self.gemm))

    # ---- quantize ---------------------------------------------------------------------------
    @staticmethod
    def _amax(x32: torch.Tensor) -> torch.Tensor:
        # NUMERICS: §0.1 amax ignores NaN, keeps +inf (§0.2.5: |x| with NaN lanes zeroed, then max).
        a = x32.abs()
        a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
        return a.amax().reshape(1)

    @staticmethod
    def _scale(amax: torch.Tensor, fp8_max: torch.Tensor, config: QuantConfig) -> torch.Tensor:
        # NUMERICS: §1 compute_scale, per-tensor current scaling (v_inf = FLT_MAX).
        eps = torch.full_like(amax, config.eps)
        a = torch.where(amax < eps, eps, amax)  # NaN compares false and is kept
        special = (a == 0) | torch.isinf(a) | torch.isnan(a)
        s = torch.div(fp8_max, a)  # NUMERICS: §0.2.2 true division, tensor by tensor
        s = torch.where(torch.isinf(s), torch.full_like(s, torch.finfo(torch.float32).max), s)
        if config.pow2_scales:
            # NUMERICS: §1 step 5 - clear the 23 fp32 mantissa bits: 2^floor(log2 s).
            s = (s.view(torch.int32) & ~((1 << 23) - 1)).view(torch.float32)
        return torch.where(special, torch.ones_like(s), s)

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        if not _per_tensor(config):
            raise Unsupported(self.supports("quantize", config, x.device)[1])
        if not (rowwise or colwise):
            raise ValueError("quantize needs rowwise=True or colwise=True")
        fmt = config.element_format
        f8 = _FP8_DTYPES[config.element]
        fp8_max = torch.full((1,), torch.finfo(f8).max, dtype=torch.float32, device=x.device)
        x32 = x.reshape(-1, x.shape[-1]).to(torch.float32)  # (M, K)
        amax = self._amax(x32)
        if not config.scheme_row.amax_history:  # current scaling (docs/numerics.md §1)
            s = self._scale(amax, fp8_max, config)
        elif state is not None:
            s = state.scale.to(device=x.device, dtype=torch.float32).reshape(1)
            # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) for every quantization in the step (AmaxHistory.record).
            state.record(amax)
        else:
            s = torch.ones_like(amax)  # a fresh DelayedScaling state has scale 1
        sinv = torch.reciprocal(s)  # NUMERICS: §1 step 6, sinv = RN(1/s)
        y = x32 * s  # NUMERICS: §1 one fp32 multiply, no FMA
        # NUMERICS: §0.2.3 clamp to ±max before the float8 cast, then NaN lanes -> the NaN code.
        q = torch.clamp(y, -fp8_max, fp8_max).to(f8).view(torch.uint8)
        q = torch.where(torch.isnan(y), torch.full_like(q, fmt.nan_code), q)
        out = QuantizedTensor(config=config, shape=tuple(x.shape), hp_dtype=dtype_name(x.dtype))
        if rowwise:
            out.rowwise_data, out.rowwise_scale, out.rowwise_amax = q, sinv, amax.clone()
        if colwise:
            # NUMERICS: §1 layout - data_T [K, M] is the byte-exact transpose and shares sinv.
            out.colwise_data, out.colwise_scale, out.colwise_amax = q.t().contiguous(), sinv.clone(), amax.clone()
        return out

    def dequantize(self, q, orientation="rowwise", dtype=torch.float32):
        if not _per_tensor(q.config):
            raise Unsupported(self.supports("dequantize", q.config, "cpu")[1])
        data, sinv = getattr(q, f"{orientation}_data"), getattr(q, f"{orientation}_scale")
        if data is None:
            raise ValueError(f"this QuantizedTensor has no {orientation} copy")
        # NUMERICS: §1 x_hat = RN_out(RN(dec(q) * sinv)); float8 -> fp32 widening is exact.
        d = data.view(_FP8_DTYPES[q.config.element]).to(torch.float32)
        # A NaN code decodes to the quiet NaN with the code's sign (torch's cast keeps an fp8 payload).
        d = torch.where(torch.isnan(d), torch.copysign(torch.full_like(d, float("nan")), d), d)
        v = d * sinv.to(torch.float32)
        if orientation == "colwise":
            v = v.t()
        return v.contiguous().to(dtype)

    # ---- gemm --------------------------------------------------------------------------------
    @staticmethod
    def _operand(q: QuantizedTensor, colwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp8 data [rows, K] K-contiguous, its scale) of the copy a TN GEMM consumes."""
        o = "colwise" if colwise else "rowwise"
        data, scale = getattr(q, f"{o}_data"), getattr(q, f"{o}_scale")
        if data is None:
            raise ValueError(f"gemm operand has no {o} copy (quantize it with {o}=True)")
        return data.view(_FP8_DTYPES[q.config.element]), scale

    @staticmethod
    def _block_scale(q: QuantizedTensor, scale: torch.Tensor, rows: int):
        """(scale, recipe) in F.scaled_mm's layout for TE's compact blockwise sinv."""
        if q.config.is_2d:
            # TE 2-D sinv [ceil(rows/128), roundup(ceil(K/128), 4)] -> its transpose view (torch's layout).
            return scale.t(), _scaling_type("BlockWise128x128")
        # TE 1-D sinv [ceil(K/128), roundup(rows, 4)] entry [kb, row] -> (rows, K/128), outer-dim-major.
        return scale[:, :rows].contiguous().t(), _scaling_type("BlockWise1x128")

    def gemm(self, a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None):
        lay = gemm_layout(layout)  # the copies each layout consumes (reference.layouts.GEMM_LAYOUTS)
        a_col, b_col = lay.a == "colwise", lay.b == "colwise"
        a8, sa = self._operand(a, a_col)  # (M, K)
        b8, sb = self._operand(b, b_col)  # (N, K)
        for q in (a, b):
            ok, why = self.supports("gemm", q.config, a8.device)
            if not ok:
                raise Unsupported(why)
        schemes = {_per_tensor(a.config), _per_tensor(b.config)}
        if len(schemes) != 1:
            raise Unsupported(f"torch: mixed GEMM {a.config.id} x {b.config.id} has no PyTorch kernel")
        if a.config.element == "e5m2" and b.config.element == "e5m2":
            raise Unsupported("torch: cuBLAS FP8 GEMMs need at least one e4m3 operand (e5m2 x e5m2 given)")
        m, n = a8.shape[0], b8.shape[0]
        epilogue = bias is not None or c is not None
        mm_dtype = torch.float32 if epilogue else out_dtype
        if _per_tensor(a.config):
            y = torch._scaled_mm(a8, b8.t(), scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=mm_dtype,
                                 use_fast_accum=False)
        else:
            gemm_rule(a.config, b.config, layout)  # the spec's GEMM rules (2-D x 2-D, ...), its message
            scale_a, rec_a = self._block_scale(a, sa, m)
            scale_b, rec_b = self._block_scale(b, sb, n)
            y = torch.nn.functional.scaled_mm(a8, b8.t(), scale_a, rec_a, scale_b, rec_b, output_dtype=mm_dtype,
                                              use_fast_accum=False)
        if not epilogue:
            return y
        b32 = None if bias is None else bias.to(torch.float32)
        if a.config.scheme_row.round_before_accumulate:
            # NUMERICS: §6 blockwise - bias added in fp32, RN_out, then D = RN_out(C + RN_out(Y)).
            y = (y if b32 is None else y + b32).to(out_dtype)
            return y if c is None else (c.to(torch.float32) + y.to(torch.float32)).to(out_dtype)
        # Per-tensor (tolerance only, docs/numerics.md §6): cuBLASLt's D = AB + C in fp32, then the bias epilogue.
        if c is not None:
            y = y + c.to(torch.float32)
        if b32 is not None:
            y = y + b32
        return y.to(out_dtype)


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

BUILTIN: dict[str, Callable[[], Any]] = {
    "reference": ReferenceBackend,
    "native": NativeBackend,
    "torch": TorchBackend,
}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - Python < 3.10 API
        eps = importlib.metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    return {ep.name: ep for ep in eps}


def entry_point_names() -> list[str]:
    """The names registered in the entry-point group (none of them is loaded)."""
    return sorted(_entry_points())


def backend_names() -> list[str]:
    """Built-in names, then entry-point names (sorted)."""
    return list(BUILTIN) + sorted(n for n in _entry_points() if n not in BUILTIN)


def _coerce(obj: Any, spec: str) -> Any:
    """A backend instance from what a spec names: an instance, a class, or a zero-argument factory."""
    if isinstance(obj, type) or (not hasattr(obj, "supports") and callable(obj)):
        obj = obj()
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"backend {spec!r} is not a Backend: it has no string `name` attribute")
    if not callable(getattr(obj, "supports", None)):
        raise TypeError(f"backend {spec!r} is not a Backend: it has no supports(op, config, device) method")
    if not any(callable(getattr(obj, m, None)) for m in METHODS):
        raise TypeError(f"backend {spec!r} is not a Backend: it implements none of {', '.join(METHODS)}")
    return obj


def _is_path(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part


def load_spec(spec: str) -> Any:
    """`package.module:object` or `path/to/file.py:object` (dots after the colon walk attributes) to a backend
    instance. A file is loaded under a name of its own, and its folder is not put on the import path, so an
    adapter file named after its library (`torchao.py`) cannot shadow the library it wraps."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise UnknownBackend(f"backend spec {spec!r} is invalid: expected 'package.module:object' or "
                             "'path/to/file.py:object'")
    if _is_path(module_name):
        obj: Any = _load_file(spec, Path(module_name).expanduser())
    else:
        try:
            obj = importlib.import_module(module_name)
        except ImportError as e:
            raise UnknownBackend(f"backend spec {spec!r}: cannot import module {module_name!r} ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownBackend(f"backend spec {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _coerce(obj, spec)


def _load_file(spec: str, path: Path) -> Any:
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if not path.is_file():
        raise UnknownBackend(f"backend spec {spec!r}: no such file {str(path)!r}")
    path = path.resolve()
    name = f"harness_backend_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def module_file(module_name: str) -> Path | None:
    """The source file of `module_name`, found on the import path without importing anything (no package's
    __init__ runs), or None."""
    import importlib.machinery  # noqa: PLC0415

    path = None
    found = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), path)
        if found is None:
            return None
        path = found.submodule_search_locations
    return Path(found.origin) if found is not None and found.origin and Path(found.origin).is_file() else None


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def backend_identity(spec: str) -> dict:
    """What identifies a backend's code for a report (run_meta.json, --resume), computed here without importing it:
    the spec, the file that defines it and that file's sha256, and the version of the distribution it comes from
    (built-ins: this harness's version). A changed digest or version means a changed backend."""
    spec = spec.strip()
    if spec in BUILTIN:  # this harness's own code: its commit is in run_meta.json
        return {"spec": spec, "file": None, "sha256": None, "version": _dist_version("numerics-harness")}
    target = spec
    if ":" not in spec and spec in _entry_points():
        target = _entry_points()[spec].value
    module_name = target.rpartition(":")[0]
    path = Path(module_name).expanduser() if _is_path(module_name) else module_file(module_name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None
    version = None
    if not _is_path(module_name):
        dists = importlib.metadata.packages_distributions().get(module_name.split(".")[0], [])
        version = _dist_version(dists[0]) if dists else None
    return {"spec": spec, "file": None if path is None else str(path), "sha256": digest, "version": version}


def get_backend(name_or_spec: Any) -> Any:
    """The backend a name or spec denotes; a ready backend object is returned unchanged.

    Order: built-in names, entry points of `numerics_harness.backends`, `package.module:object`.
    The resolved spec is kept on the instance as `spec` (used in repro commands) when settable.
    """
    if not isinstance(name_or_spec, str):
        return _coerce(name_or_spec, repr(name_or_spec))
    spec = name_or_spec.strip()
    if spec in BUILTIN:
        backend = BUILTIN[spec]()
    elif ":" in spec:
        backend = load_spec(spec)
    else:
        eps = _entry_points()
        if spec not in eps:
            raise UnknownBackend(
                f"unknown backend {spec!r}: expected one of {', '.join(backend_names())} "
                f"(entry-point group {ENTRY_POINT_GROUP!r}) or 'package.module:object'"
            )
        backend = _coerce(eps[spec].load(), spec)
    try:
        if getattr(backend, "spec", None) is None:
            backend.spec = spec
    except AttributeError:  # frozen/slotted third-party objects keep no spec
        pass
    return backend


def backend_spec(backend: Any) -> str:
    """The string that reloads `backend` through get_backend (its spec, else its name)."""
    return getattr(backend, "spec", None) or backend.name


def parse_backend_list(text: str) -> list[str]:
    """`reference,torch` -> ['reference', 'torch'] (order kept, duplicates dropped)."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    if not out:
        raise UnknownBackend(f"--backend {text!r} names no backend")
    return out
