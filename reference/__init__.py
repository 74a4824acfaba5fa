"""Golden, bit-exact, pure-PyTorch reference for every low-precision format and recipe.

The contract is docs/numerics.md; read formats.py (the table), casts.py (bit-level casts), then one
scheme module: per_tensor.py, mxfp8.py, blockwise.py, nvfp4.py.
"""

from .formats import FORMATS, SCHEMES, QuantConfig, ScalarFormat, Scheme
from .gemm import gemm
from .quantization import dequantize, quantize
from .types import QuantizedTensor, SpecViolation, SRSeed, Unsupported

__all__ = [
    "FORMATS",
    "SCHEMES",
    "QuantConfig",
    "QuantizedTensor",
    "ScalarFormat",
    "Scheme",
    "SpecViolation",
    "SRSeed",
    "Unsupported",
    "dequantize",
    "gemm",
    "quantize",
]
