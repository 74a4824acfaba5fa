"""Native GPU backend: NVRTC-compiled CUDA quantizers and cuBLASLt GEMMs, same signatures as `reference`.

Source: docs/design.md §3-§4 (drop-in backend), docs/numerics.md §0.3 (kernel rules). Importable on a
CPU-only machine without CuPy: CuPy is imported lazily, and `supports()` says why a call cannot run.
"""

from .plan import clear_plans, use_plans
from .quantize import dequantize, quantize, supports, update_amax_history

try:  # the GEMM module is optional at import time (it may be missing or need nvmath lazily)
    from .gemm import gemm
except ImportError as _gemm_import_error:  # pragma: no cover - depends on the checkout
    _GEMM_IMPORT_ERROR = repr(_gemm_import_error)

    def gemm(a, b, *, layout="TN", out_dtype=None, bias=None, c=None, method="auto"):
        """Placeholder: native.gemm could not be imported."""
        from reference.types import Unsupported

        raise Unsupported(f"native.gemm is unavailable: {_GEMM_IMPORT_ERROR}")


__all__ = ["clear_plans", "dequantize", "gemm", "quantize", "supports", "update_amax_history", "use_plans"]
