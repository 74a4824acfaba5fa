// NVFP4 scalar rules shared by the kernels in nvfp4.cu: the E2M1 and E4M3 casts, the two-level
// scale chain, the stochastic-rounding rule, Philox4x32-10 and the 16-point RHT.
//
// Source: NUMERICS.md §0.3 (kernel rules), §0.5 (casts), §5.1-§5.8 (NVFP4); TE
// common/cast/nvfp4/core_nvfp4.cuh, common/util/ptx.cuh (SR), common/hadamard_transform/.
//
// Every function is __host__ __device__: the device build is what runs; the host build exists so
// the same source can be replayed on a CPU (the critical rounding points then use plain IEEE
// binary32/binary64 operators, compiled without contraction).
//
// Format numbers arrive as -D defines (native/_compile.defines_for(config), merged with the
// NVFP4_* extras of native/nvfp4.py); no format literal is written here.
#pragma once

// ---- required defines -------------------------------------------------------------------------
// From native/_compile.defines_for(config): the element row (ELEM_*, E2M1), the block-scale row
// (SCALE_*, E4M3), BLOCK, FP32_MAX, NVFP4_GLOBAL_MAX (= 6 * 448) and NVFP4_RECIP_GLOBAL_MAX.
#if !defined(ELEM_EXP_BITS) || !defined(ELEM_MAN_BITS) || !defined(ELEM_BIAS) || !defined(ELEM_EMAX) ||          \
    !defined(ELEM_MAX) || !defined(ELEM_RECIP_MAX) || !defined(ELEM_MAX_CODE) || !defined(ELEM_NAN_CODE) ||      \
    !defined(ELEM_SIGN_MASK) || !defined(SCALE_EXP_BITS) || !defined(SCALE_MAN_BITS) || !defined(SCALE_BIAS) || \
    !defined(SCALE_FP8_INTERP) || !defined(BLOCK) || !defined(FP32_MAX) || !defined(NVFP4_GLOBAL_MAX) ||        \
    !defined(NVFP4_RECIP_GLOBAL_MAX)
#error "nvfp4.cuh needs the nvfp4 defines of native/_compile.defines_for(config)"
#endif
// NUMERICS: §5.6 the RHT size, sign mask and scale, from the formats.py row through defines_for.
#if !defined(NVFP4_RHT_SIZE) || !defined(NVFP4_RHT_SIGN_MASK) || !defined(NVFP4_RHT_SCALE)
#error "nvfp4.cuh needs NVFP4_RHT_SIZE, NVFP4_RHT_SIGN_MASK, NVFP4_RHT_SCALE (native/_compile.defines_for)"
#endif

#include <cuda_fp8.h>

#define NVFP4_HD __host__ __device__ __forceinline__

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

namespace nvfp4 {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// IEEE binary32 layout (not a project format row): used to read exponents from bits.
constexpr int FP32_MAN_BITS = 23;
constexpr int FP32_EXP_BIAS = 127;
constexpr u32 FP32_EXP_MASK = 0xFFu;
constexpr u32 FP32_SIGN_BIT = 0x80000000u;

// ---- bit views and the rounding points ----------------------------------------------------------
NVFP4_HD u32 f2u(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    u32 u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

NVFP4_HD float u2f(u32 u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

NVFP4_HD float flt_max() { return FP32_MAX; }  // 0x7F7FFFFF, NUMERICS.md §0.1

// NUMERICS: §0.3 - write every rounding point with the _rn intrinsics so nothing is contracted or
// approximated (host build: plain IEEE operators, compiled with -ffp-contract=off).
NVFP4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

NVFP4_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

NVFP4_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

NVFP4_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
    return __frcp_rn(a);
#else
    return 1.0f / a;
#endif
}

NVFP4_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

NVFP4_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

NVFP4_HD float d2f_rn(double d) {
#if defined(__CUDA_ARCH__)
    return __double2float_rn(d);
#else
    return (float)d;
#endif
}

NVFP4_HD bool is_nan(float v) { return v != v; }

// fmin/fmax ignore NaN (NUMERICS.md §0.1): fminf/fmaxf on both sides.
NVFP4_HD float fmin_nn(float a, float b) { return fminf(a, b); }
NVFP4_HD float fmax_nn(float a, float b) { return fmaxf(a, b); }

// 2^k as fp32 for a normal exponent k (exact).
NVFP4_HD float pow2f(int k) { return u2f((u32)(k + FP32_EXP_BIAS) << FP32_MAN_BITS); }

// floor(log2 a) from the bits for a > 0 normal; fp32 subnormals and zero read as -FP32_EXP_BIAS, which
// every caller clamps up to the format's emin (all such values share the format's lowest quantum).
NVFP4_HD int floor_log2_clamped(float a, int lo, int hi) {
    int e = (int)((f2u(a) >> FP32_MAN_BITS) & FP32_EXP_MASK) - FP32_EXP_BIAS;
    e = e < lo ? lo : e;
    return e > hi ? hi : e;
}

// ---- input element loads (exact widening) ----------------------------------------------------
NVFP4_HD float bf16_to_f32(u16 b) { return u2f((u32)b << 16); }

NVFP4_HD float f16_to_f32(u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
    const u32 sign = (u32)(h >> 15) << 31, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return u2f(sign | 0x7F800000u | (m << 13));
    float mag = e == 0 ? (float)m * pow2f(-24) : (float)(m | 0x400u) * pow2f((int)e - 25);
    return u2f(sign | f2u(mag));
#endif
}

// RN_bf16 of an fp32 value, returned widened to fp32 (NUMERICS.md §5.6). NaN stays NaN.
NVFP4_HD float round_bf16(float f) {
    u32 u = f2u(f);
    if (is_nan(f)) return f;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // round half to even on the low 16 bits
    return u2f(u);
}

// ---- generic RNE-and-saturate onto a small format's grid --------------------------------------
// Magnitude code of a >= 0 on the grid of (EXP, MAN, BIAS) with finite max `maxv`: with
// e = max(floor(log2 a), emin), the grid step in a's binade is 2^(e-MAN) and the code is
// ((e - emin) << MAN) + n, n = RNE(a / 2^(e-MAN)) (subnormals and the carry into the next binade
// included); anything above max (inf included) saturates to max_code (a NaN a also gives max_code).
// n comes from one IEEE addition: M = 2^(e-MAN+23) has ulp 2^(e-MAN) and a + M < 2M, so RN(a + M)
// = M + n * 2^(e-MAN) with ties to even n, and n is the difference of the bit patterns. Branch-free,
// no float-to-int conversion.
// NUMERICS: §0.5 e2m1_rn (RNE on the grid, then saturate; equal to clamp-then-round).
template <int EXP, int MAN, int BIAS>
NVFP4_HD u32 rne_sat_mag(float a, float maxv, u32 max_code) {
    static_assert(MAN + 2 < FP32_MAN_BITS, "n must fit below M's mantissa");
    a = fmin_nn(a, maxv);  // > max, inf (and NaN) -> max, whose code is max_code
    const int emin = 1 - BIAS;
    const int e = floor_log2_clamped(a, emin, FP32_EXP_BIAS);
    const u32 m_bits = (u32)(e - MAN + FP32_MAN_BITS + FP32_EXP_BIAS) << FP32_MAN_BITS;  // M = 2^(e-MAN+23)
    const u32 n = f2u(add_rn(a, u2f(m_bits))) - m_bits;  // RN(a + M) = M + n * ulp(M), exactly
    const u32 code = ((u32)(e - emin) << MAN) + n;
    return code < max_code ? code : max_code;
}

// Exact value of a magnitude code of (EXP, MAN, BIAS) (no NaN/Inf patterns are decoded here).
template <int EXP, int MAN, int BIAS>
NVFP4_HD float decode_mag(u32 code) {
    const u32 e = code >> MAN, m = code & ((1u << MAN) - 1u);
    if (e == 0) return mul_rn((float)m, pow2f(1 - BIAS - MAN));
    return mul_rn((float)(m | (1u << MAN)), pow2f((int)e - BIAS - MAN));
}

constexpr u32 ELEM_SIGN = ELEM_SIGN_MASK;

// ---- E2M1 round to nearest -------------------------------------------------------------------
// NUMERICS: §0.5 e2m1_rn - ties to the even code; sign bit copied from v (-0.0 and tiny negatives
// give 0x8); NaN of either sign gives ELEM_NAN_CODE (+6); |v| > 6 and inf saturate.
NVFP4_HD u32 e2m1_rn(float v) {
    const bool nan = is_nan(v);
    const u32 sign = (f2u(v) & FP32_SIGN_BIT) ? ELEM_SIGN : 0u;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    (__CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000) && (__CUDA_ARCH_FAMILY_SPECIFIC__ < 1300)
    // Hardware RN cast (sm_100a/f and later families); only its magnitude is used, the sign and
    // NaN rules above are applied explicitly so the bits equal the software path.
    u16 pair;
    asm("{ .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %2, %1;\n mov.b16 %0, {t, 0};\n}" : "=h"(pair) : "f"(v), "f"(0.0f));
    const u32 mag = (u32)pair & (ELEM_SIGN - 1u);
#else
    const u32 mag = rne_sat_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(fabsf(v), ELEM_MAX, ELEM_MAX_CODE);
#endif
    return nan ? (u32)ELEM_NAN_CODE : (sign | mag);
}

NVFP4_HD float e2m1_value(u32 code) {
    const float mag = decode_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(code & (ELEM_SIGN - 1u));
    return (code & ELEM_SIGN) ? -mag : mag;
}

// ---- E2M1 stochastic rounding ------------------------------------------------------------------
constexpr int SR_BITS = 8;  // one random byte per element (NUMERICS.md §5.7)

// log2 step(v): step(v) is the E2M1 quantum at magnitude v, 2^(clamp(floor(log2 v), emin, emax) - MAN)
// (0.5 below 2, 1 in [2, 4), 2 from 4 up).
NVFP4_HD int e2m1_step_log2(float v) {
    return floor_log2_clamped(v, 1 - ELEM_BIAS, ELEM_EMAX) - ELEM_MAN_BITS;
}

// NUMERICS: §5.7 rounding rule (TE ptx.cuh stochastic_round_fp4_e2m1): a = |y|, u = r/256,
// t = RN(a + u*step(a)), q = fmin(floor(t/step(t))*step(t), 6); sign of y kept; NaN -> +6 code;
// |y| > 6 -> 6.
NVFP4_HD u32 e2m1_sr(float y, u32 r) {
    const bool nan = is_nan(y);
    const u32 sign = (f2u(y) & FP32_SIGN_BIT) ? ELEM_SIGN : 0u;
    // |y| > 6 and inf -> 6 (then t < 8 and q = 6, i.e. the max code); NaN lanes are replaced below.
    const float a = fmin_nn(fabsf(y), ELEM_MAX);
    // u * step(a) = r * 2^(log2 step(a) - 8), exact; float(r) by the 2^23 + r bit pattern (exact, r < 2^23).
    const float two23 = pow2f(FP32_MAN_BITS);
    const float r_f = add_rn(u2f(f2u(two23) | r), -two23);
    const float t = add_rn(a, mul_rn(r_f, pow2f(e2m1_step_log2(a) - SR_BITS)));  // one rounding
    // floor(t / step(t)) * step(t), exact: clear t's fp32 mantissa bits below step(t). In binades
    // >= emin that is the low 23 - MAN bits; below emin step is 2^(emin - MAN), so more bits go, and
    // t < step gives 0 (t < 8 here, so t's binade never exceeds emax).
    const int e = (int)(f2u(t) >> FP32_MAN_BITS) - FP32_EXP_BIAS;  // t >= 0; subnormal or 0 -> -127
    const int below = (1 - ELEM_BIAS) - e;
    const int drop = FP32_MAN_BITS - ELEM_MAN_BITS + (below > 0 ? below : 0);
    const float q = fmin_nn(drop > FP32_MAN_BITS ? 0.0f : u2f(f2u(t) & (~0u << drop)), ELEM_MAX);
    const u32 mag = rne_sat_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(q, ELEM_MAX, ELEM_MAX_CODE);  // q on the grid
    return nan ? (u32)ELEM_NAN_CODE : (sign | mag);
}

// ---- E4M3 saturating cast (block scale) ------------------------------------------------------
// NUMERICS: §0.5 sat_e4m3, §0.3 - __nv_cvt_float_to_fp8(d, __NV_SATFINITE, __NV_E4M3) (native
// cvt.rn.satfinite.e4m3x2 on sm_89+; cuda_fp8.h's exact software path on the host). d >= 0, not NaN.
NVFP4_HD u32 sat_e4m3(float d) { return (u32)__nv_cvt_float_to_fp8(d, __NV_SATFINITE, SCALE_FP8_INTERP); }

// float(s_blk): exact value of a UE4M3 scale byte (sign 0; 0x00 = 0).
NVFP4_HD float ue4m3_value(u32 code) { return decode_mag<SCALE_EXP_BITS, SCALE_MAN_BITS, SCALE_BIAS>(code); }

// ---- the two-level scale chain ---------------------------------------------------------------
struct GlobalScale {
    float s_enc;  // encode scale S_enc
    float s_dec;  // decode scale S_dec = RN(1/S_enc)
};

// NUMERICS: §5.1 - S_enc = fmin(RN(2688 / A_g), FLT_MAX); A_g = 0 or S_enc = 0 -> 1; S_dec = RN(1/S_enc).
NVFP4_HD GlobalScale global_scale(float amax_g) {
    float s = fmin_nn(div_rn(NVFP4_GLOBAL_MAX, amax_g), flt_max());  // 2688 = 6 * 448, exact
    if (amax_g == 0.0f || s == 0.0f) s = 1.0f;
    GlobalScale g;
    g.s_enc = s;
    g.s_dec = rcp_rn(s);
    return g;
}

struct BlockScale {
    u32 code;  // s_blk, UE4M3 bits
    float f;   // encode factor
};

// NUMERICS: §5.2 m = RN(S_enc * fl(1/6)); d = fmin(RN(A_b * m), FLT_MAX); s_blk = sat_e4m3(d).
// NUMERICS: §5.3 f = fmin(RN(1 / RN(float(s_blk) * S_dec)), FLT_MAX); s_blk = 0 -> f = FLT_MAX.
NVFP4_HD BlockScale block_scale(float amax_b, GlobalScale g) {
    const float m = mul_rn(g.s_enc, ELEM_RECIP_MAX);  // fl(1/6) = 0x3E2AAAAB
    const float d = fmin_nn(mul_rn(amax_b, m), flt_max());
    BlockScale b;
    b.code = sat_e4m3(d);
    b.f = b.code == 0 ? flt_max() : fmin_nn(rcp_rn(mul_rn(ue4m3_value(b.code), g.s_dec)), flt_max());
    return b;
}

// NUMERICS: §5.8 dequantization factor g = RN(RN(float(s_blk) * A_g) * fl(1/2688)).
NVFP4_HD float decode_factor(u32 scale_code, float amax_g) {
    return mul_rn(mul_rn(ue4m3_value(scale_code), amax_g), NVFP4_RECIP_GLOBAL_MAX);  // fl(1/2688) = 0x39C30C31
}

// ---- Philox4x32-10 (Random123) ---------------------------------------------------------------
// NUMERICS: §5.7 - round: (c0..c3) -> (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0));
// 10 rounds, key bumped by (W0, W1) after each of the first 9.
constexpr u32 PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
constexpr u32 PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;

NVFP4_HD u32 mulhi32(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return (u32)(((u64)a * (u64)b) >> 32);
#endif
}

struct U4 {
    u32 x, y, z, w;
};

NVFP4_HD U4 philox4x32_10(U4 c, u32 k0, u32 k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const u32 hi0 = mulhi32(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
        const u32 hi1 = mulhi32(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
        U4 n;
        n.x = hi1 ^ c.y ^ k0;
        n.y = lo1;
        n.z = hi0 ^ c.w ^ k1;
        n.w = lo0;
        c = n;
        if (round < 9) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
    }
    return c;
}

// Random word x0 of group g = floor(L/4) (NUMERICS.md §5.7): key (seed lo, seed hi), counter
// (g lo, g hi, stream, 0). Byte i of the word drives position L = 4g + i.
NVFP4_HD u32 sr_word(u64 group, u32 stream, u64 seed) {
    U4 c;
    c.x = (u32)group;
    c.y = (u32)(group >> 32);
    c.z = stream;
    c.w = 0u;
    return philox4x32_10(c, (u32)seed, (u32)(seed >> 32)).x;
}

// ---- 16-point random Hadamard transform --------------------------------------------------------
// NUMERICS: §5.6 - out_j = RN_bf16(RN(sum_{i=0..15} v_i * sigma_i * H[i,j] / 4)), H[i,j] =
// (-1)^popcount(i & j), sigma_i = -1 iff bit i of NVFP4_RHT_SIGN_MASK; every term is exact in
// fp64 and the sum runs in fp64 in the fixed order i = 0..15, starting from +0 (so a zero sum is +0,
// never -0).
static_assert(NVFP4_RHT_SIZE == BLOCK, "the RHT chunk is one NVFP4 block");

NVFP4_HD int parity4(int v) { return (v ^ (v >> 1) ^ (v >> 2) ^ (v >> 3)) & 1; }

NVFP4_HD bool rht_sign_negative(int i) { return ((NVFP4_RHT_SIGN_MASK >> i) & 1) != 0; }

// Bf16 significand bits and the fp32 growth bound of the fast path below.
constexpr int BF16_SIG_BITS = 8;
constexpr int FP32_SIG_BITS = FP32_MAN_BITS + 1;
// Largest exponent-field spread of a chunk's non-zero values for which every partial sum of the 16
// terms is exact in fp32: terms are multiples of q = 2^(e_min - bias - 7 - 2) and partial sums are
// below 16 * 2^(e_max - bias + 1) / 4 = 2^(e_max - bias + 3), i.e. below 2^24 q when
// e_max - e_min <= 24 - 8 - 4 = 12.
constexpr u32 RHT_FP32_EXACT_SPREAD = FP32_SIG_BITS - BF16_SIG_BITS - 4;
// Largest exponent field for which the partial sums stay finite (< 2^(e_max - bias + 3) <= 2^127).
constexpr u32 RHT_FP32_MAX_EXP_FIELD = 2 * FP32_EXP_BIAS - 3;

// The exact (order-free) fp32 path: true when every partial sum of the chunk is exact in fp32 and
// finite, so any summation order, the fp64 one included, gives the same exact value.
NVFP4_HD bool rht_fp32_exact(const float (&v)[BLOCK]) {
    u32 e_lo = FP32_EXP_MASK, e_hi = 0u, finite = 1u;
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        const u32 b = f2u(v[i]) & ~FP32_SIGN_BIT;
        u32 e = b >> FP32_MAN_BITS;
        finite &= (u32)(e != FP32_EXP_MASK);
        e = e < 1u ? 1u : e;  // subnormals: quantum 2^(1 - bias - 7), like exponent field 1
        e_lo = b != 0u && e < e_lo ? e : e_lo;
        e_hi = b != 0u && e > e_hi ? e : e_hi;
    }
    return finite && (e_lo > e_hi || (e_hi - e_lo <= RHT_FP32_EXACT_SPREAD && e_hi <= RHT_FP32_MAX_EXP_FIELD));
}

NVFP4_HD void rht16(const float (&v)[BLOCK], float (&out)[BLOCK]) {
    if (rht_fp32_exact(v)) {
        // Every partial sum is exact: the fast Walsh-Hadamard butterfly (y = H x, H symmetric) gives
        // the exact sums, equal to the ordered fp64 sums; + 0 turns a -0 result into +0 as the
        // ordered sum from +0 would.
        float x[BLOCK];
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) {
            const float w = mul_rn(v[i], (float)NVFP4_RHT_SCALE);  // exact
            x[i] = rht_sign_negative(i) ? -w : w;
        }
#pragma unroll
        for (int h = 1; h < BLOCK; h <<= 1) {
#pragma unroll
            for (int i = 0; i < BLOCK; ++i) {
                if (i & h) continue;
                const float a = x[i], b = x[i + h];
                x[i] = add_rn(a, b);
                x[i + h] = add_rn(a, -b);
            }
        }
#pragma unroll
        for (int j = 0; j < BLOCK; ++j) out[j] = round_bf16(add_rn(x[j], 0.0f));
        return;
    }
    double w[BLOCK];
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) w[i] = dmul_rn((double)v[i], NVFP4_RHT_SCALE);  // v_i / 4, exact in fp64
#pragma unroll
    for (int j = 0; j < BLOCK; ++j) {
        double s = 0.0;
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) {
            // The term v_i * sigma_i * H[i, j] / 4 is +-w_i exactly (signed zeros included).
            const bool neg = ((int)rht_sign_negative(i) ^ parity4(i & j)) != 0;
            s = dadd_rn(s, neg ? -w[i] : w[i]);
        }
        out[j] = round_bf16(d2f_rn(s));
    }
}

}  // namespace nvfp4
