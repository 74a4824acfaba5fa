// Portable block-scaled GEMM for every scheme, on any GPU: the decode + fp32-accumulate model of
// docs/numerics.md §6, with a fixed, documented accumulation order (no tensor cores, no atomics, so the
// result is deterministic and independent of the launch shape).
//
// out[m, n] = sum_k a(m, k) * b(n, k): both operands are read "K-major" through strides, so every
// layout (TN / NN / NT) and every stored copy (rowwise, colwise, transposed or not) is consumed in
// place. The host (native/gemm.py) passes, per operand, the element strides (i: output index m or
// n; k: contraction index) and the scale addressing scale(i, kb) = S[(i / s_idiv) * s_is + kb * s_ks].
//
// Accumulation order, per output element (NUMERICS: §6; this is the contract of method="portable"):
//   y = +0 (fp32)
//   for kb = 0, 1, ... (K blocks of KBLOCK, increasing; the last one may be partial):
//       p = +0; for k in the block, increasing: p = RN(p + dec(a)·dec(b))   (the product is exact)
//       SCALE_KIND 1 (fp8_block, fp32 sinv): y = FMA32(RN(p·s_first), s_second, y), s_first = the
//                   1-D operand's scale (a's when both are 1-D; b's for 2D(a)×1D(b), SCALE_B_FIRST)
//       SCALE_KIND 2 (mxfp8, UE8M0):        y = FMA32(RN(p·D(e_a)), D(e_b), y)
//       SCALE_KIND 3 (nvfp4, UE4M3):        y = FMA32(p, RN(s_a·s_b), y)  (s_a·s_b and p·s_a·s_b exact)
//   SCALE_KIND 0 (per-tensor, fp32 sinv): one p over all of K, then y = RN(RN(p·sinv_a)·sinv_b)
//   y = RN(alpha·y) if HAS_ALPHA (nvfp4 §5.8 alpha = RN(RN(amax_a·amax_b)·NVFP4_RECIP_ALPHA), computed here
//   from the consumed copies' global amaxes)
//   epilogue 0 (all but fp8_block; NVFP4 §6, cuBLASLt's alpha·AB + beta·C, then its BIAS epilogue):
//                  y = RN(y + C) if C (C read as fp32); y = RN(y + bias[n]) if bias; out = RN_out(y)
//   epilogue 1 (fp8_block §6, TE's cuBLAS-matching order):
//                  y = RN(y + bias[n]) if bias; out = RN_out(y), or with C: RN_out(RN(C + RN_out(y)))
//
// Defines. Every format number comes from the reference/formats.py rows through
// native._compile.defines_for(config of A) (ELEM_*, SCALE_*, BLOCK, E8M0_BIAS, SCHEME_*), plus, from
// native/gemm.py, B's element format as B_* (HYBRID e4m3 x e5m2) and the GEMM options below. Each
// option has a default, so the file also builds with defines_for() alone (`--nvcc-check`):
//   A_* / B_*      element format: BITS, EXP_BITS, MAN_BITS, BIAS, HAS_INF, NAN_CODE (magnitude, or -1)
//   KBLOCK         K block length (BLOCK; per-tensor: a loading chunk only, p is never reset)
//   SCALE_KIND     0 per-tensor fp32, 1 fp8_block fp32, 2 UE8M0, 3 UE4M3
//   SCALE_B_FIRST  fp8_block 2D(a)x1D(b): apply b's scale first
//   HAS_ALPHA      nvfp4 global alpha;  OUT_BF16  1: bf16 output, 0: fp32 output

// A format: the config's element row.
#ifndef A_BITS
#define A_BITS ELEM_BITS
#define A_EXP_BITS ELEM_EXP_BITS
#define A_MAN_BITS ELEM_MAN_BITS
#define A_BIAS ELEM_BIAS
// IEEE-like (Inf and NaN in the all-ones exponent) iff the max code's exponent is not all ones.
#define A_HAS_INF ((((ELEM_MAX_CODE) >> (ELEM_MAN_BITS)) & ((1 << (ELEM_EXP_BITS)) - 1)) != ((1 << (ELEM_EXP_BITS)) - 1))
// A format whose "NaN code" is its max code (E2M1: NaN encodes to +max) has no NaN to decode.
#define A_NAN_CODE (((ELEM_NAN_CODE) != (ELEM_MAX_CODE) && !(A_HAS_INF)) ? (ELEM_NAN_CODE) : -1)
#endif
// B format: defaults to A's (pass B_* for mixed e4m3 x e5m2).
#ifndef B_BITS
#define B_BITS A_BITS
#define B_EXP_BITS A_EXP_BITS
#define B_MAN_BITS A_MAN_BITS
#define B_BIAS A_BIAS
#define B_HAS_INF A_HAS_INF
#define B_NAN_CODE A_NAN_CODE
#endif
#ifndef SCALE_KIND
#if defined(SCALE_FP32) && BLOCK == 0
#define SCALE_KIND 0
#elif defined(SCALE_FP32)
#define SCALE_KIND 1
#elif defined(SCALE_UE8M0)
#define SCALE_KIND 2
#elif defined(SCALE_E4M3)
#define SCALE_KIND 3
#else
#error "block_scaled_gemm.cu: no SCALE_* define (pass native._compile.defines_for(config))"
#endif
#endif
#ifndef KBLOCK
#if BLOCK == 0
#define KBLOCK 128
#else
#define KBLOCK BLOCK
#endif
#endif
#ifndef SCALE_B_FIRST
#define SCALE_B_FIRST 0
#endif
#ifndef HAS_ALPHA
#ifdef SCHEME_NVFP4
#define HAS_ALPHA 1
#else
#define HAS_ALPHA 0
#endif
#endif
#ifndef OUT_BF16
#define OUT_BF16 1
#endif
#if SCALE_KIND == 2
#define SCALE_E8M0_BIAS E8M0_BIAS
#endif
#if SCALE_KIND == 3
#define S_NAN_CODE (((SCALE_NAN_CODE) != (SCALE_MAX_CODE)) ? (SCALE_NAN_CODE) : -1)
#endif

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#define BM 64
#define BN 64
#define KT 16
#define TX 16
#define TY 16
#define THREADS (TX * TY)
#define RM (BM / TY)
#define RN_ (BN / TX)

// Exact value of a code of a generic (exp_bits, man_bits, bias) format; docs/numerics.md §0.4.
// HAS_INF: IEEE-like (exponent all ones = Inf/NaN); else NAN_CODE (>= 0) is the only NaN magnitude.
template <int BITS, int EXP, int MAN, int BIAS, int HAS_INF, int NAN_CODE>
__device__ float decode_code(u32 c) {
  const u32 mag_mask = (1u << (BITS - 1)) - 1u;
  const u32 mag = c & mag_mask;
  const bool neg = (c >> (BITS - 1)) & 1u;
  const u32 e = mag >> MAN;
  const u32 f = mag & ((1u << MAN) - 1u);
  float v;
  if (HAS_INF && e == (1u << EXP) - 1u) {
    v = (f == 0u) ? __int_as_float(0x7F800000) : __int_as_float(0x7FC00000);
  } else if (NAN_CODE >= 0 && mag == (u32)NAN_CODE) {
    v = __int_as_float(0x7FC00000);
  } else if (e == 0u) {
    v = ldexpf((float)f, 1 - BIAS - MAN);  // subnormal: f · 2^(emin - man); exact
  } else {
    v = ldexpf((float)(f | (1u << MAN)), (int)e - BIAS - MAN);  // exact
  }
  return neg ? -v : v;
}

__device__ __forceinline__ float decode_a(u32 c) {
  return decode_code<A_BITS, A_EXP_BITS, A_MAN_BITS, A_BIAS, A_HAS_INF, A_NAN_CODE>(c);
}
__device__ __forceinline__ float decode_b(u32 c) {
  return decode_code<B_BITS, B_EXP_BITS, B_MAN_BITS, B_BIAS, B_HAS_INF, B_NAN_CODE>(c);
}

// Decode one block-scale entry to its exact fp32 value.
__device__ __forceinline__ float decode_scale(const void* s, i64 off) {
#if SCALE_KIND == 0 || SCALE_KIND == 1
  return reinterpret_cast<const float*>(s)[off];  // fp32 sinv as stored
#elif SCALE_KIND == 2
  // NUMERICS: §0.5 E8M0 decode D(e) = 2^(e - 127), D(0) subnormal, 0xFF = NaN.
  const u32 e = reinterpret_cast<const u8*>(s)[off];
  if (e == 0xFFu) return __int_as_float(0x7FC00000);
  return ldexpf(1.0f, (int)e - SCALE_E8M0_BIAS);
#elif SCALE_KIND == 3
  // NUMERICS: §0.4 UE4M3 = an E4M3 bit pattern with sign 0 (0x00 = 0 is legal).
  const u32 c = reinterpret_cast<const u8*>(s)[off] & 0x7Fu;
  return decode_code<SCALE_BITS, SCALE_EXP_BITS, SCALE_MAN_BITS, SCALE_BIAS, 0, S_NAN_CODE>(c);
#else
#error "unknown SCALE_KIND"
#endif
}

// Round-to-nearest-even fp32 -> bf16 bits (NaN -> 0x7FC0, overflow -> inf), like torch's .to(bfloat16).
__device__ __forceinline__ unsigned short f32_to_bf16_rn(float v) {
  u32 b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)0x7FC0u;
  b += 0x7FFFu + ((b >> 16) & 1u);
  return (unsigned short)(b >> 16);
}
__device__ __forceinline__ float bf16_to_f32(unsigned short h) { return __uint_as_float(((u32)h) << 16); }

struct Operand {
  const u8* data;
  i64 is;       // element stride along the output index (8-bit: elements; 4-bit: bytes per row)
  i64 ks;       // element stride along K (8-bit only; 4-bit data is always K-packed)
  const void* scale;
  i64 s_idiv;   // scale row = i / s_idiv (128 for 128x128 tiles, else 1)
  i64 s_is;
  i64 s_ks;
};

template <int BITS>
__device__ __forceinline__ u32 load_code(const Operand& o, i64 i, i64 k) {
  if (BITS == 8) return o.data[i * o.is + k * o.ks];
  const u8 byte = o.data[i * o.is + (k >> 1)];  // NUMERICS: §5.4 even element in the low nibble
  return (k & 1) ? (u32)(byte >> 4) : (u32)(byte & 0xF);
}

extern "C" __global__ void __launch_bounds__(THREADS)
block_scaled_gemm(const u8* __restrict__ a_data, i64 a_is, i64 a_ks, const void* __restrict__ a_scale,
                  i64 a_s_idiv, i64 a_s_is, i64 a_s_ks,
                  const u8* __restrict__ b_data, i64 b_is, i64 b_ks, const void* __restrict__ b_scale,
                  i64 b_s_idiv, i64 b_s_is, i64 b_s_ks,
                  const float* __restrict__ amax_a, const float* __restrict__ amax_b, const float* __restrict__ bias,
                  const float* __restrict__ c_in, int epilogue, void* __restrict__ out,
                  i64 M, i64 N, i64 K) {
  __shared__ float lut_a[1 << A_BITS];
  __shared__ float lut_b[1 << B_BITS];
  __shared__ float As[KT][BM + 1];
  __shared__ float Bs[KT][BN + 1];
#if SCALE_KIND != 0
  __shared__ float sa[BM];
  __shared__ float sb[BN];
#endif

  const Operand A = {a_data, a_is, a_ks, a_scale, a_s_idiv, a_s_is, a_s_ks};
  const Operand B = {b_data, b_is, b_ks, b_scale, b_s_idiv, b_s_is, b_s_ks};
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * TX + tx;
  const i64 m0 = (i64)blockIdx.y * BM, n0 = (i64)blockIdx.x * BN;

  for (int c = tid; c < (1 << A_BITS); c += THREADS) lut_a[c] = decode_a((u32)c);
  for (int c = tid; c < (1 << B_BITS); c += THREADS) lut_b[c] = decode_b((u32)c);

  float y[RM][RN_];
  float p[RM][RN_];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN_; ++j) { y[i][j] = 0.0f; p[i][j] = 0.0f; }

  // Loader mapping: K-contiguous operands put consecutive threads on consecutive k.
  const bool a_kfast = (A_BITS == 4) || (a_ks == 1);
  const bool b_kfast = (B_BITS == 4) || (b_ks == 1);
  const i64 nkb = (K + KBLOCK - 1) / KBLOCK;

  for (i64 kb = 0; kb < nkb; ++kb) {
    const i64 k_lo = kb * KBLOCK;
    const i64 k_hi = min(K, k_lo + (i64)KBLOCK);
#if SCALE_KIND != 0
    __syncthreads();
    for (int r = tid; r < BM; r += THREADS) {
      const i64 m = m0 + r;
      sa[r] = (m < M) ? decode_scale(A.scale, (m / A.s_idiv) * A.s_is + kb * A.s_ks) : 0.0f;
    }
    for (int r = tid; r < BN; r += THREADS) {
      const i64 n = n0 + r;
      sb[r] = (n < N) ? decode_scale(B.scale, (n / B.s_idiv) * B.s_is + kb * B.s_ks) : 0.0f;
    }
#endif
    for (i64 kt = k_lo; kt < k_hi; kt += KT) {
      __syncthreads();
      // (KT, BM) tile of decoded A, (KT, BN) tile of decoded B; zero outside [0, M) x [kt, k_hi).
      for (int e = tid; e < KT * BM; e += THREADS) {
        const int kk = a_kfast ? (e % KT) : (e / BM);
        const int ii = a_kfast ? (e / KT) : (e % BM);
        const i64 m = m0 + ii, k = kt + kk;
        As[kk][ii] = (m < M && k < k_hi) ? lut_a[load_code<A_BITS>(A, m, k)] : 0.0f;
      }
      for (int e = tid; e < KT * BN; e += THREADS) {
        const int kk = b_kfast ? (e % KT) : (e / BN);
        const int ii = b_kfast ? (e / KT) : (e % BN);
        const i64 n = n0 + ii, k = kt + kk;
        Bs[kk][ii] = (n < N && k < k_hi) ? lut_b[load_code<B_BITS>(B, n, k)] : 0.0f;
      }
      __syncthreads();
      // NUMERICS: §6 portable order - p accumulates in fp32 in increasing k (zero padding adds +0).
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        float av[RM], bv[RN_];
#pragma unroll
        for (int i = 0; i < RM; ++i) av[i] = As[kk][ty + i * TY];
#pragma unroll
        for (int j = 0; j < RN_; ++j) bv[j] = Bs[kk][tx + j * TX];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
          for (int j = 0; j < RN_; ++j) p[i][j] = __fadd_rn(p[i][j], __fmul_rn(av[i], bv[j]));
      }
    }
#if SCALE_KIND != 0
    // Block end: apply the block scales, then start the next block's partial sum from +0.
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const float s_a = sa[ty + i * TY];
#pragma unroll
      for (int j = 0; j < RN_; ++j) {
        const float s_b = sb[tx + j * TX];
#if SCALE_KIND == 1
#if SCALE_B_FIRST
        // NUMERICS: §6 blockwise 2D(a)x1D(b): y <- FMA32(RN(p*sinv_b), sinv_a, y)
        y[i][j] = __fmaf_rn(__fmul_rn(p[i][j], s_b), s_a, y[i][j]);
#else
        // NUMERICS: §6 blockwise 1Dx1D and 1D(a)x2D(b): y <- FMA32(RN(p*sinv_a), sinv_b, y)
        y[i][j] = __fmaf_rn(__fmul_rn(p[i][j], s_a), s_b, y[i][j]);
#endif
#elif SCALE_KIND == 2
        // NUMERICS: §6 MXFP8 block term D(e_a)*D(e_b)*p, applied a-scale first like fp8_block.
        y[i][j] = __fmaf_rn(__fmul_rn(p[i][j], s_a), s_b, y[i][j]);
#else
        // NUMERICS: §6 NVFP4 block term s_a*s_b*p is exact in fp32; one rounding in the add.
        y[i][j] = __fmaf_rn(p[i][j], __fmul_rn(s_a, s_b), y[i][j]);
#endif
        p[i][j] = 0.0f;
      }
    }
#endif
  }

#if SCALE_KIND == 0
  {
    // NUMERICS: §6 per-tensor Y = sinv_a * sinv_b * sum; portable order RN(RN(p*sinv_a)*sinv_b).
    const float s_a = reinterpret_cast<const float*>(A.scale)[0];
    const float s_b = reinterpret_cast<const float*>(B.scale)[0];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN_; ++j) y[i][j] = __fmul_rn(__fmul_rn(p[i][j], s_a), s_b);
  }
#endif

#if HAS_ALPHA
  // NUMERICS: §5.8 alpha = RN(RN(A_g,a * A_g,b) * fl(1/7225344)): multiplied by the reciprocal, never divided.
  const float alpha = __fmul_rn(__fmul_rn(amax_a[0], amax_b[0]), NVFP4_RECIP_ALPHA);
#endif
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const i64 m = m0 + ty + i * TY;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < RN_; ++j) {
      const i64 n = n0 + tx + j * TX;
      if (n >= N) continue;
      float v = y[i][j];
#if HAS_ALPHA
      v = __fmul_rn(alpha, v);  // NUMERICS: §5.8 alpha applied once to the fp32 sum
#endif
      const i64 o = m * N + n;
      if (epilogue == 1) {
        // NUMERICS: §6 blockwise - bias in fp32, RN_out, then D = RN_out(C + RN_out(Y)).
        if (bias != nullptr) v = __fadd_rn(v, bias[n]);
        if (c_in != nullptr) {
#if OUT_BF16
          v = bf16_to_f32(f32_to_bf16_rn(v));
#endif
          v = __fadd_rn(c_in[o], v);
        }
      } else {
        // NUMERICS: §6 NVFP4 D = RN_out(C + Y) added in fp32; bias added in fp32 after C.
        if (c_in != nullptr) v = __fadd_rn(v, c_in[o]);
        if (bias != nullptr) v = __fadd_rn(v, bias[n]);
      }
#if OUT_BF16
      reinterpret_cast<unsigned short*>(out)[o] = f32_to_bf16_rn(v);
#else
      reinterpret_cast<float*>(out)[o] = v;
#endif
    }
  }
}
