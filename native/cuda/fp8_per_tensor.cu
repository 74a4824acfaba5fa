// Per-tensor FP8: current scaling (amax pass, scale, cast + transpose) and delayed scaling (cast with a
// stored scale that accumulates the step amax, and the fused amax-history update).
// Source: docs/numerics.md §1 (current), §2 (delayed); TE common/recipe/current_scaling.cu,
// common/recipe/delayed_scaling.cu, common/cast/fp8/quantize_fp8.cuh.
// schemes: fp8_current fp8_delayed
#include "common.cuh"
#include "dependent_launch.cuh"

#if !defined(SCHEME_FP8_CURRENT) && !defined(SCHEME_FP8_DELAYED)
#error "fp8_per_tensor.cu needs the defines of an fp8_current or fp8_delayed config"
#endif

using namespace nh;

// ---------------------------------------------------------------------------------------------
// amax over the whole tensor (fp8_current pass 1)
// ---------------------------------------------------------------------------------------------
// NUMERICS: §0.1 amax - any order/tree; partials combined by an integer max on the bit patterns.
// `amax` must hold +0 before the launch. vec_ok: base 16-byte aligned (8 elements per vector step).
template <typename T>
__device__ __forceinline__ void tensor_amax(const T* __restrict__ x, i64 n, int vec_ok, float* __restrict__ amax) {
  __shared__ float warp_part[32];
  float a = 0.0f;
  const i64 tid = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  i64 n_vec = 0;
  if (vec_ok) {
    n_vec = n / kVec;
    for (i64 i = tid; i < n_vec; i += stride) {
      float v[kVec];
      load8_vec<true>(x + i * kVec, v);  // at L2 evict-first priority: x is read only to reduce it
#pragma unroll
      for (int j = 0; j < kVec; ++j) a = amax_step(a, v[j]);
    }
  }
  for (i64 i = n_vec * kVec + tid; i < n; i += stride) a = amax_step(a, to_f32(x[i]));
  allow_dependent_launch();  // the cast kernel's CTAs may start as these finish (it waits for the amax)
  a = group_max<32>(a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warp_part[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x >> 5) ? warp_part[lane] : 0.0f;
    a = group_max<32>(a);
    // A plan's fill_given clears `amax` first (it let this kernel start once X was complete: the loads above are
    // safe); an ordinary launch returns at once.
    wait_for_prior_grid();
    if (lane == 0) atomic_amax(amax, a);
  }
}

#define NH_AMAX(SUFFIX, T)                                                                          \
  extern "C" __global__ void tensor_amax_##SUFFIX(const T* x, i64 n, int vec_ok, float* amax) {   \
    tensor_amax<T>(x, n, vec_ok, amax);                                                             \
  }
NH_AMAX(f32, float)
NH_AMAX(bf16, __nv_bfloat16)
NH_AMAX(f16, __half)

// ---------------------------------------------------------------------------------------------
// Cast with a per-tensor scale (+ transposed copy), optionally accumulating the amax (delayed)
// ---------------------------------------------------------------------------------------------
// The CTA's shared memory, one instance for both builds of the tile body.
struct CastShared {
  __align__(16) unsigned char qT[kTile * kTransposePitch];  // transposed colwise codes
  float warp_part[kWarps];
};

// q = sat(RN(x * s)) (one fp32 multiply, no FMA) into q_row [M, K] and/or q_col [K, M]
// (byte-exact transpose).
// Current scaling (amax_in non-null, the finished amax pass): every CTA derives s from amax_in[0]
// (docs/numerics.md §1: s = compute_scale(A, fp8_max, pow2, eps, v_inf = FLT_MAX)); CTA 0 stores it in
// scale[0], sinv = RN(1/s) in sinv[0], and the second copy's own amax_copy / sinv_copy (may be null).
// A given amax (TE's quantize_with_amax): amax_in is the caller's tensor, read in stream order, and CTA 0 also
// stores its value in amax_store (the result's own amax slot: no copy before the launch).
// Delayed scaling (amax_in null): s = scale[0]; sinv (if non-null) receives RN(1/s); amax_acc (if
// non-null) receives fmax(amax_acc, amax(x)) (docs/numerics.md §2: H[0] <- fmax(H[0], amax(x)), amax of the
// UNSCALED input). With `done` (a zeroed counter), the last CTA to finish then records the finished amax:
// history[0] <- fmaxf(history[0], amax) (if non-null) and the second copy's amax_copy / sinv_copy (no launch,
// torch op or copy after the cast).
// FULL: an interior tile (tile_interior): no bounds checks, vector loads and stores only.
template <typename T, bool FULL>
__device__ __forceinline__ void per_tensor_cast(CastShared& sh, const T* __restrict__ x, i64 M, i64 K,
                                                const TileOrigin& tile, int vec_in, int vec_row,
                                                int vec_col, const float* __restrict__ amax_in,
                                                float* __restrict__ scale, float* __restrict__ sinv,
                                                float* __restrict__ amax_acc, float* __restrict__ amax_copy,
                                                float* __restrict__ sinv_copy, float* __restrict__ amax_store,
                                                float* __restrict__ history, unsigned int* __restrict__ done,
                                                unsigned char* __restrict__ q_row,
                                                unsigned char* __restrict__ q_col) {
  unsigned char* qT = sh.qT;
  float* warp_part = sh.warp_part;
  const i64 m0 = tile.m0, k0 = tile.k0;
  const TileThread th;
  TileVals<T> v;
  load_tile<FULL>(x, M, K, m0, k0, vec_in != 0, th, v);
  // A plan launches the cast programmatically after its amax kernel or fill_given (X was complete when that one
  // started): the tile above is read first; the amax, the scale and the slots only after that grid is done
  // (docs/design.md §4.1). An ordinary launch (the full path, a call's first launch) returns at once.
  wait_for_prior_grid();
  const float s = amax_in ? compute_scale(amax_in[0], ELEM_MAX, POW2 != 0, EPS, FP32_MAX) : scale[0];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float si = scale_inverse(s);  // NUMERICS: §1/§2 sinv = RN(1/s)
    if (sinv) sinv[0] = si;
    if (amax_in) {  // current scaling: the amax is final before the launch
      scale[0] = s;
      if (amax_store) amax_store[0] = amax_in[0];  // NUMERICS: §1 - the given amax is the result's amax
      if (amax_copy) amax_copy[0] = amax_in[0];
      if (sinv_copy) sinv_copy[0] = si;
    }
  }

  if (amax_acc) {
    float a = 0.0f;
#pragma unroll
    for (int p = 0; p < kPasses; ++p)
#pragma unroll
      for (int j = 0; j < kVec; ++j) a = amax_step(a, v.at(p, j));
    a = group_max<32>(a);
    if ((threadIdx.x & 31) == 0) warp_part[th.w] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
      float A = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) A = fmaxf(A, warp_part[w]);
      atomic_amax(amax_acc, A);
      if (done) {  // the last CTA (threadFenceReduction pattern) sees every CTA's atomic_amax
        __threadfence();
        const unsigned int n_ctas = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(done, 1u) == n_ctas - 1) {
          __threadfence();
          // (an atomic read of the finished amax, at the L2 where the atomics landed)
          const float a = __uint_as_float(atomicMax(reinterpret_cast<unsigned int*>(amax_acc), 0u));
          if (history) history[0] = fmaxf(history[0], a);  // NUMERICS: §2 H[0] <- fmax(H[0], amax(x)); §0.1 NaN ignored
          if (amax_copy) amax_copy[0] = a;  // NUMERICS: §1/§2 the colwise copy's own amax and sinv, equal values
          if (sinv_copy) sinv_copy[0] = scale_inverse(s);
        }
      }
    }
  }

  // NUMERICS: §1 q = sat(RN(x*s)) for both copies (the colwise copy is the byte-exact transpose).
  quantize_tile_one_scale<FULL>(v, s, th, m0, k0, M, K, q_row, vec_row != 0, q_col ? qT : nullptr);
  allow_dependent_launch();  // a later call's first launch (fill_given) may start; it waits for this grid first
  if (q_col) {
    __syncthreads();
    store_transposed<FULL>(qT, q_col, M, K, m0, k0, vec_col != 0);
  }
}

#define NH_CAST(SUFFIX, T)                                                                                  \
  extern "C" __global__ void __launch_bounds__(kThreads, TileMinBlocks<T>::value)                               \
      per_tensor_cast_##SUFFIX(const T* x, i64 M, i64 K, int vec_in, int vec_row, int vec_col,            \
                               const float* amax_in, float* scale, float* sinv, float* amax_acc,          \
                               float* amax_copy, float* sinv_copy, float* amax_store, float* history,     \
                               unsigned int* done, unsigned char* q_row, unsigned char* q_col) {          \
    __shared__ CastShared sh;                                                                             \
    const TileOrigin tile = tile_origin(K);                                                               \
    if (tile_interior(tile, M, K, vec_in && vec_row && vec_col))                                          \
      per_tensor_cast<T, true>(sh, x, M, K, tile, vec_in, vec_row, vec_col, amax_in, scale, sinv, amax_acc,   \
                               amax_copy, sinv_copy, amax_store, history, done, q_row, q_col);            \
    else                                                                                                  \
      per_tensor_cast<T, false>(sh, x, M, K, tile, vec_in, vec_row, vec_col, amax_in, scale, sinv, amax_acc,  \
                                amax_copy, sinv_copy, amax_store, history, done, q_row, q_col);           \
  }
NH_CAST(f32, float)
NH_CAST(bf16, __nv_bfloat16)
NH_CAST(f16, __half)

// ---------------------------------------------------------------------------------------------
// A given amax into a call plan's amax slots, its zero-filled bytes cleared (one launch)
// ---------------------------------------------------------------------------------------------
// native.plan: a plan whose kernels read the given amax from its own slots (NVFP4's A_g of both copies,
// docs/numerics.md §5.1) copies it there and clears the block's zero-filled buffers (`zero`, n_words 4-byte
// words; the slots lie outside them) in this one launch instead of a cudaMemsetAsync and one 4-byte
// cudaMemcpyAsync per slot. The value is copied bit for bit. A plan launches it programmatically (sm_90 on): it may
// start while the kernel before it, any kernel, still runs, so it waits for that grid before it reads or writes
// anything (the given amax, X and the block may be that kernel's), and only then lets the quantize kernel after it
// start (which reads X before its own wait: X is complete by then). A null `given`: the clearing alone (a plan's
// first launch, in place of the block's cudaMemsetAsync: an own amax's, NVFP4 or fp8_current, whose amax kernel,
// launched programmatically after it, reads X before it waits for these zeros; fp8_delayed's, whose cast does).
extern "C" __global__ void fill_given(const float* __restrict__ given, float* __restrict__ slot0,
                                      float* __restrict__ slot1, unsigned int* __restrict__ zero, i64 n_words) {
  wait_for_prior_grid();
  allow_dependent_launch();  // the quantize, amax or cast kernel after it may start now (it waits for these writes)
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_words; i += stride) zero[i] = 0u;
  if (given != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    const float a = given[0];
    if (slot0) slot0[0] = a;
    if (slot1) slot1[0] = a;
  }
}

// ---------------------------------------------------------------------------------------------
// Delayed scaling: fused amax-history update (one CTA)
// ---------------------------------------------------------------------------------------------
#ifdef SCHEME_FP8_DELAYED
// NUMERICS: §2 update (TE delayed_scaling.cu fused kernel):
// 1. S_max = RN(fp8_max * 2^-margin) (define); 2. last = R if a reduced R exists and R != 0, else H[0];
// 3. last == 0: nothing changes; 4. a_i = H[i+1] (i < L-1), a_{L-1} = last, A_max = fmax_i a_i,
//    new H = [0, a_1, ..., a_{L-1}]; 5. A = A_max (max) or last (most_recent);
// 6. A finite and > 0: s = RN(S_max / A) (true division), s = +inf -> FLT_MAX; else keep the scale.
// The new history goes to h_out (out of place: no read/write race); the caller copies it back.
extern "C" __global__ void delayed_update(const float* __restrict__ hist, float* __restrict__ h_out,
                                          float* __restrict__ scale, const float* __restrict__ reduced,
                                          int has_reduced) {
  __shared__ float warp_part[32];
  constexpr int L = AMAX_HISTORY_LEN;
  const float r = has_reduced ? reduced[0] : 0.0f;
  const float last = (has_reduced && r != 0.0f) ? r : hist[0];
  if (last == 0.0f) {  // NUMERICS: §2 step 3 - no roll, scale kept
    for (int i = threadIdx.x; i < L; i += blockDim.x) h_out[i] = hist[i];
    return;
  }
  float a_max = 0.0f;
  for (int i = threadIdx.x; i < L; i += blockDim.x) {
    const float a = (i < L - 1) ? hist[i + 1] : last;
    a_max = fmaxf(a_max, a);  // NUMERICS: §2 fmax ignores NaN entries
    h_out[i] = (i == 0) ? 0.0f : a;
  }
  a_max = group_max<32>(a_max);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warp_part[warp] = a_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float A_max = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) A_max = fmaxf(A_max, warp_part[w]);
    const float A = AMAX_ALGO_MAX ? A_max : last;
    if (isfinite(A) && A > 0.0f) {
      float s = __fdiv_rn(__uint_as_float(static_cast<unsigned int>(DELAYED_SCALE_MAX_BITS)), A);
      if (isinf(s)) s = FP32_MAX;
      scale[0] = s;
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// Dequantization: x_hat = RN_out(RN(dec(q) * sinv)) in the logical [M, K] orientation
// ---------------------------------------------------------------------------------------------
template <typename O>
__device__ __forceinline__ void per_tensor_dequantize(const unsigned char* __restrict__ q,
                                                      const float* __restrict__ sinv, i64 M, i64 K, int colwise,
                                                      O* __restrict__ out) {
  const float s = sinv[0];
  const i64 n = M * K;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 m = i / K, k = i % K;
    const unsigned char code = colwise ? q[k * M + m] : q[i];
    store_out(out + i, __fmul_rn(decode_elem(code), s));  // NUMERICS: §1 x_hat = RN_out(RN(dec(q)*sinv))
  }
}

#define NH_DEQUANT(SUFFIX, O)                                                                                \
  extern "C" __global__ void per_tensor_dequantize_##SUFFIX(const unsigned char* q, const float* sinv, i64 M, \
                                                            i64 K, int colwise, O* out) {                    \
    per_tensor_dequantize<O>(q, sinv, M, K, colwise, out);                                                   \
  }
NH_DEQUANT(f32, float)
NH_DEQUANT(bf16, __nv_bfloat16)
NH_DEQUANT(f16, __half)
