// NVFP4 quantize / dequantize kernels: global amax, post-RHT amax, 16x16 tile amax, 1x16 and
// 16x16 block quantization of the rowwise and the columnwise copy (RN or SR, optional RHT), and
// TE's dequantization.
//
// Source: NUMERICS.md §5 (NVFP4), §0.3 (kernel rules); TE common/cast/nvfp4/
// (quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh), common/hadamard_transform/.
//
// The copy being quantized is a logical [R, C] matrix: the rowwise copy is X [M, K], read along its
// rows; the columnwise copy is X^T [K, M], read in place from X (element (k, m) = X[m, k]), with the
// 16-point RHT applied to each of its 16-element blocks in RHT builds (the RHT chunk of column k is
// exactly that block). A thread owns GROUP consecutive blocks of one copy row; columnwise, consecutive
// threads take consecutive k so the strided reads of X coalesce. Copy modes (RHT, SR, 2-D tiles)
// are compile-time, from defines_for(config), so each kernel carries only its own path.
//
// Per-thread work lives in __host__ __device__ *_unit functions so the same code can be replayed on
// a CPU; the __global__ wrappers only map threads to units and reduce amaxes.
// schemes: nvfp4
#include "nvfp4.cuh"

namespace nvfp4 {

enum InDtype { IN_F32 = 0, IN_BF16 = 1, IN_F16 = 2 };

// A block of 16 input elements as loaded, before widening: fp32 bit patterns, or pairs of 16-bit
// words (element 2i in the low half), so 16-bit inputs hold half the registers while in flight.
template <int DT>
struct Raw {
    static constexpr int WORDS = DT == IN_F32 ? BLOCK : BLOCK / 2;
    u32 w[WORDS];
};

template <int DT>
NVFP4_HD u32 load_word(const void* src, i64 off) {
    if (DT == IN_F32) return f2u(static_cast<const float*>(src)[off]);
    return static_cast<const u16*>(src)[off];
}

// The 16 elements src[off + i * cs], as loaded (16-byte vector loads when contiguous: offsets are
// multiples of 16 elements and the base is 16-byte aligned).
template <int DT>
NVFP4_HD void load_raw(const void* src, i64 off, i64 cs, Raw<DT>& raw) {
#if defined(__CUDA_ARCH__)
    if (cs == 1) {
        const uint4* p = DT == IN_F32 ? reinterpret_cast<const uint4*>(static_cast<const float*>(src) + off)
                                      : reinterpret_cast<const uint4*>(static_cast<const u16*>(src) + off);
#pragma unroll
        for (int q = 0; q < Raw<DT>::WORDS / 4; ++q) {
            const uint4 t = p[q];
            raw.w[4 * q] = t.x;
            raw.w[4 * q + 1] = t.y;
            raw.w[4 * q + 2] = t.z;
            raw.w[4 * q + 3] = t.w;
        }
        return;
    }
#endif
    if (DT == IN_F32) {
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) raw.w[i] = load_word<DT>(src, off + (i64)i * cs);
    } else {
#pragma unroll
        for (int i = 0; i < BLOCK / 2; ++i)
            raw.w[i] = load_word<DT>(src, off + (i64)(2 * i) * cs) | (load_word<DT>(src, off + (i64)(2 * i + 1) * cs) << 16);
    }
}

// Exact widening of a loaded block to fp32.
template <int DT>
NVFP4_HD void widen(const Raw<DT>& raw, float (&v)[BLOCK]) {
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        if (DT == IN_F32) {
            v[i] = u2f(raw.w[i]);
        } else {
            const u16 h = (u16)(raw.w[i / 2] >> (16 * (i % 2)));
            v[i] = DT == IN_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
}

// The 16 elements src[off + i * cs], widened exactly to fp32.
template <int DT>
NVFP4_HD void load_block(const void* src, i64 off, i64 cs, float (&v)[BLOCK]) {
    Raw<DT> raw;
    load_raw<DT>(src, off, cs, raw);
    widen<DT>(raw, v);
}

// NUMERICS: §0.1 amax - fmax over |v| from +0; NaN ignored, +inf kept.
NVFP4_HD float block_amax(const float (&v)[BLOCK]) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) a = fmax_nn(a, fabsf(v[i]));
    return a;
}

// ---- per-thread units ----------------------------------------------------------------------
// A unit is GROUP 16-element blocks of one thread: several independent loads in flight.
// Contiguous data (X read along its rows, whose blocks are consecutive in memory) is split into
// runs of GROUP * WARP blocks: lane l of a warp takes blocks l, l + WARP, ... of its run, so each
// load instruction of a warp reads one contiguous span and the 8-byte code stores are contiguous.
constexpr int GROUP = 4;
constexpr int WARP = 32;

NVFP4_HD i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Units needed to cover n_blocks contiguous blocks (whole warps of GROUP-block units).
NVFP4_HD i64 contiguous_units(i64 n_blocks) { return ceil_div(n_blocks, (i64)GROUP * WARP) * WARP; }

// Block j of contiguous unit `unit`.
NVFP4_HD i64 contiguous_block(i64 unit, int j) { return ((unit / WARP) * GROUP + j) * WARP + unit % WARP; }

// amax of unit `unit` of a contiguous tensor of n_blocks 16-element blocks.
template <int DT>
NVFP4_HD float amax_unit(const void* x, i64 n_blocks, i64 unit) {
    Raw<DT> raw[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        const i64 b = contiguous_block(unit, j);
        if (b < n_blocks) load_raw<DT>(x, b * BLOCK, 1, raw[j]);
    }
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        if (contiguous_block(unit, j) < n_blocks) {
            float v[BLOCK];
            widen<DT>(raw[j], v);
            a = fmax_nn(a, block_amax(v));
        }
    }
    return a;
}

// amaxes of GROUP column chunks of bf16 X [M, K] (unit = g * K + k: k fastest): the bf16 RHT
// output's into *rht, and the plain values' into *plain.
NVFP4_HD void rht_amax_unit(const void* x, i64 m_rows, i64 k_cols, i64 unit, float* rht, float* plain) {
    const i64 nb = m_rows / BLOCK, k = unit % k_cols, b0 = unit / k_cols * GROUP;
    Raw<IN_BF16> raw[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j)
        if (b0 + j < nb) load_raw<IN_BF16>(x, (b0 + j) * BLOCK * k_cols + k, k_cols, raw[j]);
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        if (b0 + j < nb) {
            float v[BLOCK], t[BLOCK];
            widen<IN_BF16>(raw[j], v);
            rht16(v, t);
            *rht = fmax_nn(*rht, block_amax(t));
            *plain = fmax_nn(*plain, block_amax(v));
        }
    }
}

// amax of 16x16 tile `unit` of X [M, K] (unit = tm * K/16 + tk). NUMERICS: §5.5 2-D.
template <int DT>
NVFP4_HD float tile_amax_unit(const void* x, i64 k_cols, i64 unit) {
    const i64 nbk = k_cols / BLOCK, tm = unit / nbk, tk = unit % nbk;
    float a = 0.0f;
#pragma unroll 4
    for (int row = 0; row < BLOCK; ++row) {
        float v[BLOCK];
        load_block<DT>(x, (tm * BLOCK + row) * k_cols + tk * BLOCK, 1, v);
        a = fmax_nn(a, block_amax(v));
    }
    return a;
}

struct QuantArgs {
    const void* src;         // high-precision input X [M, K], contiguous
    i64 rows, cols;          // the copy's logical [R, C]: rowwise [M, K], colwise [K, M]
    const float* amax_g;     // [1] global amax A_g of this copy
    const float* tile_amax;  // 2-D: [M/16, K/16] tile amaxes (IS_2D builds only)
    u64 seed;                // SR key (STOCHASTIC builds only)
    u32 stream;              // SR stream of this copy
    u8* data;                // [R, C/2] packed codes
    u8* scale;               // [>= R, scale_stride] UE4M3 block scales
    i64 scale_stride;
};

// Element (r, c) of the copy: rowwise X[r, c] = src[r * C + c]; colwise X^T[r, c] = src[c * R + r].
template <bool ROWWISE>
NVFP4_HD i64 copy_offset(const QuantArgs& a, i64 r, i64 c) {
    return ROWWISE ? r * a.cols + c : c * a.rows + r;
}

// Encode block (r, cb) of the copy from its 16 values. NUMERICS: §5.1-§5.5, §5.7, §5.9.
template <bool ROWWISE, bool SR, bool TILE2D>
NVFP4_HD void encode_block(const QuantArgs& a, GlobalScale g, i64 r, i64 cb, const float (&v)[BLOCK]) {
    float amax_b;
    if (TILE2D) {
        // NUMERICS: §5.5 - the 16x16 tile amax stands for every row's block amax; the tile of the
        // colwise copy's (k, m-block b) is tile[b, k/16].
        const i64 tiles_k = (ROWWISE ? a.cols : a.rows) / BLOCK;
        amax_b = ROWWISE ? a.tile_amax[(r / BLOCK) * tiles_k + cb] : a.tile_amax[cb * tiles_k + r / BLOCK];
    } else {
        amax_b = block_amax(v);
    }
    const BlockScale s = block_scale(amax_b, g);

    u32 codes[BLOCK];
    if (SR) {
        // NUMERICS: §5.7 - L = r * C + c in the copy's own layout; group L / 4, byte L % 4 of x0.
        const u64 l0 = (u64)(r * a.cols + cb * BLOCK);  // a multiple of 16
#pragma unroll
        for (int q = 0; q < BLOCK / 4; ++q) {
            const u32 word = sr_word(l0 / 4 + q, a.stream, a.seed);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                codes[4 * q + i] = e2m1_sr(mul_rn(v[4 * q + i], s.f), (word >> (SR_BITS * i)) & ((1u << SR_BITS) - 1u));
        }
    } else {
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) codes[i] = e2m1_rn(mul_rn(v[i], s.f));  // NUMERICS: §5.4 y = RN(x * f)
    }

    // NUMERICS: §5.4 - byte j = code[2j] | code[2j+1] << 4 (even element in the low nibble).
    u32 lo = 0u, hi = 0u;
#pragma unroll
    for (int i = 0; i < BLOCK / 2; ++i) {
        lo |= codes[i] << (ELEM_BITS * i);
        hi |= codes[BLOCK / 2 + i] << (ELEM_BITS * i);
    }
    u8* out = a.data + r * (a.cols / 2) + cb * (BLOCK / 2);
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint2*>(out) = make_uint2(lo, hi);  // 8-byte aligned: C/2 and cb*8 are multiples of 8
#else
    for (int i = 0; i < 4; ++i) {
        out[i] = (u8)(lo >> (8 * i));
        out[4 + i] = (u8)(hi >> (8 * i));
    }
#endif
    a.scale[r * a.scale_stride + cb] = (u8)s.code;
}

// Quantize unit `unit` of the copy. Rowwise: GROUP blocks of X's contiguous block sequence
// (contiguous_block); colwise: row r = k of X^T, GROUP consecutive m-blocks, consecutive units taking
// consecutive k (coalesced strided reads of X). RHT: the 16-point transform of each colwise block
// (NUMERICS.md §5.6).
template <bool ROWWISE>
NVFP4_HD bool unit_block(const QuantArgs& a, i64 unit, int j, i64& r, i64& cb) {
    const i64 nbc = a.cols / BLOCK;
    if (ROWWISE) {  // blocks of X's rows are consecutive in memory: block id b = r * C/16 + cb
        const i64 b = contiguous_block(unit, j);
        r = b / nbc;
        cb = b % nbc;
        return b < a.rows * nbc;
    }
    r = unit % a.rows;  // consecutive units take consecutive k, each GROUP consecutive m-blocks
    cb = unit / a.rows * GROUP + j;
    return cb < nbc;
}

template <int DT, bool ROWWISE, bool RHT_ON, bool SR, bool TILE2D>
NVFP4_HD void quantize_unit(const QuantArgs& a, i64 unit) {
    const i64 step = ROWWISE ? 1 : a.rows;  // offset between consecutive elements of a copy row
    Raw<DT> raw[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        i64 r, cb;
        if (unit_block<ROWWISE>(a, unit, j, r, cb)) load_raw<DT>(a.src, copy_offset<ROWWISE>(a, r, cb * BLOCK), step, raw[j]);
    }
    const GlobalScale g = global_scale(*a.amax_g);
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        i64 r, cb;
        if (!unit_block<ROWWISE>(a, unit, j, r, cb)) continue;
        float v[BLOCK];
        widen<DT>(raw[j], v);
        if (RHT_ON) {
            float t[BLOCK];
            rht16(v, t);
            encode_block<ROWWISE, SR, TILE2D>(a, g, r, cb, t);
        } else {
            encode_block<ROWWISE, SR, TILE2D>(a, g, r, cb, v);
        }
    }
}

// Dequantize block `unit` (= r * C/16 + cb) of a copy [R, C] into fp32. NUMERICS: §5.8.
NVFP4_HD void dequantize_unit(const u8* data, const u8* scale, i64 scale_stride, const float* amax_g, i64 cols,
                              float* out, i64 unit) {
    const i64 nbc = cols / BLOCK, r = unit / nbc, cb = unit % nbc;
    const float g = decode_factor(scale[r * scale_stride + cb], *amax_g);
    const u8* in = data + r * (cols / 2) + cb * (BLOCK / 2);
    float* o = out + r * cols + cb * BLOCK;
    const u32 mask = (1u << ELEM_BITS) - 1u;
#pragma unroll
    for (int j = 0; j < BLOCK / 2; ++j) {
        const u32 byte = in[j];
        o[2 * j] = mul_rn(e2m1_value(byte & mask), g);
        o[2 * j + 1] = mul_rn(e2m1_value(byte >> ELEM_BITS), g);
    }
}

// The copy modes of this build come from defines_for(config): RHT (columnwise copy of bf16 input
// only, NUMERICS.md §5.6), STOCHASTIC (§5.7), IS_2D (§5.5).
#if !defined(RHT) || !defined(STOCHASTIC) || !defined(IS_2D)
#error "nvfp4.cu needs RHT, STOCHASTIC and IS_2D (native/_compile.defines_for)"
#endif
constexpr bool kSr = STOCHASTIC != 0;
constexpr bool k2d = IS_2D != 0;
template <int DT>
struct Modes {
    static constexpr bool rht_colwise = RHT != 0 && DT == IN_BF16;
};

}  // namespace nvfp4

// ---- kernels ---------------------------------------------------------------------------------
using namespace nvfp4;

#define NVFP4_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Combine per-thread amaxes (all >= +0) into *out with an integer max on the bits (NUMERICS.md
// §0.1: valid because every value is >= +0): warp shuffle, then shared memory, one atomic per block.
__device__ __forceinline__ void amax_commit(float a, u32* out) {
    __shared__ u32 warp_max[32];
    u32 b = __float_as_uint(a);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xFFFFFFFFu, b, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    __syncthreads();  // a previous amax_commit of this block may still be reading warp_max
    if (lane == 0) warp_max[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = lane < n_warps ? warp_max[lane] : 0u;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(0xFFFFFFFFu, b, off));
        if (lane == 0) atomicMax(out, b);
    }
}

#define NVFP4_THREADS 256

#define NVFP4_QUANT_PARAMS                                                                             \
    const void *src, i64 rows, i64 cols, const float *amax_g, const float *tile_amax, u64 seed, u32 stream, \
        u8 *data, u8 *scale, i64 scale_stride
#define NVFP4_QUANT_ARGS {src, rows, cols, amax_g, tile_amax, seed, stream, data, scale, scale_stride}

// Per input dtype: amax(X) (units of GROUP blocks), 16x16 tile amaxes, and the two copies.
#define NVFP4_INSTANTIATE(SUFFIX, DT)                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)                                                  \
        nvfp4_amax_##SUFFIX(const void* x, i64 n_blocks, u32* out) {                                             \
        float a = 0.0f;                                                                                          \
        NVFP4_GRID_STRIDE(u, contiguous_units(n_blocks)) a = fmax_nn(a, amax_unit<DT>(x, n_blocks, u));         \
        amax_commit(a, out);                                                                                     \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)                                                  \
        nvfp4_tile_amax_##SUFFIX(const void* x, i64 k_cols, i64 n_tiles, float* out) {                           \
        NVFP4_GRID_STRIDE(u, n_tiles) out[u] = tile_amax_unit<DT>(x, k_cols, u);                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_quantize_rowwise_##SUFFIX(NVFP4_QUANT_PARAMS) { \
        const QuantArgs a = NVFP4_QUANT_ARGS;                                                                    \
        NVFP4_GRID_STRIDE(u, contiguous_units(rows * (cols / BLOCK))) quantize_unit<DT, true, false, kSr, k2d>(a, u); \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(NVFP4_THREADS) nvfp4_quantize_colwise_##SUFFIX(NVFP4_QUANT_PARAMS) { \
        const QuantArgs a = NVFP4_QUANT_ARGS;                                                                    \
        NVFP4_GRID_STRIDE(u, rows * ceil_div(cols / BLOCK, GROUP))                                              \
        quantize_unit<DT, false, Modes<DT>::rht_colwise, kSr, k2d>(a, u);                                        \
    }

NVFP4_INSTANTIATE(f32, IN_F32)
NVFP4_INSTANTIATE(bf16, IN_BF16)
NVFP4_INSTANTIATE(f16, IN_F16)

// Post-RHT amax of the columnwise copy (bf16 X [M, K]) into *out_rht, and amax(X) into *out_plain
// (the rowwise copy's A_g, read in the same pass). Units of GROUP column chunks. NUMERICS: §5.6, §0.1.
extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)
    nvfp4_rht_amax(const void* x, i64 m_rows, i64 k_cols, u32* out_rht, u32* out_plain) {
    float a_rht = 0.0f, a_plain = 0.0f;
    NVFP4_GRID_STRIDE(u, ceil_div(m_rows / BLOCK, GROUP) * k_cols) rht_amax_unit(x, m_rows, k_cols, u, &a_rht, &a_plain);
    amax_commit(a_rht, out_rht);
    amax_commit(a_plain, out_plain);
}

extern "C" __global__ void __launch_bounds__(NVFP4_THREADS)
    nvfp4_dequantize(const u8* data, const u8* scale, i64 scale_stride, const float* amax_g, i64 rows, i64 cols,
                     float* out) {
    NVFP4_GRID_STRIDE(u, rows * (cols / BLOCK)) dequantize_unit(data, scale, scale_stride, amax_g, cols, out, u);
}
