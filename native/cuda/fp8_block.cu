// FP8 blockwise quantization (1x128 and 128x128 tiles, fp32 scales) and its dequantization.
// Source: docs/numerics.md §4 (scale rule, layouts), §1 compute_scale; TE
// common/transpose/quantize_transpose_{vector,square}_blockwise.cu.
// schemes: fp8_block
#include "common.cuh"
#include "dependent_launch.cuh"

#ifndef SCHEME_FP8_BLOCK
#error "fp8_block.cu needs the defines of an fp8_block config"
#endif

using namespace nh;

// The CTA's shared memory, one instance for both builds of the tile body.
struct BlockShared {
  __align__(16) unsigned char qT[kTile * kTransposePitch];  // transposed colwise codes
  float col_part[kWarps][kTile];
  float row_amax[kTile];   // 1-D: amax of tile row r (its 128-block)
  float row_scale[kTile];  // and its scale s
  float col_scale[kTile];
};

// One CTA quantizes one 128x128 tile (partial at the edges) of x [M, K], both orientations in one pass.
// Rowwise: data [M, K]; sinv 1-D [ceil(K/128), ld_sr = roundup(M,4)] entry [kb, m] (stored TRANSPOSED),
//          2-D [ceil(M/128), ld_sr = roundup(ceil(K/128),4)] entry [mb, kb].
// Colwise: data [K, M] (transposed); sinv 1-D [ceil(M/128), ld_sc = roundup(K,4)] entry [mb, k],
//          2-D [ceil(K/128), ld_sc = roundup(ceil(M/128),4)] entry [kb, mb].
// The kernel writes every scale, the zero padding included (the outputs may be uninitialised).
// FULL: an interior tile (tile_interior): no bounds checks, vector loads and stores only.
template <typename T, bool FULL>
__device__ __forceinline__ void block_quantize(BlockShared& sh, const T* __restrict__ x, i64 M, i64 K,
                                               const TileOrigin& tile, int vec_in, int vec_row, int vec_col,
                                               unsigned char* __restrict__ q_row,
                                               float* __restrict__ s_row, i64 ld_sr,
                                               unsigned char* __restrict__ q_col, float* __restrict__ s_col,
                                               i64 ld_sc) {
  unsigned char* qT = sh.qT;
  auto& col_part = sh.col_part;
  auto& row_amax = sh.row_amax;
  auto& row_scale = sh.row_scale;
  auto& col_scale = sh.col_scale;

  const i64 n_kt = (K + kTile - 1) / kTile, n_mt = (M + kTile - 1) / kTile;
  const i64 mt = tile.mt, kt = tile.kt, m0 = tile.m0, k0 = tile.k0;
  const TileThread th;
  TileVals<T> v;
  load_tile<FULL>(x, M, K, m0, k0, vec_in != 0, th, v);

  const float fp8_max = ELEM_MAX;
  const float v_inf = InputMax<T>::value;  // NUMERICS: §4 v_inf = max finite of the INPUT dtype
  const i64 kcol = k0 + th.col0();

#if IS_2D
  // NUMERICS: §4 2-D - one amax, one scale per 128x128 tile; colwise data is the exact transpose.
  float a = 0.0f;
#pragma unroll
  for (int p = 0; p < kPasses; ++p)
#pragma unroll
    for (int j = 0; j < kVec; ++j) a = amax_step(a, v.at(p, j));
  a = group_max<32>(a);
  if ((threadIdx.x & 31) == 0) col_part[0][th.w] = a;
  __syncthreads();
  float A = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) A = fmaxf(A, col_part[0][w]);
  const float s = compute_scale(A, fp8_max, POW2 != 0, EPS, v_inf);
  if (threadIdx.x == 0) {
    // This tile's sinv, and the zero padding of the scale rows (written by the last tile of each row).
    const float sinv = scale_inverse(s);
    if (s_row) {
      s_row[mt * ld_sr + kt] = sinv;
      if (kt == n_kt - 1)
        for (i64 j = n_kt; j < ld_sr; ++j) s_row[mt * ld_sr + j] = 0.0f;
    }
    if (s_col) {
      s_col[kt * ld_sc + mt] = sinv;
      if (mt == n_mt - 1)
        for (i64 j = n_mt; j < ld_sc; ++j) s_col[kt * ld_sc + j] = 0.0f;
    }
  }
  // NUMERICS: §4 q = sat(RN(x*s)) with the tile's one scale, both copies.
  quantize_tile_one_scale<FULL>(v, s, th, m0, k0, M, K, q_row, vec_row != 0, q_col ? qT : nullptr);
#else
  // 1-D: the amaxes first - rowwise block (m, kb) = x[m, 128 kb .. +127] (16 lanes of one row), colwise
  // block (mb, k) = x[128 mb .. +127, k] (per-warp partial maxima) -, then 128 threads compute the
  // row scales and 128 the column scales (one division each), then both copies are quantized.
  if constexpr (sizeof(T) == 2) {
    // 16-bit inputs: |.| maxima on the packed pairs (max.{bf16,f16}x2), widened once per row / column.
    const T* tag = nullptr;
    unsigned int cw[kVec / 2] = {0u, 0u, 0u, 0u};  // this thread's column maxima, two columns per word
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      unsigned int aw[kVec / 2];
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) aw[i] = abs2(v.w[p][i]);
      if (q_row) {
        float a = lanes_amax(max2(max2(aw[0], aw[1], tag), max2(aw[2], aw[3], tag), tag), tag);
        a = group_max<kLanesPerRow>(a);
        if (th.cl == 0) row_amax[th.row(p)] = a;
      }
      if (q_col) {
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) cw[i] = max2(cw[i], aw[i], tag);  // +0 start: NaN lanes drop out
      }
    }
    if (q_col) {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        const unsigned int m = max2(cw[i], __shfl_xor_sync(0xFFFFFFFFu, cw[i], 16), tag);  // the warp's other row
        if (th.rsub == 0) {
          col_part[th.w][th.col0() + 2 * i] = fmaxf(0.0f, widen_lo(m, tag));
          col_part[th.w][th.col0() + 2 * i + 1] = fmaxf(0.0f, widen_hi(m, tag));
        }
      }
    }
  } else {
    float ca[kVec] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // this thread's column maxima
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      float r[kVec];
      tile_row(v, p, r);  // one widening for both amaxes
      if (q_row) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) a = amax_step(a, r[j]);
        a = group_max<kLanesPerRow>(a);
        if (th.cl == 0) row_amax[th.row(p)] = a;
      }
      if (q_col) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) ca[j] = amax_step(ca[j], r[j]);
      }
    }
    if (q_col) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float a = fmaxf(ca[j], __shfl_xor_sync(0xFFFFFFFFu, ca[j], 16));  // the other row of the warp's pair
        if (th.rsub == 0) col_part[th.w][th.col0() + j] = a;
      }
    }
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x) % kTile;
  if (q_row && threadIdx.x < kTile) {
    // NUMERICS: §4 1-D rowwise scale of row m0 + t; sinv stored transposed [kb, m], zero padding up to ld_sr.
    const float s = compute_scale(row_amax[t], fp8_max, POW2 != 0, EPS, v_inf);
    row_scale[t] = s;
    const i64 m = m0 + t;
    if (m < ld_sr) s_row[kt * ld_sr + m] = m < M ? scale_inverse(s) : 0.0f;
  }
  if (q_col && threadIdx.x >= kTile) {
    // NUMERICS: §4 1-D colwise scale of column k0 + t; sinv [mb, k], zero padding up to ld_sc.
    float A = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) A = fmaxf(A, col_part[w][t]);
    const float s = compute_scale(A, fp8_max, POW2 != 0, EPS, v_inf);
    col_scale[t] = s;
    const i64 k = k0 + t;
    if (k < ld_sc) s_col[mt * ld_sc + k] = k < K ? scale_inverse(s) : 0.0f;
  }
  __syncthreads();
  float sc[kVec];
  if (q_col) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sc[j] = col_scale[th.col0() + j];
  }
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    float r[kVec];
    tile_row(v, p, r);  // widened once, read by both copies
    if (q_row) {
      const uint2 q = sat_elem8_mul(r, row_scale[th.row(p)]);  // multiply by s, never / sinv
      const i64 m = m0 + th.row(p);
      if (FULL || (m < M && kcol < K)) store8<FULL>(q_row + th.offset(m0, k0, K, p), q, K - kcol, vec_row != 0);
    }
    if (q_col) {
      const uint2 q = sat_elem8_mul(r, sc);
      store_col_codes(qT, q, th, p);
    }
  }
#endif
  if (q_col) {
    __syncthreads();
    store_transposed<FULL>(qT, q_col, M, K, m0, k0, vec_col != 0);
  }
}

#define NH_BLOCK_QUANTIZE(SUFFIX, T)                                                                         \
  extern "C" __global__ void __launch_bounds__(kThreads, TileMinBlocks<T>::value)                               \
      fp8_block_quantize_##SUFFIX(const T* x, i64 M, i64 K, int vec_in, int vec_row, int vec_col,          \
                                  unsigned char* q_row, float* s_row, i64 ld_sr, unsigned char* q_col,     \
                                  float* s_col, i64 ld_sc) {                                               \
    wait_for_prior_grid(); /* a plan launches it programmatically: X, outputs only after the grid before */  \
    __shared__ BlockShared sh;                                                                               \
    const TileOrigin tile = tile_origin(K);                                                                  \
    if (tile_interior(tile, M, K, vec_in && vec_row && vec_col))                                             \
      block_quantize<T, true>(sh, x, M, K, tile, vec_in, vec_row, vec_col, q_row, s_row, ld_sr, q_col, s_col, ld_sc); \
    else                                                                                                     \
      block_quantize<T, false>(sh, x, M, K, tile, vec_in, vec_row, vec_col, q_row, s_row, ld_sr, q_col, s_col, ld_sc); \
    allow_dependent_launch(); /* the next call's kernel may start as these CTAs end (it waits) */            \
  }
NH_BLOCK_QUANTIZE(f32, float)
NH_BLOCK_QUANTIZE(bf16, __nv_bfloat16)
NH_BLOCK_QUANTIZE(f16, __half)

// NUMERICS: §4 dequantization - x_hat = RN_out(RN(dec(q) * sinv)), in the logical [M, K] orientation.
// colwise != 0 reads the [K, M] copy and its scales.
template <typename O>
__device__ __forceinline__ void block_dequantize(const unsigned char* __restrict__ q, const float* __restrict__ sinv,
                                                 i64 ld_s, i64 M, i64 K, int colwise, O* __restrict__ out) {
  const i64 n = M * K;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 m = i / K, k = i % K;
    unsigned char code;
    float s;
    if (!colwise) {
      code = q[m * K + k];
      s = IS_2D ? sinv[(m / kTile) * ld_s + k / kTile] : sinv[(k / kTile) * ld_s + m];
    } else {
      code = q[k * M + m];
      s = IS_2D ? sinv[(k / kTile) * ld_s + m / kTile] : sinv[(m / kTile) * ld_s + k];
    }
    store_out(out + i, __fmul_rn(decode_elem(code), s));
  }
}

#define NH_BLOCK_DEQUANTIZE(SUFFIX, O)                                                                       \
  extern "C" __global__ void fp8_block_dequantize_##SUFFIX(const unsigned char* q, const float* sinv,        \
                                                           i64 ld_s, i64 M, i64 K, int colwise, O* out) {   \
    block_dequantize<O>(q, sinv, ld_s, M, K, colwise, out);                                                  \
  }
NH_BLOCK_DEQUANTIZE(f32, float)
NH_BLOCK_DEQUANTIZE(bf16, __nv_bfloat16)
NH_BLOCK_DEQUANTIZE(f16, __half)
