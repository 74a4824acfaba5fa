"""GEMM references (placeholder until the GEMM reference lands; see NUMERICS.md §6)."""


def gemm(*args, **kwargs):
    raise NotImplementedError("reference.gemm is being written (NUMERICS.md §6)")
