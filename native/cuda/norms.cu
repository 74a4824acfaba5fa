// LayerNorm / RMSNorm forward and backward and the bias-gradient column sum, bit for bit with
// reference/norms.py (docs/numerics.md §9.2, §9.3). Launched by native/norms.py.
// schemes: fp8_current
//
// Every sum is S(v) of docs/numerics.md §9.2: the fp64 sum of a zero-padded power-of-two length p by the fixed
// pairwise tree "p times element i += element i + half". Its last bit depends only on which pairs are added, so
// the tree is split without changing a pair:
//   - a row sum (a CTA per row, T = min(p, THREADS) lanes, L = p / T elements per lane): the levels with
//     half >= T add elements of the same residue mod T, so lane t first reduces its own elements
//     i = t + j*T (j < L) by the same stride tree over j; then the levels half = T/2 .. 1 run across lanes in
//     shared memory;
//   - the stride tree over L elements equals the adjacent-pair tree over the bit-reversed order k -> j =
//     bitrev(k) (both split on the low bit of j last), which a lane streams with a binary-counter stack of
//     log2(L) + 1 partial sums (no array of L values);
//   - a column sum (a thread per column) is one lane's stream over all p rows (T = 1).
// fp64 adds commute exactly, so the operand order inside a pair is free; every add, multiply, division and
// square root is an explicit _rn intrinsic and every fp32 rounding point an explicit conversion, as named in
// reference/norms.py (the file is also compiled with -fmad=false, native/_compile.py).
// No format define is used (the `schemes:` line only names one build for the nvcc check).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;

#define NORM_THREADS 256  // a power of two (native/norms.py THREADS)
#define NORM_MAX_LOG 62   // stack depth bound: p <= 2^62 elements per sum

namespace nn {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// NUMERICS: numerics.md §9.2 ln_out / dx = RN_out(fp32 value): one round-to-nearest-even (a no-op for fp32).
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// fp64 -> fp32 rounding to odd: truncate, then set the last bit when inexact (finite values only).
__device__ __forceinline__ float round_to_odd_f32(double v) {
  const float r = __double2float_rz(v);
  if (isfinite(v) && static_cast<double>(r) != v) return __uint_as_float(__float_as_uint(r) | 1u);
  return r;
}
// NUMERICS: numerics.md §9.2 / §9.3 RN_out of an fp64 sum (reference.gemm.round_out): fp32 directly; bf16 / fp16
// through round-to-odd fp32 (24 bits >= 2 more than the target), which equals one RNE from fp64.
template <typename T> __device__ __forceinline__ T round_out(double v);
template <> __device__ __forceinline__ float round_out<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 round_out<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(round_to_odd_f32(v));
}
template <> __device__ __forceinline__ __half round_out<__half>(double v) { return __float2half_rn(round_to_odd_f32(v)); }

__host__ __device__ __forceinline__ i64 pow2_at_least(i64 n) {
  i64 p = 1;
  while (p < n) p <<= 1;
  return p;
}
__device__ __forceinline__ int log2_exact(i64 p) { return 63 - __clzll(p); }
__device__ __forceinline__ i64 bit_reverse(i64 k, int bits) {
  return bits == 0 ? 0 : static_cast<i64>(__brevll(static_cast<unsigned long long>(k)) >> (64 - bits));
}

// NUMERICS: numerics.md §9.2 S(v) over the elements j = 0 .. L-1 of one lane (L a power of two) by the stride tree
// "u[j] += u[j + L/2^l]", streamed as the adjacent-pair tree of the bit-reversed order with a binary-counter stack.
// `value(j)` is element j (0 for the zero padding). NV values are summed side by side (each its own tree).
template <int NV, typename F>
__device__ __forceinline__ void lane_tree(i64 L, F value, double out[NV]) {
  double stack[NORM_MAX_LOG + 1][NV];
  const int bits = log2_exact(L);
  for (i64 k = 0; k < L; ++k) {
    double v[NV];
    value(bit_reverse(k, bits), v);
    int d = 0;
    for (i64 kk = k; kk & 1; kk >>= 1, ++d) {
#pragma unroll
      for (int q = 0; q < NV; ++q) v[q] = __dadd_rn(stack[d][q], v[q]);  // the pair (left subtree, right subtree)
    }
#pragma unroll
    for (int q = 0; q < NV; ++q) stack[d][q] = v[q];
  }
#pragma unroll
  for (int q = 0; q < NV; ++q) out[q] = stack[bits][q];
}

// NUMERICS: numerics.md §9.2 S(v) of a row of K elements (`value(i)`, i < K) in one CTA: lane trees over the
// residues mod T, then the levels half = T/2 .. 1 across lanes in shared memory. Every thread gets the sums.
template <int NV, typename F>
__device__ __forceinline__ void row_tree(i64 K, F value, double out[NV]) {
  __shared__ double partial[NV][NORM_THREADS];
  const i64 p = pow2_at_least(K);
  const int T = static_cast<int>(p < NORM_THREADS ? p : NORM_THREADS);
  const int t = threadIdx.x;
  if (t < T) {
    double s[NV];
    lane_tree<NV>(p / T, [&](i64 j, double v[NV]) {
      const i64 i = static_cast<i64>(t) + j * T;
      if (i < K) {
        value(i, v);
      } else {
#pragma unroll
        for (int q = 0; q < NV; ++q) v[q] = 0.0;  // the zero padding up to p
      }
    }, s);
#pragma unroll
    for (int q = 0; q < NV; ++q) partial[q][t] = s[q];
  }
  __syncthreads();
  for (int h = T / 2; h >= 1; h >>= 1) {
    if (t < h) {
#pragma unroll
      for (int q = 0; q < NV; ++q) partial[q][t] = __dadd_rn(partial[q][t], partial[q][t + h]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < NV; ++q) out[q] = partial[q][0];
  __syncthreads();  // the buffer is reused by the next sum
}

// NUMERICS: numerics.md §9.2 mean = RN32(S / K): the fp64 quotient (correctly rounded), then one RN32.
__device__ __forceinline__ float mean32(double s, i64 K) {
  return __double2float_rn(__ddiv_rn(s, static_cast<double>(K)));
}

// NUMERICS: numerics.md §9.2 g = fp32(gamma), + 1 in one fp32 add with zero_centered_gamma (TE `g_ij += 1`).
template <typename T>
__device__ __forceinline__ float gamma_at(const T* gamma, i64 i, int zero_centered) {
  const float g = to_f32(gamma[i]);
  return zero_centered ? __fadd_rn(g, 1.0f) : g;
}

// NUMERICS: numerics.md §9.2 y = RN32(rs * RN32(x - mu)) (LayerNorm) or RN32(x * rs) (RMSNorm).
__device__ __forceinline__ float normalized(float x, float mu, float rs, int rms) {
  return rms ? __fmul_rn(x, rs) : __fmul_rn(__fsub_rn(x, mu), rs);
}

// Forward, a CTA per row (grid-stride over rows).
template <typename T>
__device__ void norm_forward(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, i64 M,
                             i64 K, float eps, int rms, int zero_centered, T* __restrict__ out,
                             float* __restrict__ out32, float* __restrict__ mu_out, float* __restrict__ rs_out) {
  for (i64 row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * K;
    float mu = 0.0f;
    double s[1];
    if (!rms) {
      // NUMERICS: numerics.md §9.2 mu = RN32(S(x)/K), x widened exactly to fp64.
      row_tree<1>(K, [&](i64 i, double v[1]) { v[0] = static_cast<double>(to_f32(xr[i])); }, s);
      mu = mean32(s[0], K);
      // NUMERICS: numerics.md §9.2 var = RN32(S((x - mu)^2)/K): the difference and its square each one fp64 rounding.
      const double mu64 = static_cast<double>(mu);
      row_tree<1>(K, [&](i64 i, double v[1]) {
        const double d = __dsub_rn(static_cast<double>(to_f32(xr[i])), mu64);
        v[0] = __dmul_rn(d, d);
      }, s);
    } else {
      // NUMERICS: numerics.md §9.2 RMSNorm ms = RN32(S(x^2)/K); x^2 is exact in fp64.
      row_tree<1>(K, [&](i64 i, double v[1]) {
        const double xd = static_cast<double>(to_f32(xr[i]));
        v[0] = __dmul_rn(xd, xd);
      }, s);
    }
    const float var = mean32(s[0], K);
    // NUMERICS: numerics.md §9.2 rsigma = RN32(1 / sqrt(RN32(var + eps))): fp32 add, then correctly rounded fp64
    // sqrt and division of the exact widening, then one RN32 (TE: rsqrtf).
    const float ve = __fadd_rn(var, eps);
    const float rs = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(static_cast<double>(ve))));
    if (threadIdx.x == 0) {
      rs_out[row] = rs;
      if (mu_out != nullptr) mu_out[row] = mu;
    }
    for (i64 i = threadIdx.x; i < K; i += blockDim.x) {
      const float y = normalized(to_f32(xr[i]), mu, rs, rms);
      const float g = gamma_at(gamma, i, zero_centered);
      // NUMERICS: numerics.md §9.2 LayerNorm out32 = FMA32(g, y, beta) (TE's contracted g*y + b); RMSNorm
      // out32 = RN32(g * y).
      const float o = rms ? __fmul_rn(g, y) : __fmaf_rn(g, y, to_f32(beta[i]));
      out32[row * K + i] = o;
      out[row * K + i] = from_f32<T>(o);  // NUMERICS: numerics.md §9.2 ln_out = RN_out(out32)
    }
  }
}

// Backward dx, a CTA per row (grid-stride over rows).
template <typename T>
__device__ void norm_backward(const T* __restrict__ dz, const T* __restrict__ x, const float* __restrict__ mu,
                              const float* __restrict__ rsigma, const T* __restrict__ gamma, i64 M, i64 K, int rms,
                              int zero_centered, T* __restrict__ dx) {
  for (i64 row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * K;
    const T* dzr = dz + row * K;
    const float m = rms ? 0.0f : mu[row];
    const float rs = rsigma[row];
    // NUMERICS: numerics.md §9.2 dyg = RN32(g * dz); y recomputed as in forward.
    auto dyg_at = [&](i64 i) { return __fmul_rn(gamma_at(gamma, i, zero_centered), to_f32(dzr[i])); };
    // NUMERICS: numerics.md §9.2 mdyy = RN32(S(dyg*y)/K) (fp64 product of two fp32: exact), mdy = RN32(S(dyg)/K).
    double s[2];
    row_tree<2>(K, [&](i64 i, double v[2]) {
      const double dyg = static_cast<double>(dyg_at(i));
      v[0] = __dmul_rn(dyg, static_cast<double>(normalized(to_f32(xr[i]), m, rs, rms)));
      v[1] = dyg;
    }, s);
    const float mdyy = mean32(s[0], K);
    const float mdy = mean32(s[1], K);
    for (i64 i = threadIdx.x; i < K; i += blockDim.x) {
      const float y = normalized(to_f32(xr[i]), m, rs, rms);
      const float dyg = dyg_at(i);
      // NUMERICS: numerics.md §9.2 LayerNorm dx = RN32(rs * RN32(dyg - FMA32(mdyy, y, mdy))); RMSNorm
      // dx = RN32(rs * FMA32(-mdyy, y, dyg)) (TE's contracted a*b + c); then one RN to x's dtype.
      const float d = rms ? __fmaf_rn(-mdyy, y, dyg) : __fsub_rn(dyg, __fmaf_rn(mdyy, y, mdy));
      dx[row * K + i] = from_f32<T>(__fmul_rn(d, rs));
    }
  }
}

// dgamma / dbeta, a thread per column (grid-stride over columns): S over the M rows of dz*y and of dz.
template <typename T>
__device__ void norm_columns(const T* __restrict__ dz, const T* __restrict__ x, const float* __restrict__ mu,
                             const float* __restrict__ rsigma, i64 M, i64 K, int rms, T* __restrict__ dgamma,
                             T* __restrict__ dbeta) {
  const i64 p = pow2_at_least(M);
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < K;
       col += static_cast<i64>(gridDim.x) * blockDim.x) {
    double s[2];
    lane_tree<2>(p, [&](i64 r, double v[2]) {
      if (r < M) {
        const double d = static_cast<double>(to_f32(dz[r * K + col]));
        const float y = normalized(to_f32(x[r * K + col]), rms ? 0.0f : mu[r], rsigma[r], rms);
        v[0] = __dmul_rn(d, static_cast<double>(y));  // NUMERICS: numerics.md §9.2 dz*y exact in fp64
        v[1] = d;
      } else {
        v[0] = 0.0;
        v[1] = 0.0;
      }
    }, s);
    // NUMERICS: numerics.md §9.2 dgamma = RN_gamma(S_rows(dz*y)), dbeta = RN_gamma(S_rows(dz)): one rounding each.
    dgamma[col] = round_out<T>(s[0]);
    if (dbeta != nullptr) dbeta[col] = round_out<T>(s[1]);
  }
}

// dbias, a thread per column: RN_out(S over the M rows of x) (docs/numerics.md §9.3).
template <typename T>
__device__ void column_sum(const T* __restrict__ x, i64 M, i64 K, T* __restrict__ out) {
  const i64 p = pow2_at_least(M);
  for (i64 col = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; col < K;
       col += static_cast<i64>(gridDim.x) * blockDim.x) {
    double s[1];
    lane_tree<1>(p, [&](i64 r, double v[1]) { v[0] = r < M ? static_cast<double>(to_f32(x[r * K + col])) : 0.0; }, s);
    out[col] = round_out<T>(s[0]);  // NUMERICS: numerics.md §9.3 dbias = RN_act(S over tokens of dY)
  }
}

}  // namespace nn

#define NORMS_INSTANTIATE(SFX, T)                                                                                    \
  extern "C" __global__ void __launch_bounds__(NORM_THREADS) norm_forward_##SFX(                                    \
      const T* x, const T* gamma, const T* beta, i64 M, i64 K, float eps, int rms, int zero_centered, T* out,       \
      float* out32, float* mu, float* rsigma) {                                                                     \
    nn::norm_forward<T>(x, gamma, beta, M, K, eps, rms, zero_centered, out, out32, mu, rsigma);                    \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(NORM_THREADS) norm_backward_##SFX(                                   \
      const T* dz, const T* x, const float* mu, const float* rsigma, const T* gamma, i64 M, i64 K, int rms,         \
      int zero_centered, T* dx) {                                                                                   \
    nn::norm_backward<T>(dz, x, mu, rsigma, gamma, M, K, rms, zero_centered, dx);                                  \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(NORM_THREADS) norm_columns_##SFX(                                    \
      const T* dz, const T* x, const float* mu, const float* rsigma, i64 M, i64 K, int rms, T* dgamma, T* dbeta) {  \
    nn::norm_columns<T>(dz, x, mu, rsigma, M, K, rms, dgamma, dbeta);                                              \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(NORM_THREADS) column_sum_##SFX(const T* x, i64 M, i64 K, T* out) {   \
    nn::column_sum<T>(x, M, K, out);                                                                               \
  }

NORMS_INSTANTIATE(f32, float)
NORMS_INSTANTIATE(bf16, __nv_bfloat16)
NORMS_INSTANTIATE(f16, __half)
