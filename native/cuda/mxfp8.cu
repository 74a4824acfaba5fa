// MXFP8 quantization (E4M3/E5M2 data, UE8M0 scale per 32 elements; 1x32 or 32x32 tiles) and its
// dequantization. Source: docs/numerics.md §3, §0.5 (e8m0_up / e8m0_floor, P(e), D(e)); TE
// common/cast/mxfp8/quantize_mxfp8.cuh.
// schemes: mxfp8
#include "common.cuh"
#include "dependent_launch.cuh"

#ifndef SCHEME_MXFP8
#error "mxfp8.cu needs the defines of an mxfp8 config"
#endif

using namespace nh;

constexpr int kMx = 32;                    // MX block length (docs/numerics.md §3)
constexpr int kMxPerTile = kTile / kMx;    // 4 blocks per tile side
constexpr int kLanesPerMx = kMx / kVec;    // 4 lanes cover one 1x32 block
static_assert(BLOCK == kMx, "mxfp8 blocks are 32 long");

// NUMERICS: §3 - the block exponent from the block amax A:
// ceil (default): e = e8m0_up(RN(A * fl(1/fp8_max))), a multiply by the rounded constant;
// floor (OCP MX): e = e8m0_floor(A).
__device__ __forceinline__ unsigned int mx_exponent(float A) {
#if E8M0_CEIL
  return e8m0_up(__fmul_rn(A, ELEM_RECIP_MAX));
#else
  return e8m0_floor(A);
#endif
}

// The CTA's shared memory, one instance for both builds of the tile body.
struct MxShared {
  union {
    float f[kWarps][kMxPerTile][kTile];              // fp32 input: per-warp column amax of each 32-row block
    unsigned int w[kWarps][kMxPerTile][kTile / 2];   // 16-bit input: the same, packed per column pair
  } col_part;
#if IS_2D
  float col_amax[kMxPerTile][kTile];             // block amax of (b, column)
#endif
  unsigned int col_e[kMxPerTile][kTile];         // colwise exponent of block (b, column)
  __align__(16) float col_P[kMxPerTile][kTile];  // its quantization multiplier P(e)
#if IS_2D
  unsigned int tile_e[kMxPerTile][kMxPerTile];  // 32x32 tile exponents [row block][col block]
#endif
};

// One CTA quantizes one 128x128 tile (M, K multiples of 32; partial tiles in whole 32-blocks).
// Rowwise data [M, K], scales S_r [roundup(M,128), ld_r = roundup(K/32,4)] entry [m, kb].
// Colwise data [M, K] (NOT transposed), scales S_c [roundup(M/32,4), ld_c = roundup(K,128)] entry [mb, k].
// The kernel writes every scale byte, the zero padding included (the outputs may be uninitialised).
// FULL: an interior tile (tile_interior): no bounds checks, vector loads and stores only.
template <typename T, bool FULL>
__device__ __forceinline__ void mx_quantize(MxShared& sh, const T* __restrict__ x, i64 M, i64 K, const TileOrigin& tile,
                                            int vec_in, int vec_out,
                                            unsigned char* __restrict__ q_row, unsigned char* __restrict__ s_r,
                                            i64 ld_r, unsigned char* __restrict__ q_col,
                                            unsigned char* __restrict__ s_c, i64 ld_c) {
  auto& col_e = sh.col_e;
  auto& col_P = sh.col_P;
#if IS_2D
  auto& tile_e = sh.tile_e;
#endif
  const i64 m0 = tile.m0, k0 = tile.k0;
  const TileThread th;
  TileVals<T> v;
  load_tile<FULL>(x, M, K, m0, k0, vec_in != 0, th, v);
  const i64 kcol = k0 + th.col0();

  // Column amax per 32-row block b: rows 32b..32b+31 of the tile are passes 2b and 2b+1. First per
  // warp (its two rows of each pass, the lanes l and l ^ 16), then over the 8 warps: one column pair
  // of one block per thread. NUMERICS: §0.1 amax - fmax over |v| from +0, NaN ignored; 16-bit inputs
  // stay packed (max2 of abs2: exact, NaN-ignoring; a lane that saw only NaNs drops out at the +0
  // start of the next max), fp32 through amax_step.
  const bool need_cols = (q_col != nullptr) || IS_2D;
  if (need_cols) {
    static_assert(kMxPerTile * kTile / 2 == kThreads, "one column pair of one block per thread");
    if constexpr (sizeof(T) == 2) {
      const T* tag = nullptr;
#pragma unroll
      for (int b = 0; b < kMxPerTile; ++b)
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          unsigned int m = max2(abs2(v.w[2 * b][i]), abs2(v.w[2 * b + 1][i]), tag);
          m = max2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 16), tag);
          if (th.rsub == 0) sh.col_part.w[th.w][b][th.col0() / 2 + i] = m;
        }
    } else {
#pragma unroll
      for (int b = 0; b < kMxPerTile; ++b)
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float a = amax_step(amax_step(0.0f, v.at(2 * b, j)), v.at(2 * b + 1, j));
          a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 16));
          if (th.rsub == 0) sh.col_part.f[th.w][b][th.col0() + j] = a;
        }
    }
    __syncthreads();
    const int b = static_cast<int>(threadIdx.x) / (kTile / 2), c = 2 * (static_cast<int>(threadIdx.x) % (kTile / 2));
    float A[2] = {0.0f, 0.0f};  // block amax of columns c and c + 1
    if constexpr (sizeof(T) == 2) {
      const T* tag = nullptr;
      unsigned int m = 0u;  // +0 in both lanes
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = max2(m, sh.col_part.w[w][b][c / 2], tag);
      A[0] = fmaxf(0.0f, widen_lo(m, tag));
      A[1] = fmaxf(0.0f, widen_hi(m, tag));
    } else {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        A[0] = fmaxf(A[0], sh.col_part.f[w][b][c]);
        A[1] = fmaxf(A[1], sh.col_part.f[w][b][c + 1]);
      }
    }
#if IS_2D
    sh.col_amax[b][c] = A[0];
    sh.col_amax[b][c + 1] = A[1];
    __syncthreads();
    // NUMERICS: §3 2-D - one exponent per 32x32 tile, used by both copies (identical data).
    if (threadIdx.x < kMxPerTile * kMxPerTile) {
      const int tb = threadIdx.x / kMxPerTile, g = threadIdx.x % kMxPerTile;
      float T32 = 0.0f;
      for (int cc = 0; cc < kMx; ++cc) T32 = fmaxf(T32, sh.col_amax[tb][g * kMx + cc]);
      tile_e[tb][g] = mx_exponent(T32);
    }
#else
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const unsigned int ex = mx_exponent(A[e]);
      col_e[b][c + e] = ex;
      col_P[b][c + e] = e8m0_multiplier(ex);
    }
#endif
    __syncthreads();
  }

  const bool vec = vec_out != 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const i64 m = m0 + th.row(p);
    const bool in = FULL || (m < M && kcol < K);
    float r[kVec];
    tile_row(v, p, r);  // widened once, read by both copies
#if IS_2D
    const unsigned int e = tile_e[p / 2][th.cl / kLanesPerMx];
    const uint2 q = sat_elem8_mul(r, e8m0_multiplier(e));  // NUMERICS: §3 q = sat(RN(x*P(e)))
    if (in) {
      if (q_row) store8<FULL>(q_row + th.offset(m0, k0, K, p), q, K - kcol, vec);
      if (q_col) store8<FULL>(q_col + th.offset(m0, k0, K, p), q, K - kcol, vec);
      if (q_row && (th.cl % kLanesPerMx) == 0) s_r[m * ld_r + kcol / kMx] = static_cast<unsigned char>(e);
    }
#else
    if (q_row) {
      // NUMERICS: §3 rowwise 1x32 - block (m, kb) = x[m, 32 kb .. +31].
      float a = 0.0f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) a = amax_step(a, r[j]);
      a = group_max<kLanesPerMx>(a);
      const unsigned int e = mx_exponent(a);
      const uint2 q = sat_elem8_mul(r, e8m0_multiplier(e));
      if (in) {
        store8<FULL>(q_row + th.offset(m0, k0, K, p), q, K - kcol, vec);
        if ((th.cl % kLanesPerMx) == 0) s_r[m * ld_r + kcol / kMx] = static_cast<unsigned char>(e);
      }
    }
    if (q_col) {
      // NUMERICS: §3 colwise 32x1 - block (mb, k) = x[32 mb .. +31, k], same [M, K] layout.
      // P(e) of the 8 columns' block p / 2, precomputed once per tile (two 16-byte shared loads).
      const float4 pa = *reinterpret_cast<const float4*>(&col_P[p / 2][th.col0()]);
      const float4 pb = *reinterpret_cast<const float4*>(&col_P[p / 2][th.col0() + 4]);
      const float P8[kVec] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
      const uint2 q = sat_elem8_mul(r, P8);
      if (in) store8<FULL>(q_col + th.offset(m0, k0, K, p), q, K - kcol, vec);
    }
#endif
  }

  // Rowwise scale padding S_r[m, kb] for m >= M or 32 kb >= K inside this tile's 128 x 4 region (the
  // tiles' regions cover the padded array exactly: roundup(M, 128) rows, roundup(K/32, 4) columns).
  if (q_row && !FULL && (m0 + kTile > M || k0 + kTile > K)) {
    for (int idx = threadIdx.x; idx < kTile * kMxPerTile; idx += kThreads) {
      const i64 m = m0 + idx / kMxPerTile, kb = k0 / kMx + idx % kMxPerTile;
      if (m >= M || kb * kMx >= K) s_r[m * ld_r + kb] = 0;
    }
  }
  // Colwise scales S_c[mb, k]: 4 row blocks x 128 columns of this tile, zero in the padding (the
  // regions cover roundup(M/32, 4) rows and roundup(K, 128) columns exactly).
  if (q_col) {
    for (int idx = threadIdx.x; idx < kMxPerTile * kTile; idx += kThreads) {
      const int b = idx / kTile, c = idx % kTile;
      const i64 mb = m0 / kMx + b, k = k0 + c;
      const bool valid = mb * kMx < M && k < K;
#if IS_2D
      s_c[mb * ld_c + k] = valid ? static_cast<unsigned char>(tile_e[b][c / kMx]) : 0;
#else
      s_c[mb * ld_c + k] = valid ? static_cast<unsigned char>(col_e[b][c]) : 0;
#endif
    }
  }
}

#define NH_MX_QUANTIZE(SUFFIX, T)                                                                            \
  extern "C" __global__ void __launch_bounds__(kThreads, TileMinBlocks<T>::value)                               \
      mxfp8_quantize_##SUFFIX(const T* x, i64 M, i64 K, int vec_in, int vec_out, unsigned char* q_row,      \
                              unsigned char* s_r, i64 ld_r, unsigned char* q_col, unsigned char* s_c,      \
                              i64 ld_c) {                                                                  \
    wait_for_prior_grid(); /* a plan launches it programmatically: X, outputs only after the grid before */  \
    __shared__ MxShared sh;                                                                                  \
    const TileOrigin tile = tile_origin(K);                                                                  \
    if (tile_interior(tile, M, K, vec_in && vec_out))                                                        \
      mx_quantize<T, true>(sh, x, M, K, tile, vec_in, vec_out, q_row, s_r, ld_r, q_col, s_c, ld_c);             \
    else                                                                                                     \
      mx_quantize<T, false>(sh, x, M, K, tile, vec_in, vec_out, q_row, s_r, ld_r, q_col, s_c, ld_c);            \
    allow_dependent_launch(); /* the next call's kernel may start as these CTAs end (it waits) */            \
  }
NH_MX_QUANTIZE(f32, float)
NH_MX_QUANTIZE(bf16, __nv_bfloat16)
NH_MX_QUANTIZE(f16, __half)

// NUMERICS: §3 dequantization - x_hat = RN_out(RN(D(e) * dec(q))); both copies are [M, K].
template <typename O>
__device__ __forceinline__ void mx_dequantize(const unsigned char* __restrict__ q, const unsigned char* __restrict__ s,
                                              i64 ld_s, i64 M, i64 K, int colwise, O* __restrict__ out) {
  const i64 n = M * K;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 m = i / K, k = i % K;
    const unsigned int e = colwise ? s[(m / kMx) * ld_s + k] : s[m * ld_s + k / kMx];
    store_out(out + i, __fmul_rn(e8m0_decode(e), decode_elem(q[i])));
  }
}

#define NH_MX_DEQUANTIZE(SUFFIX, O)                                                                          \
  extern "C" __global__ void mxfp8_dequantize_##SUFFIX(const unsigned char* q, const unsigned char* s,       \
                                                       i64 ld_s, i64 M, i64 K, int colwise, O* out) {       \
    mx_dequantize<O>(q, s, ld_s, M, K, colwise, out);                                                        \
  }
NH_MX_DEQUANTIZE(f32, float)
NH_MX_DEQUANTIZE(bf16, __nv_bfloat16)
NH_MX_DEQUANTIZE(f16, __half)
