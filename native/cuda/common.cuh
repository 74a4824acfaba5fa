// Shared device helpers of the native quantizers: input widening, vector loads, the saturating FP8
// cast, E8M0 rules, NaN-ignoring amax, compute_scale, and the 128x128 tile geometry.
// Source: docs/numerics.md §0.1, §0.3, §0.5, §1; TE common/util/ptx_arch_spec.cuh (e8m0_up),
// common/recipe/recipe_common.cuh (compute_scale), common/utils.cuh (amax reductions).
// Format numbers arrive only as -D defines from native/_compile.py::defines_for (docs/design.md §2).
// Compiled ONLY through native/_compile.py (-ftz=false -prec-div=true -prec-sqrt=true -fmad=false).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "l2_policy.cuh"

#ifndef ELEM_MAX
#error "common.cuh needs the defines of native/_compile.py::defines_for(config)"
#endif

namespace nh {

// IEEE binary32 layout facts (not formats.py rows: the fp32 container itself).
constexpr unsigned int kF32ManBits = 23;
constexpr int kF32Bias = 127;
constexpr unsigned int kF32ExpMask = 0xFFu;
constexpr unsigned int kF32ManMask = (1u << kF32ManBits) - 1u;
constexpr unsigned int kF32AbsMask = 0x7FFFFFFFu;
constexpr unsigned int kF32Pow2Mask = 0xFF800000u;  // sign + exponent: 2^floor(log2 s) for normal s

typedef unsigned long long u64;
typedef long long i64;

// ---------------------------------------------------------------------------------------------
// Input widening (exact: docs/numerics.md §0.1 "widening bf16/fp16 -> fp32" is not a rounding point)
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// v_inf of blockwise scaling = the input dtype's max finite (docs/numerics.md §4), from defines.
template <typename T> struct InputMax;
template <> struct InputMax<float> { static constexpr float value = INPUT_MAX_FLOAT32; };
template <> struct InputMax<__nv_bfloat16> { static constexpr float value = INPUT_MAX_BFLOAT16; };
template <> struct InputMax<__half> { static constexpr float value = INPUT_MAX_FLOAT16; };

// One 16-byte vector from a 16-byte aligned address; EVICT_FIRST: at L2 evict-first priority (l2_policy.cuh: for a
// pass that reads its input only to reduce it).
template <bool EVICT_FIRST, typename V>
__device__ __forceinline__ V load16(const void* p) {
  if constexpr (EVICT_FIRST) {
    static_assert(sizeof(V) == sizeof(uint4), "a 16-byte vector");
    const uint4 u = load_with_policy(reinterpret_cast<const uint4*>(p), l2_evict_first_policy());
    return *reinterpret_cast<const V*>(&u);  // the same 16 bytes as V (uint4 or float4)
  } else {
    return *reinterpret_cast<const V*>(p);
  }
}
// 8 consecutive elements from a 16-byte aligned address (fp32: two 16-byte loads).
template <bool EVICT_FIRST = false>
__device__ __forceinline__ void load8_vec(const float* p, float v[8]) {
  const float4 a = load16<EVICT_FIRST, float4>(p), b = load16<EVICT_FIRST, float4>(p + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
// The low / high 16-bit element of a 32-bit word, widened to fp32 (exact); the pointer only selects the type.
__device__ __forceinline__ float widen_lo(unsigned int w, const __nv_bfloat16*) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float widen_hi(unsigned int w, const __nv_bfloat16*) { return __uint_as_float(w & 0xFFFF0000u); }
__device__ __forceinline__ float widen_lo(unsigned int w, const __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
}
__device__ __forceinline__ float widen_hi(unsigned int w, const __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
// Lane-wise max of two packed 16-bit pairs (max.{bf16,f16}x2): exact, and NaN-ignoring like fmaxf (a
// NaN lane yields the other operand; two NaNs give NaN, which the final fmaxf from +0 drops).
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b, const __nv_bfloat16*) {
  const __nv_bfloat162 r = __hmax2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const unsigned int*>(&r);
}
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b, const __half*) {
  const __half2 r = __hmax2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const unsigned int*>(&r);
}
// |x| of both 16-bit lanes (sign bits cleared; NaN stays NaN).
__device__ __forceinline__ unsigned int abs2(unsigned int w) { return w & 0x7FFF7FFFu; }
// NUMERICS: §0.1 amax - fmax over |v| from +0 of the two lanes of a packed max word (exact widening).
template <typename T>
__device__ __forceinline__ float lanes_amax(unsigned int m, const T* tag) {
  return fmaxf(fmaxf(0.0f, widen_lo(m, tag)), widen_hi(m, tag));
}

template <typename T>
__device__ __forceinline__ void unpack_pair(unsigned int w, float* v, const T* tag) {
  v[0] = widen_lo(w, tag);  // bf16 -> fp32 is a shift; fp16 -> fp32 is exact
  v[1] = widen_hi(w, tag);
}
template <bool EVICT_FIRST = false, typename T>
__device__ __forceinline__ void load8_vec(const T* p, float v[8]) {
  const uint4 u = load16<EVICT_FIRST, uint4>(p);
  unpack_pair(u.x, v + 0, p);
  unpack_pair(u.y, v + 2, p);
  unpack_pair(u.z, v + 4, p);
  unpack_pair(u.w, v + 6, p);
}

// ---------------------------------------------------------------------------------------------
// Saturating FP8 cast (docs/numerics.md §0.3, §0.5)
// ---------------------------------------------------------------------------------------------
// NUMERICS: §0.3/§0.5 - __nv_cvt_float_to_fp8(v, __NV_SATFINITE, .) is cvt.rn.satfinite on sm_89+:
// RNE on the format grid (subnormals included), |v| > max and +-inf -> +-max, -0.0 kept; NaN of
// either sign is forced to the positive NaN code (0x7F) here.
template <int NAN_CODE>
__device__ __forceinline__ unsigned char sat_fp8(float v, __nv_fp8_interpretation_t interp) {
  const unsigned char q = static_cast<unsigned char>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, interp));
  return isnan(v) ? static_cast<unsigned char>(NAN_CODE) : q;
}

#ifdef ELEM_FP8_INTERP
static_assert((ELEM_FP8_INTERP == __NV_E4M3) == (ELEM_EXP_BITS == 4 && ELEM_MAN_BITS == 3),
              "ELEM_FP8_INTERP does not match the element format's bit fields");
static_assert((ELEM_FP8_INTERP == __NV_E5M2) == (ELEM_EXP_BITS == 5 && ELEM_MAN_BITS == 2),
              "ELEM_FP8_INTERP does not match the element format's bit fields");

// Exact fp32 value of an element code (NaN codes decode to NaN): fp8 -> fp16 is exact.
__device__ __forceinline__ float decode_elem(unsigned char q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), ELEM_FP8_INTERP);
  return __half2float(__half(h));
}
#endif

#ifdef ELEM_FP8_INTERP
static_assert(ELEM_MAX_CODE < 0x7F && ELEM_NAN_CODE <= 0x7F, "an FP8 element format: max finite code < NaN code <= 0x7F");

// Four codes of a cvt.rn.satfinite.<fmt>x2 pair of pairs with every NaN code made ELEM_NAN_CODE (byte j of
// the word is element j). Satfinite never writes an inf code for a finite or infinite input, so a byte
// whose magnitude is above ELEM_MAX_CODE came from a NaN.
__device__ __forceinline__ unsigned int fp8x4_canonical_nan(unsigned int w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  // NUMERICS: §0.3/§0.5 - on sm_90 the cvt writes 0x7F (= ELEM_NAN_CODE for e4m3 and e5m2) for every
  // NaN, either sign and any payload (probed on an H100, 2026-11-21; tests/gpu special-value inputs
  // with negative NaNs check it against the reference), so there is nothing to change.
  static_assert(ELEM_NAN_CODE == 0x7F, "sm_90's cvt writes NaN as 0x7F");
  return w;
#else
  // Elsewhere (unprobed): bytes with |code| > ELEM_MAX_CODE get bit 7 set by the add (no carry leaves a
  // byte: both terms are <= 0x7F), prmt replicates each byte's bit 7 into a byte mask.
  const unsigned int t = (w & 0x7F7F7F7Fu) + (0x7Fu - ELEM_MAX_CODE) * 0x01010101u;
  unsigned int m;
  asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(m) : "r"(t));
  return (w & ~m) | ((ELEM_NAN_CODE * 0x01010101u) & m);
#endif
}

// NUMERICS: §0.3 q_j = sat(RN(v_j * s_j)): one fp32 multiply per element, then the saturating cast,
// pairs through cvt.rn.satfinite.<fmt>x2.f32 (the same per-lane rounding as the single form; x.x lands
// in the low byte). Codes come back packed: element j in byte j % 4 of word j / 4.
__device__ __forceinline__ unsigned int sat_elem4(float a, float b, float c, float d) {
  const unsigned int lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, ELEM_FP8_INTERP);
  const unsigned int hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, ELEM_FP8_INTERP);
  return fp8x4_canonical_nan(lo | (hi << 16));
}
__device__ __forceinline__ uint2 sat_elem8_mul(const float v[8], const float s[8]) {
  uint2 q;
  q.x = sat_elem4(__fmul_rn(v[0], s[0]), __fmul_rn(v[1], s[1]), __fmul_rn(v[2], s[2]), __fmul_rn(v[3], s[3]));
  q.y = sat_elem4(__fmul_rn(v[4], s[4]), __fmul_rn(v[5], s[5]), __fmul_rn(v[6], s[6]), __fmul_rn(v[7], s[7]));
  return q;
}
__device__ __forceinline__ uint2 sat_elem8_mul(const float v[8], float s) {
  const float s8[8] = {s, s, s, s, s, s, s, s};
  return sat_elem8_mul(v, s8);
}
// Byte j of 8 packed codes (element j).
__device__ __forceinline__ unsigned char code_at(uint2 q, int j) {
  return static_cast<unsigned char>((j < 4 ? q.x : q.y) >> (8 * (j & 3)));
}
#endif

#ifdef SCALE_FP8_INTERP
__device__ __forceinline__ unsigned char sat_scale(float v) { return sat_fp8<SCALE_NAN_CODE>(v, SCALE_FP8_INTERP); }
#endif

// ---------------------------------------------------------------------------------------------
// E8M0 (docs/numerics.md §0.5)
// ---------------------------------------------------------------------------------------------
// NUMERICS: §0.5 e8m0_up - software bit rule (TE ptx_arch_spec.cuh): NaN -> 0xFF; +inf -> 0xFE;
// otherwise E + 1 if F != 0 and E != 0xFE and not (E == 0 and F <= 0x400000 (= 2^-127)), else E.
// Without branches: adding 0x7FFFFF (E != 0) or 0x3FFFFF (E = 0) to the bits carries into the exponent
// exactly when the rule bumps E; 0xFE with F != 0 and +inf (0xFF, F = 0) both end at 0xFF, clamped to
// E8M0_MAX_CODE as the rule says (checked against the rule for every fp32 pattern, 2026-11-21).
__device__ __forceinline__ unsigned int e8m0_up_sw(float t) {
  const unsigned int b = __float_as_uint(t) & kF32AbsMask;
  const unsigned int up = b < (1u << kF32ManBits) ? (kF32ManMask >> 1) : kF32ManMask;
  const unsigned int e = min((b + up) >> kF32ManBits, static_cast<unsigned int>(E8M0_MAX_CODE));
  return b > (kF32ExpMask << kF32ManBits) ? static_cast<unsigned int>(E8M0_NAN_CODE) : e;
}

// The arch-specific sm_100+ instruction rounds up (rp) and saturates exactly like e8m0_up_sw.
__device__ __forceinline__ unsigned int e8m0_up(float t) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000) && \
    (defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
  unsigned short r;
  // NUMERICS: §0.3 - cvt.rp.satfinite.ue8m0x2 exists only on sm_100+ (a/f targets); b -> low byte.
  asm("cvt.rp.satfinite.ue8m0x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(t));
  return static_cast<unsigned int>(r & 0xFFu);
#else
  return e8m0_up_sw(t);
#endif
}

// floor(log2 a) for finite a > 0, read exactly from the bits (subnormals included).
__device__ __forceinline__ int floor_log2(float a) {
  const unsigned int b = __float_as_uint(a) & kF32AbsMask;
  const int E = static_cast<int>(b >> kF32ManBits);
  if (E != 0) return E - kF32Bias;
  // subnormal: value = F * 2^(1 - bias - 23); its top set bit gives the exponent
  return (31 - __clz(static_cast<int>(b & kF32ManMask))) + (1 - kF32Bias - static_cast<int>(kF32ManBits));
}

// NUMERICS: §0.5 e8m0_floor (OCP MX) - clamp(floor(log2 A) - emax_elem + 127, 0, 254); A = 0 -> 0;
// A = +inf -> 254 (NaN cannot reach it: amax ignores NaN; mapped to the NaN code for completeness).
__device__ __forceinline__ unsigned int e8m0_floor(float A) {
  if (isnan(A)) return E8M0_NAN_CODE;
  if (A == 0.0f) return 0u;
  if (isinf(A)) return E8M0_MAX_CODE;
  int e = floor_log2(A) - ELEM_EMAX + E8M0_BIAS;
  e = e < 0 ? 0 : (e > E8M0_MAX_CODE ? E8M0_MAX_CODE : e);
  return static_cast<unsigned int>(e);
}

// 2^n as fp32 for -149 <= n <= 127, exact (subnormal powers included).
__device__ __forceinline__ float exact_pow2(int n) {
  const int biased = n + kF32Bias;
  if (biased > 0) return __uint_as_float(static_cast<unsigned int>(biased) << kF32ManBits);
  return __uint_as_float(1u << (static_cast<int>(kF32ManBits) - 1 + biased));
}

// NUMERICS: §0.5 - quantization multiplier P(e) = 2^(127 - e) (P(254) = 2^-127 subnormal, P(255) = NaN).
// Without branches for e <= 254: the normal pattern (254 - e) << 23 is 0 for e = 254, where the
// subnormal 0x00400000 is the larger of the two candidates.
__device__ __forceinline__ float e8m0_multiplier(unsigned int e) {
  if (e == E8M0_NAN_CODE) return __uint_as_float(0x7FC00000u);
  const int normal = (2 * E8M0_BIAS - static_cast<int>(e)) << kF32ManBits;
  return __uint_as_float(static_cast<unsigned int>(max(normal, 1 << (kF32ManBits - 1))));
}

// NUMERICS: §0.5 - decode D(e) = 2^(e - 127) (D(0) = 2^-127 subnormal, 0xFF = NaN).
__device__ __forceinline__ float e8m0_decode(unsigned int e) {
  if (e == E8M0_NAN_CODE) return __uint_as_float(0x7FC00000u);
  return exact_pow2(static_cast<int>(e) - E8M0_BIAS);
}

// ---------------------------------------------------------------------------------------------
// amax and the scale rule
// ---------------------------------------------------------------------------------------------
// NUMERICS: §0.1 amax - fmax over |v| from +0: fmaxf ignores NaN, lets +inf through, exact.
__device__ __forceinline__ float amax_step(float acc, float v) { return fmaxf(acc, fabsf(v)); }

// Max over `width` consecutive lanes (width a power of two <= 32): fmaxf, NaN-free inputs.
template <int WIDTH>
__device__ __forceinline__ float group_max(float a) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  return a;
}

// NUMERICS: §0.1 - partial amaxes are >= +0, so an integer max on their bit patterns is exact.
__device__ __forceinline__ void atomic_amax(float* dst, float a) {
  atomicMax(reinterpret_cast<unsigned int*>(dst), __float_as_uint(a));
}

// NUMERICS: §1 compute_scale (TE recipe_common.cuh), every step fp32:
// 1. A < eps -> eps (NaN kept); 2. A in {0, inf, NaN} -> 1; 3. s = RN(fp8_max / A), a true division;
// 4. s = +inf -> v_inf; 5. pow2: keep sign+exponent bits. The caller stores sinv = RN(1/s).
__device__ __forceinline__ float compute_scale(float A, float fp8_max, bool pow2, float eps, float v_inf) {
  if (A < eps) A = eps;
  if (A == 0.0f || isinf(A) || isnan(A)) return 1.0f;
  float s = __fdiv_rn(fp8_max, A);
  if (isinf(s)) s = v_inf;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & kF32Pow2Mask);
  return s;
}

// NUMERICS: §1 step 6 - sinv = RN(1/s), correctly rounded, subnormal results kept (-ftz=false).
__device__ __forceinline__ float scale_inverse(float s) { return __frcp_rn(s); }

// ---------------------------------------------------------------------------------------------
// 128 x 128 tile geometry shared by the FP8 kernels
// ---------------------------------------------------------------------------------------------
// 256 threads; lane group of 16 covers a 128-wide row (8 consecutive elements per lane, one
// 16-byte load for 2-byte inputs); a warp covers 2 rows per pass, the block 16 rows per pass,
// 8 passes cover 128 rows. Thread (warp w, lane l): rsub = l / 16, cl = l % 16;
// tile row r(p) = 16 p + 2 w + rsub, tile columns 8 cl .. 8 cl + 7.
constexpr int kTile = 128;
constexpr int kThreads = 256;
constexpr int kVec = 8;
constexpr int kLanesPerRow = kTile / kVec;        // 16
constexpr int kRowsPerPass = kThreads / kLanesPerRow;  // 16
constexpr int kPasses = kTile / kRowsPerPass;     // 8
constexpr int kWarps = kThreads / 32;             // 8

// CTAs per SM each tile kernel is built for (__launch_bounds__): 16-bit inputs stay packed
// (TileVals), so 3 CTAs' registers fit (80 each on sm_90, no or few spills); fp32 values need twice as many.
template <typename T> struct TileMinBlocks { static constexpr int value = 3; };
template <> struct TileMinBlocks<float> { static constexpr int value = 2; };

struct TileThread {
  int w, rsub, cl;
  __device__ __forceinline__ TileThread() {
    const int t = static_cast<int>(threadIdx.x);
    w = t >> 5;
    rsub = (t & 31) >> 4;
    cl = t & 15;
  }
  __device__ __forceinline__ int row(int p) const { return p * kRowsPerPass + 2 * w + rsub; }
  __device__ __forceinline__ int col0() const { return cl * kVec; }
  // Offset of this thread's row piece of pass p (row m0 + row(p), columns k0 + col0() ..) in a row-major
  // array of K columns: the pass-0 offset plus p whole passes (one 64-bit product per tile, not per pass).
  __device__ __forceinline__ i64 offset(i64 m0, i64 k0, i64 K, int p) const {
    return (m0 + row(0)) * K + k0 + col0() + static_cast<i64>(p) * kRowsPerPass * K;
  }
};

// The tile of this CTA: tiles are numbered row-major over [M, K] (k fastest), one per CTA.
struct TileOrigin {
  i64 mt, kt;  // tile row and column index
  i64 m0, k0;  // first row and column
};
__device__ __forceinline__ TileOrigin tile_origin(i64 K) {
  const i64 n_kt = (K + kTile - 1) / kTile;
  const i64 b = static_cast<i64>(blockIdx.x);
  return {b / n_kt, b % n_kt, b / n_kt * kTile, b % n_kt * kTile};
}
// Whether the whole tile lies inside [M, K] and every row piece of it loads and stores as a vector
// (`vec_ok`: the caller's alignment flags, all true). The tile kernels are built twice, FULL = true
// for such interior tiles (no bounds checks, no scalar fallbacks: the same values, fewer
// instructions) and FULL = false for the edges.
__device__ __forceinline__ bool tile_interior(const TileOrigin& t, i64 M, i64 K, bool vec_ok) {
  return vec_ok && t.m0 + kTile <= M && t.k0 + kTile <= K;
}
// This thread's 8 x 8 values of a tile, as loaded. fp32 inputs are kept as floats; 16-bit inputs stay
// packed two per register (half the registers, so more CTAs fit on an SM) and are widened where they
// are read. Widening bf16/fp16 -> fp32 is exact (docs/numerics.md §0.1), so at() gives the same values either way.
template <typename T>
struct TileVals {
  unsigned int w[kPasses][kVec / 2];  // element j of pass p: 16-bit half (j & 1) of w[p][j / 2]
  __device__ __forceinline__ float at(int p, int j) const {
    const T* tag = nullptr;
    return (j & 1) ? widen_hi(w[p][j >> 1], tag) : widen_lo(w[p][j >> 1], tag);
  }
};
template <>
struct TileVals<float> {
  float v[kPasses][kVec];
  __device__ __forceinline__ float at(int p, int j) const { return v[p][j]; }
};

// The 8 values of pass p as fp32.
template <typename T>
__device__ __forceinline__ void tile_row(const TileVals<T>& t, int p, float out[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = t.at(p, j);
}

__device__ __forceinline__ unsigned int raw16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned int raw16(__half v) { return __half_as_ushort(v); }

// Load this thread's 8 x 8 values of the tile at (m0, k0) of the row-major [M, K] input `x`.
// Out-of-range elements are +0 (zero padding; they never change an amax). `vec_ok`: the base is
// 16-byte aligned and K * sizeof(T) is a multiple of 16, so full 8-element rows load as vectors.
// FULL: an interior tile (tile_interior), every row piece a vector load.
template <bool FULL>
__device__ __forceinline__ void load_tile(const float* __restrict__ x, i64 M, i64 K, i64 m0, i64 k0, bool vec_ok,
                                          const TileThread& th, TileVals<float>& t) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const i64 m = m0 + th.row(p);
    const i64 k = k0 + th.col0();
    if (FULL || (m < M && k + kVec <= K && vec_ok)) {
      load8_vec(x + th.offset(m0, k0, K, p), t.v[p]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) t.v[p][j] = (m < M && k + j < K) ? x[m * K + k + j] : 0.0f;
    }
  }
}
template <bool FULL, typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, i64 M, i64 K, i64 m0, i64 k0, bool vec_ok,
                                          const TileThread& th, TileVals<T>& t) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const i64 m = m0 + th.row(p);
    const i64 k = k0 + th.col0();
    if (FULL || (m < M && k + kVec <= K && vec_ok)) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + th.offset(m0, k0, K, p));
      t.w[p][0] = u.x; t.w[p][1] = u.y; t.w[p][2] = u.z; t.w[p][3] = u.w;
    } else {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        const unsigned int lo = (m < M && k + 2 * i < K) ? raw16(x[m * K + k + 2 * i]) : 0u;
        const unsigned int hi = (m < M && k + 2 * i + 1 < K) ? raw16(x[m * K + k + 2 * i + 1]) : 0u;
        t.w[p][i] = lo | (hi << 16);
      }
    }
  }
}

// Store 8 packed codes (byte j of q = element j) to 8 consecutive bytes (8-byte aligned when `vec_ok`),
// only the in-range ones otherwise. FULL: all 8 in range and aligned (an interior tile).
template <bool FULL>
__device__ __forceinline__ void store8(unsigned char* __restrict__ dst, uint2 q, i64 valid, bool vec_ok) {
  if (FULL || (vec_ok && valid >= 8)) {
    *reinterpret_cast<uint2*>(dst) = q;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < valid) dst[j] = code_at(q, j);
  }
}

// Transposed tile buffer (bytes): row c holds the colwise codes of tile column c. Its 16-byte chunks
// are XOR-swizzled by ((c >> 3) & 7): the 16 lanes of a writing half-warp hold columns 8 apart, which
// without the swizzle all fall into one shared-memory bank (a 16-way conflict per byte store).
constexpr int kTransposePitch = kTile;  // bytes per row; 16-byte aligned rows
__device__ __forceinline__ int qT_offset(int c, int r) {
  return c * kTransposePitch + ((((r >> 4) ^ (c >> 3)) & 7) << 4) + (r & 15);
}

// Write this thread's 8 colwise codes of pass p (byte j of q: column col0() + j, row row(p)) into the
// transposed tile buffer, one byte each.
__device__ __forceinline__ void store_col_codes(unsigned char* __restrict__ qT, uint2 q, const TileThread& th, int p) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) qT[qT_offset(th.col0() + j, th.row(p))] = code_at(q, j);
}

// Write the transposed tile qT ([kTile][kTransposePitch] bytes in shared memory) to the row-major
// [K, M] output `out` at (k0, m0): row c of qT is out[k0 + c, m0 .. m0 + 127]. Each store instruction
// of a warp writes 4 whole 128-byte rows: thread t takes 16-byte chunk q = t % 8 of rows
// c = 32 i + t / 8 (i = 0..3); the 8 chunks of a row lie in distinct banks whatever the swizzle.
template <bool FULL>
__device__ __forceinline__ void store_transposed(const unsigned char* __restrict__ qT, unsigned char* __restrict__ out,
                                                 i64 M, i64 K, i64 m0, i64 k0, bool vec_ok) {
  constexpr int kChunks = kTransposePitch / 16;      // 16-byte chunks per row: 8
  constexpr int kRowsPerStep = kThreads / kChunks;   // 32
  const int t = static_cast<int>(threadIdx.x), q = t % kChunks;
  const i64 valid = M - (m0 + 16 * q);  // bytes of this chunk inside [0, M) (may be <= 0 or > 16)
#pragma unroll
  for (int i = 0; i < kTile / kRowsPerStep; ++i) {
    const int c = i * kRowsPerStep + t / kChunks;
    if (!FULL && k0 + c >= K) break;  // later steps hold later rows
    unsigned char* dst = out + (k0 + c) * M + m0 + 16 * q;
    const unsigned char* src = qT + qT_offset(c, 16 * q);
    if (FULL || (vec_ok && valid >= 16)) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int b = 0; b < 16; ++b)
        if (b < valid) dst[b] = src[b];
    }
  }
}

#ifdef ELEM_FP8_INTERP
// One scale for the whole tile (per-tensor FP8, 128x128 fp8_block): q = sat(RN(x*s)) for this
// thread's 8 x 8 values; rowwise codes straight to q_row [M, K], colwise codes into the transposed
// tile buffer qT (written out later by store_transposed). q_row / qT may be null.
template <bool FULL, typename T>
__device__ __forceinline__ void quantize_tile_one_scale(const TileVals<T>& t, float s, const TileThread& th,
                                                        i64 m0, i64 k0, i64 M, i64 K, unsigned char* q_row,
                                                        bool vec_row, unsigned char* qT) {
  const i64 kcol = k0 + th.col0();
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    float r[kVec];
    tile_row(t, p, r);
    const uint2 q = sat_elem8_mul(r, s);  // NUMERICS: §1 / §4 q = sat(RN(x*s)), a multiply by s, never / sinv
    const i64 m = m0 + th.row(p);
    if (q_row && (FULL || (m < M && kcol < K))) store8<FULL>(q_row + th.offset(m0, k0, K, p), q, K - kcol, vec_row);
    if (qT) store_col_codes(qT, q, th, p);
  }
}
#endif

// RN to the output dtype (docs/numerics.md §0.1 RN_out).
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_out(__half* p, float v) { *p = __float2half_rn(v); }

}  // namespace nh
