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
// fp64 adds commute exactly, so the operand order inside a pair is free. The arithmetic (every add, multiply,
// division and square root an explicit _rn intrinsic, every fp32 rounding point an explicit conversion, as named in
// reference/norms.py) and the per-lane tree live in norms.cuh, which tests/unit/host/norms_replay.cpp also
// replays on the CPU; this file adds the CTA glue (the cross-lane levels in shared memory) and the kernels
// (also compiled with -fmad=false, native/_compile.py).
// No format define is used (the `schemes:` line only names one build for the nvcc check).

#include "norms.cuh"

typedef long long i64;

namespace nn {

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
      for (int q = 0; q < NV; ++q) partial[q][t] = add_d(partial[q][t], partial[q][t + h]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < NV; ++q) out[q] = partial[q][0];
  __syncthreads();  // the buffer is reused by the next sum
}

template <typename T>
__device__ __forceinline__ float gamma_at(const T* gamma, i64 i, int zero_centered) {
  return gamma_of(to_f32(gamma[i]), zero_centered);
}

// Forward, a CTA per row (grid-stride over rows). The arithmetic is norms.cuh's (its NUMERICS comments).
template <typename T>
__device__ void norm_forward(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, i64 M,
                             i64 K, float eps, int rms, int zero_centered, T* __restrict__ out,
                             float* __restrict__ out32, float* __restrict__ mu_out, float* __restrict__ rs_out) {
  for (i64 row = blockIdx.x; row < M; row += gridDim.x) {
    const T* xr = x + row * K;
    float mu = 0.0f;
    double s[1];
    if (!rms) {
      // NUMERICS: numerics.md §9.2 mu = RN32(S(x)/K) (x widened exactly), var = RN32(S((x - mu)^2)/K).
      row_tree<1>(K, [&](i64 i, double v[1]) { v[0] = static_cast<double>(to_f32(xr[i])); }, s);
      mu = mean32(s[0], K);
      row_tree<1>(K, [&](i64 i, double v[1]) { v[0] = centred_square(to_f32(xr[i]), mu); }, s);
    } else {
      // NUMERICS: numerics.md §9.2 RMSNorm ms = RN32(S(x^2)/K).
      row_tree<1>(K, [&](i64 i, double v[1]) { v[0] = square(to_f32(xr[i])); }, s);
    }
    const float rs = rsigma_of(mean32(s[0], K), eps);
    if (threadIdx.x == 0) {
      rs_out[row] = rs;
      if (mu_out != nullptr) mu_out[row] = mu;
    }
    for (i64 i = threadIdx.x; i < K; i += blockDim.x) {
      const float y = normalized(to_f32(xr[i]), mu, rs, rms);
      const float o = out32_of(gamma_at(gamma, i, zero_centered), y, rms ? 0.0f : to_f32(beta[i]), rms);
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
    auto dyg_at = [&](i64 i) { return mul_f(gamma_at(gamma, i, zero_centered), to_f32(dzr[i])); };
    // NUMERICS: numerics.md §9.2 mdyy = RN32(S(dyg*y)/K) (fp64 product of two fp32: exact), mdy = RN32(S(dyg)/K).
    double s[2];
    row_tree<2>(K, [&](i64 i, double v[2]) {
      const float dyg = dyg_at(i);
      v[0] = mul_d(static_cast<double>(dyg), static_cast<double>(normalized(to_f32(xr[i]), m, rs, rms)));
      v[1] = static_cast<double>(dyg);
    }, s);
    const float mdyy = mean32(s[0], K);
    const float mdy = mean32(s[1], K);
    for (i64 i = threadIdx.x; i < K; i += blockDim.x) {
      const float y = normalized(to_f32(xr[i]), m, rs, rms);
      dx[row * K + i] = from_f32<T>(dx32_of(dyg_at(i), y, mdyy, mdy, rs, rms));  // then one RN to x's dtype
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
        const float d = to_f32(dz[r * K + col]);
        const float y = normalized(to_f32(x[r * K + col]), rms ? 0.0f : mu[r], rsigma[r], rms);
        v[0] = mul_d(static_cast<double>(d), static_cast<double>(y));  // NUMERICS: numerics.md §9.2 dz*y exact
        v[1] = static_cast<double>(d);
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
