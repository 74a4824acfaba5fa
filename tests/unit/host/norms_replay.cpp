// Host replay of native/cuda/norms.cuh (the norm kernels' arithmetic and per-lane tree, compiled for the CPU):
// one CTA's row sums emulated lane by lane (lane_tree per lane, then the cross-lane levels half = T/2 .. 1, as
// norms.cu's row_tree), and the column sums as one lane over all rows (norms.cu's column kernels).
// Usage: norms_replay DTYPE(f32|bf16|f16) M K RMS ZERO_CENTERED EPS_BITS in.bin out.bin
// in.bin: x [M*K], gamma [K], beta [K], dz [M*K] (DTYPE). out.bin: ln_out [M*K] (DTYPE), out32 [M*K] (f32),
// mu [M] (f32), rsigma [M] (f32), dx [M*K] (DTYPE), dgamma [K], dbeta [K], dbias [K] = column sums of dz (DTYPE).
// Built by test_native_norms_host_replay.py (nvcc -x cu: a host program; no kernel, no GPU).
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "norms.cuh"

using nn::i64;

template <int NV, typename F>
static void row_sums(i64 K, const F& value, double out[NV]) {
  const i64 p = nn::pow2_at_least(K);
  const int T = static_cast<int>(p < NORM_THREADS ? p : NORM_THREADS);
  std::vector<std::array<double, NV>> part(T);
  for (int t = 0; t < T; ++t) {
    double s[NV];
    nn::lane_tree<NV>(p / T, [&](i64 j, double v[NV]) {
      const i64 i = static_cast<i64>(t) + j * T;
      if (i < K) {
        value(i, v);
      } else {
        for (int q = 0; q < NV; ++q) v[q] = 0.0;
      }
    }, s);
    for (int q = 0; q < NV; ++q) part[t][q] = s[q];
  }
  for (int h = T / 2; h >= 1; h >>= 1)
    for (int t = 0; t < h; ++t)
      for (int q = 0; q < NV; ++q) part[t][q] = nn::add_d(part[t][q], part[t + h][q]);
  for (int q = 0; q < NV; ++q) out[q] = part[0][q];
}

template <typename T>
static int run(i64 M, i64 K, int rms, int zc, float eps, FILE* in, FILE* out) {
  std::vector<T> x(M * K), gamma(K), beta(K), dz(M * K);
  if (std::fread(x.data(), sizeof(T), x.size(), in) != x.size() || std::fread(gamma.data(), sizeof(T), K, in) != (size_t)K ||
      std::fread(beta.data(), sizeof(T), K, in) != (size_t)K || std::fread(dz.data(), sizeof(T), dz.size(), in) != dz.size())
    return 4;
  std::vector<T> ln(M * K), dx(M * K), dgamma(K), dbeta(K), dbias(K);
  std::vector<float> o32(M * K), mu(M), rs(M);
  for (i64 r = 0; r < M; ++r) {  // forward (norms.cu norm_forward)
    const T* xr = &x[r * K];
    double s[1];
    float m = 0.0f;
    if (!rms) {
      row_sums<1>(K, [&](i64 i, double v[1]) { v[0] = static_cast<double>(nn::to_f32(xr[i])); }, s);
      m = nn::mean32(s[0], K);
      row_sums<1>(K, [&](i64 i, double v[1]) { v[0] = nn::centred_square(nn::to_f32(xr[i]), m); }, s);
    } else {
      row_sums<1>(K, [&](i64 i, double v[1]) { v[0] = nn::square(nn::to_f32(xr[i])); }, s);
    }
    mu[r] = m;
    rs[r] = nn::rsigma_of(nn::mean32(s[0], K), eps);
    for (i64 i = 0; i < K; ++i) {
      const float y = nn::normalized(nn::to_f32(xr[i]), m, rs[r], rms);
      const float o = nn::out32_of(nn::gamma_of(nn::to_f32(gamma[i]), zc), y, rms ? 0.0f : nn::to_f32(beta[i]), rms);
      o32[r * K + i] = o;
      ln[r * K + i] = nn::from_f32<T>(o);
    }
  }
  for (i64 r = 0; r < M; ++r) {  // backward dx (norms.cu norm_backward)
    const T* xr = &x[r * K];
    const T* dzr = &dz[r * K];
    auto dyg_at = [&](i64 i) { return nn::mul_f(nn::gamma_of(nn::to_f32(gamma[i]), zc), nn::to_f32(dzr[i])); };
    double s[2];
    row_sums<2>(K, [&](i64 i, double v[2]) {
      const float dyg = dyg_at(i);
      v[0] = nn::mul_d(static_cast<double>(dyg), static_cast<double>(nn::normalized(nn::to_f32(xr[i]), mu[r], rs[r], rms)));
      v[1] = static_cast<double>(dyg);
    }, s);
    const float mdyy = nn::mean32(s[0], K), mdy = nn::mean32(s[1], K);
    for (i64 i = 0; i < K; ++i) {
      const float y = nn::normalized(nn::to_f32(xr[i]), mu[r], rs[r], rms);
      dx[r * K + i] = nn::from_f32<T>(nn::dx32_of(dyg_at(i), y, mdyy, mdy, rs[r], rms));
    }
  }
  const i64 p = nn::pow2_at_least(M);
  for (i64 c = 0; c < K; ++c) {  // columns (norms.cu norm_columns, column_sum)
    double s[2], b[1];
    nn::lane_tree<2>(p, [&](i64 r, double v[2]) {
      if (r < M) {
        const float d = nn::to_f32(dz[r * K + c]);
        const float y = nn::normalized(nn::to_f32(x[r * K + c]), mu[r], rs[r], rms);
        v[0] = nn::mul_d(static_cast<double>(d), static_cast<double>(y));
        v[1] = static_cast<double>(d);
      } else {
        v[0] = v[1] = 0.0;
      }
    }, s);
    nn::lane_tree<1>(p, [&](i64 r, double v[1]) { v[0] = r < M ? static_cast<double>(nn::to_f32(dz[r * K + c])) : 0.0; }, b);
    dgamma[c] = nn::round_out<T>(s[0]);
    dbeta[c] = nn::round_out<T>(s[1]);
    dbias[c] = nn::round_out<T>(b[0]);
  }
  std::fwrite(ln.data(), sizeof(T), ln.size(), out);
  std::fwrite(o32.data(), sizeof(float), o32.size(), out);
  std::fwrite(mu.data(), sizeof(float), M, out);
  std::fwrite(rs.data(), sizeof(float), M, out);
  std::fwrite(dx.data(), sizeof(T), dx.size(), out);
  std::fwrite(dgamma.data(), sizeof(T), K, out);
  std::fwrite(dbeta.data(), sizeof(T), K, out);
  std::fwrite(dbias.data(), sizeof(T), K, out);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 9) return 2;
  const i64 M = std::atoll(argv[2]), K = std::atoll(argv[3]);
  const int rms = std::atoi(argv[4]), zc = std::atoi(argv[5]);
  const unsigned int eps_bits = static_cast<unsigned int>(std::strtoul(argv[6], nullptr, 0));
  const float eps = nn::u2f(eps_bits);
  FILE* in = std::fopen(argv[7], "rb");
  FILE* out = std::fopen(argv[8], "wb");
  if (!in || !out) return 3;
  int rc = 2;
  if (!std::strcmp(argv[1], "f32")) rc = run<float>(M, K, rms, zc, eps, in, out);
  if (!std::strcmp(argv[1], "bf16")) rc = run<__nv_bfloat16>(M, K, rms, zc, eps, in, out);
  if (!std::strcmp(argv[1], "f16")) rc = run<__half>(M, K, rms, zc, eps, in, out);
  std::fclose(in);
  std::fclose(out);
  return rc;
}
