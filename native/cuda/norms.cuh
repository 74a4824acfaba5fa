// The arithmetic of native/cuda/norms.cu as __host__ __device__ code: every fp32 / fp64 rounding point of
// reference/norms.py (docs/numerics.md §9.2, §9.3) and the per-lane part of the pairwise tree S. The kernels
// run the device build; tests/unit/host/norms_replay.cpp replays the same source on the CPU (nvcc, no GPU).
// Device build: the _rn intrinsics (nothing contracted or approximated); host build: plain IEEE operators,
// compiled with -ffp-contract=off, std::fma / std::sqrt (correctly rounded).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

#define NORM_HD __host__ __device__ __forceinline__
#define NORM_MAX_LOG 62  // stack depth bound: p <= 2^62 elements per sum
#define NORM_THREADS 256  // CTA size and lanes of a row sum, a power of two (native/norms.py THREADS)

namespace nn {

typedef long long i64;

NORM_HD double add_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
NORM_HD double sub_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
NORM_HD double mul_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
NORM_HD double div_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
NORM_HD double sqrt_d(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
NORM_HD float add_f(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NORM_HD float sub_f(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
NORM_HD float mul_f(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
NORM_HD float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
NORM_HD float d2f_rn(double d) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(d);
#else
  return static_cast<float>(d);
#endif
}
// fp64 -> fp32 toward zero.
NORM_HD float d2f_rz(double d) {
#if defined(__CUDA_ARCH__)
  return __double2float_rz(d);
#else
  const float r = static_cast<float>(d);
  return std::fabs(static_cast<double>(r)) > std::fabs(d) ? std::nextafter(r, 0.0f) : r;
#endif
}
NORM_HD unsigned int f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  unsigned int u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}
NORM_HD float u2f(unsigned int u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

NORM_HD float to_f32(float v) { return v; }
NORM_HD float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
NORM_HD float to_f32(__half v) { return __half2float(v); }

// NUMERICS: numerics.md §9.2 ln_out / dx = RN_out(fp32 value): one round-to-nearest-even (a no-op for fp32).
template <typename T> NORM_HD T from_f32(float v);
template <> NORM_HD float from_f32<float>(float v) { return v; }
template <> NORM_HD __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> NORM_HD __half from_f32<__half>(float v) { return __float2half_rn(v); }

// fp64 -> fp32 rounding to odd: truncate, then set the last bit when inexact (finite values only).
NORM_HD float round_to_odd_f32(double v) {
  const float r = d2f_rz(v);
  if (v - v == 0.0 && static_cast<double>(r) != v) return u2f(f2u(r) | 1u);  // v - v == 0: v is finite
  return r;
}
// NUMERICS: numerics.md §9.2 / §9.3 RN_out of an fp64 sum (reference.gemm.round_out): fp32 directly; bf16 / fp16
// through round-to-odd fp32 (24 bits >= 2 more than the target), which equals one RNE from fp64.
template <typename T> NORM_HD T round_out(double v);
template <> NORM_HD float round_out<float>(double v) { return d2f_rn(v); }
template <> NORM_HD __nv_bfloat16 round_out<__nv_bfloat16>(double v) { return __float2bfloat16_rn(round_to_odd_f32(v)); }
template <> NORM_HD __half round_out<__half>(double v) { return __float2half_rn(round_to_odd_f32(v)); }

NORM_HD i64 pow2_at_least(i64 n) {
  i64 p = 1;
  while (p < n) p <<= 1;
  return p;
}
NORM_HD int log2_exact(i64 p) {
  int b = 0;
  while ((static_cast<i64>(1) << b) < p) ++b;
  return b;
}
NORM_HD i64 bit_reverse(i64 k, int bits) {
  i64 r = 0;
  for (int i = 0; i < bits; ++i, k >>= 1) r = (r << 1) | (k & 1);
  return r;
}

// NUMERICS: numerics.md §9.2 S(v) over the elements j = 0 .. L-1 of one lane (L a power of two) by the stride tree
// "u[j] += u[j + L/2^l]", streamed as the adjacent-pair tree of the bit-reversed order with a binary-counter stack
// (both trees split on the low bit of j last, and fp64 adds commute exactly). `value(j, v)` writes element j of
// each of the NV sums (0 for the zero padding).
template <int NV, typename F>
NORM_HD void lane_tree(i64 L, const F& value, double out[NV]) {
  double stack[NORM_MAX_LOG + 1][NV];
  const int bits = log2_exact(L);
  for (i64 k = 0; k < L; ++k) {
    double v[NV];
    value(bit_reverse(k, bits), v);
    int d = 0;
    for (i64 kk = k; kk & 1; kk >>= 1, ++d) {
      for (int q = 0; q < NV; ++q) v[q] = add_d(stack[d][q], v[q]);  // (left subtree, right subtree)
    }
    for (int q = 0; q < NV; ++q) stack[d][q] = v[q];
  }
  for (int q = 0; q < NV; ++q) out[q] = stack[bits][q];
}

// NUMERICS: numerics.md §9.2 mean = RN32(S / K): the fp64 quotient (correctly rounded), then one RN32.
NORM_HD float mean32(double s, i64 K) { return d2f_rn(div_d(s, static_cast<double>(K))); }

// NUMERICS: numerics.md §9.2 the LayerNorm variance terms (x - mu)^2: the difference and the square each one fp64
// rounding; RMSNorm's x^2 (exact in fp64).
NORM_HD double centred_square(float x, float mu) {
  const double d = sub_d(static_cast<double>(x), static_cast<double>(mu));
  return mul_d(d, d);
}
NORM_HD double square(float x) { return mul_d(static_cast<double>(x), static_cast<double>(x)); }

// NUMERICS: numerics.md §9.2 rsigma = RN32(1 / sqrt(RN32(var + eps))): fp32 add, then correctly rounded fp64 sqrt
// and division of the exact widening, then one RN32 (TE: rsqrtf).
NORM_HD float rsigma_of(float var, float eps) { return d2f_rn(div_d(1.0, sqrt_d(static_cast<double>(add_f(var, eps))))); }

// NUMERICS: numerics.md §9.2 g = fp32(gamma), + 1 in one fp32 add with zero_centered_gamma (TE `g_ij += 1`).
NORM_HD float gamma_of(float g, int zero_centered) { return zero_centered ? add_f(g, 1.0f) : g; }

// NUMERICS: numerics.md §9.2 y = RN32(rs * RN32(x - mu)) (LayerNorm) or RN32(x * rs) (RMSNorm).
NORM_HD float normalized(float x, float mu, float rs, int rms) { return rms ? mul_f(x, rs) : mul_f(sub_f(x, mu), rs); }

// NUMERICS: numerics.md §9.2 LayerNorm out32 = FMA32(g, y, beta) (TE's contracted g*y + b); RMSNorm RN32(g * y).
NORM_HD float out32_of(float g, float y, float beta, int rms) { return rms ? mul_f(g, y) : fma_f(g, y, beta); }

// NUMERICS: numerics.md §9.2 LayerNorm dx32 = RN32(rs * RN32(dyg - FMA32(mdyy, y, mdy))); RMSNorm
// RN32(rs * FMA32(-mdyy, y, dyg)) (TE's contracted a*b + c).
NORM_HD float dx32_of(float dyg, float y, float mdyy, float mdy, float rs, int rms) {
  const float d = rms ? fma_f(-mdyy, y, dyg) : sub_f(dyg, fma_f(mdyy, y, mdy));
  return mul_f(d, rs);
}

}  // namespace nn
