"""The NVFP4 quantize kernel's walk over its tiles when a CTA quantizes several: byte for byte against the golden.

Source: docs/numerics.md §5 (NVFP4); docs/design.md §4.2. native.nvfp4 launches one wave of resident CTAs (SMs x
quantize_ctas_per_sm), each starting at tile blockIdx.x and drawing every later tile from a per-call counter
(gridDim.x + atomicAdd), with the next tile's copies in flight in the other shared buffer. Here the quantize launch
gets 1 .. 23 CTAs over 4 x 11 (bf16) or 4 x 21 (fp32) tiles with partial last rows and columns, for 1-D, 2-D and
RHT + SR builds and each copy alone (the post-RHT amax kernel, which walks the same tiles, as few CTAs); the
default grid over more tiles than it has CTAs, partial edges included; repeated in-place planned calls (the counter
zeroed per call); and a 17 GB X whose codes lie past 2^32 bytes (the kernel's 32-bit indices times 64-bit extents).
"""

from __future__ import annotations

import pytest
import torch

import reference
from reference.formats import QuantConfig

from .test_native_nvfp4 import DTYPES, SEED, assert_fields_equal, make_input

pytestmark = pytest.mark.gpu

SHAPE = (400, 656)  # 128-row tiles: 3 whole + 16 rows; 64 bf16 columns: 10 whole + 16; 32 fp32: 20 + 16
CONFIGS = {
    "1x16": QuantConfig("nvfp4"),
    "16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "1x16-rht-sr": QuantConfig("nvfp4", rht=True, stochastic=True),
}


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")


@pytest.mark.parametrize("grid", [1, 3, 7, 13, 23])
@pytest.mark.parametrize("cfg_name,dtype_name", [("1x16", "bfloat16"), ("1x16", "float32"), ("1x16", "float16"),
                                                 ("16x16", "bfloat16"), ("16x16", "float32"),
                                                 ("1x16-rht-sr", "bfloat16")])
@pytest.mark.parametrize("rowwise, colwise", [(True, True), (True, False), (False, True)], ids=["both", "row", "col"])
def test_capped_grid_matches_reference(cfg_name, dtype_name, grid, rowwise, colwise):
    from native import nvfp4

    cfg = CONFIGS[cfg_name]
    x = make_input("normal", SHAPE, DTYPES[dtype_name], seed=grid * 31 + len(cfg_name))
    rng = SEED if cfg.stochastic else None
    golden = reference.quantize(x, cfg, rowwise=rowwise, colwise=colwise, rng=rng)
    x_gpu = x.cuda()
    base = nvfp4._launcher(cfg, x_gpu.device)

    def capped(name, n_units, args, max_blocks=nvfp4.MAX_BLOCKS, units_per_block=nvfp4.THREADS):
        if name.startswith("nvfp4_quantize_") or name == "nvfp4_rht_amax":
            assert n_units > grid  # every CTA walks more than one tile
            max_blocks = grid
        base(name, n_units, args, max_blocks=max_blocks, units_per_block=units_per_block)

    fields = nvfp4.quantize_with(capped, x_gpu, cfg, rowwise=rowwise, colwise=colwise, seed=rng)
    torch.cuda.synchronize()
    assert_fields_equal(golden, fields, *SHAPE, f"{cfg.id} {dtype_name} grid {grid}")


WIDE = (2064, 2064)  # 17 x 33 bf16 / 17 x 65 fp32 tiles (last row and column partial): more than one wave's CTAs


@pytest.mark.parametrize("cfg_name,dtype_name", [("1x16", "bfloat16"), ("1x16", "float32"), ("1x16", "float16"),
                                                 ("16x16", "bfloat16"), ("1x16-rht-sr", "bfloat16")])
def test_default_grid_walks_tiles_matches_reference(cfg_name, dtype_name):
    from native import nvfp4

    cfg = CONFIGS[cfg_name]
    x = make_input("normal", WIDE, DTYPES[dtype_name], seed=2064 + len(cfg_name))
    rng = SEED if cfg.stochastic else None
    golden = reference.quantize(x, cfg, rowwise=True, colwise=True, rng=rng)
    x_gpu = x.cuda()
    base = nvfp4._launcher(cfg, x_gpu.device)
    grids = []

    def recorded(name, n_units, args, max_blocks=nvfp4.MAX_BLOCKS, units_per_block=nvfp4.THREADS):
        if name.startswith("nvfp4_quantize_"):
            grids.append((n_units, max_blocks))
        base(name, n_units, args, max_blocks=max_blocks, units_per_block=units_per_block)

    fields = nvfp4.quantize_with(recorded, x_gpu, cfg, rowwise=True, colwise=True, seed=rng)
    torch.cuda.synchronize()
    (n_tiles, cap), = grids
    assert cap == nvfp4.sm_count(nvfp4.device_index(x_gpu.device)) * nvfp4.quantize_ctas_per_sm(cfg) < n_tiles  # CTAs walk tiles
    assert_fields_equal(golden, fields, *WIDE, f"{cfg.id} {dtype_name} default grid")


@pytest.mark.parametrize("given", [False, True], ids=["own-amax", "given-amax"])
def test_planned_calls_in_place_draw_every_tile_each_time(given):
    """The drawn-tile counter is zeroed per call (the plan block's memset, or fill_given with a given amax): a first
    call (full path), a planned call, then two in-place calls (`out=`), over more tiles than the grid has CTAs, each on
    a new input, each equal to the golden. The third given amax is half of amax(X): saturated block scales, |y| up
    to ~12, the clamped encode."""
    import native

    cfg = CONFIGS["1x16"]
    native.use_plans(True)
    native.clear_plans()  # so the first call of the signature takes the full path and the second one the plan
    q = None
    for i in range(4):
        x = make_input("normal", WIDE, torch.bfloat16, seed=4000 + i)
        amax = (x.abs().amax().float() * (0.5 if i == 2 else 1.0)).reshape(1) if given else None
        golden = reference.quantize(x, cfg, rowwise=True, colwise=True, **({"amax": amax} if given else {}))
        kw = {"amax": amax.cuda()} if given else {}
        if i < 2:
            q = native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, **kw)  # full path, then the plan's block
        else:
            assert native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, out=q, **kw) is q
        torch.cuda.synchronize()
        fields = {f"{o}_{f}": getattr(q, f"{o}_{f}") for o in ("rowwise", "colwise") for f in ("data", "scale", "amax")}
        assert_fields_equal(golden, fields, *WIDE, f"{cfg.id} call {i} given={given}")


HUGE = ((1 << 18) + 16, 1 << 15)  # 2^33 + 2^19 bf16 elements: byte offsets past 2^32 in X and in both copies' codes


def test_offsets_past_4_gib_match_small_quantizations():
    """The kernel indexes rows, columns and tiles in 32 bits and forms each address as a 32-bit index times a 64-bit
    extent (docs/design.md §4.2): over X [2^18 + 16, 2^15] bf16 (17 GB; the codes of both copies 4.3 GB each, so the
    last rows' codes lie past 2^32 bytes), the first and the last 16 rows' rowwise codes and scales, and their colwise
    m-blocks (columns of X^T), equal a quantization of those 16 rows alone with the same given amax: a block depends
    only on its 16 elements and A_g (docs/numerics.md §5.2-§5.4)."""
    import native

    m, k = HUGE
    free, _ = torch.cuda.mem_get_info()
    if free < 40 << 30:
        pytest.skip(f"needs ~30 GiB of free GPU memory, {free >> 30} GiB free")
    cfg = CONFIGS["1x16"]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(5))
    lo, hi = torch.aminmax(x)  # (no 17 GB temporary of |x|)
    amax = torch.maximum(-lo, hi).float().reshape(1)
    q = native.quantize(x, cfg, rowwise=True, colwise=True, amax=amax)
    for r0 in (0, m - 16):
        part = native.quantize(x[r0 : r0 + 16].contiguous(), cfg, rowwise=True, colwise=True, amax=amax)
        where = f"rows {r0}..{r0 + 15} of {m}"
        assert torch.equal(q.rowwise_data[r0 : r0 + 16], part.rowwise_data), where
        assert torch.equal(q.rowwise_scale[r0 : r0 + 16, : k // 16], part.rowwise_scale[:16, : k // 16]), where
        assert torch.equal(q.colwise_data[:, r0 // 2 : r0 // 2 + 8], part.colwise_data), where
        assert torch.equal(q.colwise_scale[:k, r0 // 16], part.colwise_scale[:k, 0]), where
    del q, x
    torch.cuda.empty_cache()
