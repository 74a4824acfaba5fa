// NVFP4 scalar rules shared by the kernels in nvfp4.cu: the E2M1 and E4M3 casts, the two-level
// scale chain, the stochastic-rounding rule, Philox4x32-10 and the 16-point RHT.
//
// Source: docs/numerics.md §0.3 (kernel rules), §0.5 (casts), §5.1-§5.8 (NVFP4); TE
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
    !defined(ELEM_MAX) || !defined(ELEM_RECIP_MAX) || !defined(ELEM_NAN_CODE) ||                                 \
    !defined(ELEM_SIGN_MASK) || !defined(SCALE_EXP_BITS) || !defined(SCALE_MAN_BITS) || !defined(SCALE_BIAS) || \
    !defined(SCALE_FP8_INTERP) || !defined(BLOCK) || !defined(FP32_MAX) || !defined(NVFP4_GLOBAL_MAX) ||        \
    !defined(NVFP4_RECIP_GLOBAL_MAX)
#error "nvfp4.cuh needs the nvfp4 defines of native/_compile.defines_for(config)"
#endif
// NUMERICS: §5.6 the RHT size, sign mask and scale, from the formats.py row through defines_for.
#if !defined(NVFP4_RHT_SIZE) || !defined(NVFP4_RHT_SIGN_MASK) || !defined(NVFP4_RHT_SCALE)
#error "nvfp4.cuh needs NVFP4_RHT_SIZE, NVFP4_RHT_SIGN_MASK, NVFP4_RHT_SCALE (native/_compile.defines_for)"
#endif

#include <cuda_bf16.h>
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

NVFP4_HD float flt_max() { return FP32_MAX; }  // 0x7F7FFFFF, docs/numerics.md §0.1

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

NVFP4_HD double add_rn(double a, double b) {
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

// a * b + c with one rounding, in fp32 or fp64.
template <typename T>
NVFP4_HD T fma_rn(T a, T b, T c) {
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(T) == sizeof(float)) {
        return __fmaf_rn(a, b, c);
    } else {
        return __fma_rn(a, b, c);
    }
#else
    return std::fma(a, b, c);
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

// fmin/fmax ignore NaN (docs/numerics.md §0.1): fminf/fmaxf on the device. The host fmin_nn is the
// same rule written out (a NaN operand gives the other one), so the host replays inline it instead
// of calling libm's fminf (the exhaustive encode replay calls it 2^34 times); no caller passes two
// zeros of opposite signs, the one case where C leaves fminf's choice open.
NVFP4_HD float fmin_nn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return fminf(a, b);
#else
    return (a < b || b != b) ? a : b;
#endif
}
NVFP4_HD float fmax_nn(float a, float b) { return fmaxf(a, b); }

// max(a, b), NaN if either is NaN (PTX max.NaN; one instruction on sm_80+).
NVFP4_HD float fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
    float m;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
    return m;
#else
    return is_nan(a) || is_nan(b) ? a + b : fmax_nn(a, b);
#endif
}

// NUMERICS: §0.1 amax - fmax over |v| from +0; NaN ignored, +inf kept.
NVFP4_HD float block_amax(const float (&v)[BLOCK]) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) a = fmax_nn(a, fabsf(v[i]));
    return a;
}

// 2^k as fp32 for a normal exponent k (exact).
NVFP4_HD float pow2f(int k) { return u2f((u32)(k + FP32_EXP_BIAS) << FP32_MAN_BITS); }

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

// RN_bf16 of an fp32 value, returned widened to fp32 (docs/numerics.md §5.6). Device: cvt.rn.bf16.f32
// (RN, subnormals kept, overflow to inf; a NaN becomes the canonical NaN, whose payload is not
// observable in an RHT output: NaN encodes as the +6 code and every amax ignores it). Host: the
// same rounding on the bits (NaN returned as is).
NVFP4_HD float round_bf16(float f) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__float2bfloat16_rn(f));
#else
    u32 u = f2u(f);
    if (is_nan(f)) return f;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // round half to even on the low 16 bits
    return u2f(u);
#endif
}

// ---- rounding onto a small format's grid by one magic addition ------------------------------
// For a >= 0 on the grid of (EXP, MAN, BIAS) with e = max(floor(log2 a), emin), the grid step in a's
// binade is 2^(e-MAN) and a's magnitude code is ((e - emin) << MAN) + n, n = a / 2^(e-MAN) rounded
// (subnormals and the carry into the next binade included). n comes from one IEEE addition:
// M = 2^(e-MAN+23) has ulp 2^(e-MAN) and a + M < 2M, so the sum rounded (RN or RZ) is
// M + n * 2^(e-MAN) with n rounded the same way, and n is the difference of the bit patterns. M's
// exponent field is max(a's, emin's) + 23 - MAN. Branch-free, no float-to-int conversion.
struct GridMagic {
    u32 d;       // (e - emin) << 23: the offset of M's exponent field from its lowest value
    u32 m_bits;  // M = 2^(e - MAN + 23)
};

template <int MAN, int BIAS>
NVFP4_HD GridMagic grid_magic(float a) {
    static_assert(MAN + 2 < FP32_MAN_BITS, "n must fit below M's mantissa");
    constexpr u32 EXP_FIELD = FP32_EXP_MASK << FP32_MAN_BITS;
    constexpr u32 MIN_BITS = (u32)(1 - BIAS + FP32_EXP_BIAS) << FP32_MAN_BITS;  // 2^emin
    constexpr u32 TO_M = (u32)(FP32_MAN_BITS - MAN) << FP32_MAN_BITS;         // x 2^(23 - MAN)
    const int above = (int)(f2u(a) & EXP_FIELD) - (int)MIN_BITS;  // (floor(log2 a) - emin) << 23
    GridMagic g;
    g.d = (u32)(above > 0 ? above : 0);
    g.m_bits = g.d + (MIN_BITS + TO_M);
    return g;
}

// The code ((e - emin) << MAN) + n from the rounded sum a + M.
template <int MAN>
NVFP4_HD u32 grid_code(GridMagic g, float sum) { return (g.d >> (FP32_MAN_BITS - MAN)) + (f2u(sum) - g.m_bits); }

// RZ(a + b) for 0 <= a <= b: the device's add.rz; the host takes the RN sum and steps it down one
// ulp when it rounded up (s - b is exact for b <= s <= 2b).
NVFP4_HD float add_rz_magic(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rz(a, b);
#else
    const float s = a + b;
    return s - b > a ? u2f(f2u(s) - 1u) : s;
#endif
}

// NUMERICS: §0.5 e2m1_rn (RNE on the grid, then saturate; equal to clamp-then-round): the magnitude
// code of a >= 0, clamped first to the grid's finite max `maxv` (inf and a NaN a give maxv), so the
// code never passes maxv's. Ties to even n.
template <int EXP, int MAN, int BIAS>
NVFP4_HD u32 rne_sat_mag(float a, float maxv) {
    a = fmin_nn(a, maxv);
    const GridMagic g = grid_magic<MAN, BIAS>(a);
    return grid_code<MAN>(g, add_rn(a, u2f(g.m_bits)));
}

// The magnitude code of floor(t / step(t)) * step(t), t >= 0 below the grid's top binade's end
// 2^(emax + 1): t truncated onto the grid of its binade (0 below the smallest step).
template <int EXP, int MAN, int BIAS>
NVFP4_HD u32 floor_mag(float t) {
    const GridMagic g = grid_magic<MAN, BIAS>(t);
    return grid_code<MAN>(g, add_rz_magic(t, u2f(g.m_bits)));
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
// The E2M1 sign bit of v: fp32 bit 31 moved to the code's bit ELEM_BITS - 1 (-0.0 included).
NVFP4_HD u32 e2m1_sign(float v) { return (f2u(v) >> (32 - ELEM_BITS)) & ELEM_SIGN; }

// E2M1 RN magnitude code of |v| (a NaN v gives the +6 magnitude, 0x7).
NVFP4_HD u32 e2m1_rn_mag(float v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    (__CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000) && (__CUDA_ARCH_FAMILY_SPECIFIC__ < 1300)
    // Hardware RN cast (sm_100a/f and later families); only its magnitude is used, the sign and
    // NaN rules are applied by the callers so the bits equal the software path.
    u16 pair;
    asm("{ .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %2, %1;\n mov.b16 %0, {t, 0};\n}" : "=h"(pair) : "f"(fmin_nn(fabsf(v), ELEM_MAX)), "f"(0.0f));
    return (u32)pair & (ELEM_SIGN - 1u);
#else
    return rne_sat_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(fabsf(v), ELEM_MAX);
#endif
}

// NUMERICS: §0.5 e2m1_rn for a v known not to be NaN (the kernels check a block for NaN once and
// apply the NaN rule below only to blocks that hold one): ties to the even code; sign bit copied
// from v (-0.0 and tiny negatives give 0x8); |v| > 6 and inf saturate.
NVFP4_HD u32 e2m1_rn_not_nan(float v) { return e2m1_sign(v) | e2m1_rn_mag(v); }

// NUMERICS: §0.5 e2m1_rn - as e2m1_rn_not_nan, and NaN of either sign gives ELEM_NAN_CODE (+6).
NVFP4_HD u32 e2m1_rn(float v) { return is_nan(v) ? (u32)ELEM_NAN_CODE : e2m1_rn_not_nan(v); }

// ---- E2M1 RN encode of a word of codes: the cheaper exact sm_90 path --------------------------
// For a >= 0 on the grid of (EXP, MAN, BIAS) (emin = 1 - BIAS, emax = 2^EXP - 1 - BIAS), the magnitude
// code of a value in binade e (a in [2^e, 2^(e+1)), or below 2^emin for e = emin) is the line
// g_e(a) = a * 2^(MAN - e) + (e - emin) * 2^MAN, exact at the grid points and half-way between them at
// the midpoints. g_e - g_(e+1) = 2^(MAN-e-1) * (a - 2^(e+1)), so g = min over e of g_e is the right
// line in every binade, and the RN code of a (ties to the even code, clamped to maxv first) is
// RNE(g(a)). Each g_e(a) + 2^23 is ONE rounding (a fused multiply-add of an exact product and an
// exact constant) onto the integers (ulp 1 in [2^23, 2^24); g <= 2^(EXP+MAN) << 2^23), and RN is
// monotone, so min_e RN(g_e(a) + 2^23) = RN(g(a)) + 2^23: three FMA-pipe roundings and two min for
// E2M1, no exponent extraction. The code is the result's bits - bits(2^23).
constexpr u32 GRID_MAGIC_BITS = (u32)(FP32_MAN_BITS + FP32_EXP_BIAS) << FP32_MAN_BITS;  // 2^23

// RZ(p + c) for an exact product p = t * 2^k >= 0 and a constant c = 2^23 + n (n a small integer): one fused
// multiply-add rounded toward zero on the device; the host rounds the product (exact for every t this is called
// with but the tiny ones, whose sum with c is c either way) and takes add_rz_magic.
NVFP4_HD float fma_rz_onto_magic(float t, float pow2, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rz(t, pow2, c);
#else
    return add_rz_magic(mul_rn(t, pow2), c);
#endif
}

// One line g_e(a) + 2^23 = a * pow2 + c, rounded once onto the integers.
template <bool ROUND_DOWN>
NVFP4_HD float line_onto_magic(float a, float pow2, float c) {
    if constexpr (ROUND_DOWN)
        return fma_rz_onto_magic(a, pow2, c);  // NUMERICS: §5.7 floor(t / step(t)) * step(t): toward zero, a >= 0
    else
        return fma_rn(a, pow2, c);  // NUMERICS: §0.5 e2m1_rn - to nearest, ties to the even integer = even code
}

// The magnitude code of a >= 0 plus GRID_MAGIC_BITS: min over the lines, each rounded once. ROUND_DOWN false: RN,
// a in [0, maxv] (the bits of RN(g(a)) + 2^23). True: floor_mag's code, a below 2^(emax + 1) (floor is monotone
// too, so floor(g(a)) = min_e floor(g_e(a)); in the top binade g(a) < 2^(MAN+1) + (emax - emin) * 2^MAN, so the
// floor stays on the grid: a in [4, 8) gives the codes of 4 and 6). Every rounded line is a positive finite fp32
// (a is finite and >= 0), whose bit patterns order as the values do, so the minimum is taken on the bits: E2M1's
// three lines are one 3-input integer minimum on sm_90 (VIMNMX3) instead of two FMNMX. EXTRA (a small EVEN integer:
// an odd one would turn ties to the even code into ties to the odd one; NUMERICS: §0.5 e2m1_rn ties to the even
// code, and floor is unaffected) is added to every line's constant: the result
// is the bits of 2^23 + EXTRA + code, each line still one rounding onto the integers of [2^23, 2^24).
template <int EXP, int MAN, int BIAS, bool ROUND_DOWN, int EXTRA = 0>
NVFP4_HD u32 min_lines_biased(float a) {
    constexpr int EMIN = 1 - BIAS, EMAX = (1 << EXP) - 1 - BIAS;
    static_assert(EXTRA >= 0 && EXTRA < 256 && EXTRA % 2 == 0, "a small even integer above 2^23");
    const float magic = add_rn(u2f(GRID_MAGIC_BITS), (float)EXTRA);  // exact
    u32 m = f2u(line_onto_magic<ROUND_DOWN>(a, pow2f(MAN - EMIN), magic));  // e = emin: also the subnormal line
#pragma unroll
    for (int e = EMIN + 1; e <= EMAX; ++e) {
        const u32 line = f2u(line_onto_magic<ROUND_DOWN>(a, pow2f(MAN - e), add_rn(magic, (float)((e - EMIN) << MAN))));
        m = line < m ? line : m;
    }
    return m;
}

// NUMERICS: §0.5 e2m1_rn, as rne_sat_mag: the E2M1 magnitude code of a >= 0 clamped to maxv first.
NVFP4_HD u32 e2m1_rn_mag_lines(float v) {
    return min_lines_biased<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS, false>(fmin_nn(fabsf(v), ELEM_MAX)) - GRID_MAGIC_BITS;
}

// (hi:lo) << 4, high word: the funnel shift (SHF.L.U32.HI) that moves lo's top nibble under hi.
NVFP4_HD u32 funnel4(u32 lo, u32 hi) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_l(lo, hi, 4);
#else
    return (hi << 4) | (lo >> 28);
#endif
}

constexpr int WORD_CODES = 32 / ELEM_BITS;  // 8 codes per 32-bit word
constexpr u32 NIBBLE_SIGNS = 0x88888888u;   // bit 3 of every nibble: the sign bits of a word of codes
static_assert(ELEM_BITS == 4 && ELEM_SIGN == 8u, "the word encode packs 4-bit codes with the sign in bit 3");

// A word's sign bits: bit 4i + 3 is the sign bit of s[i] (its fp32 bit 31), i < 8: bit 31 funnel-shifted in,
// element 7 first (one SHF per element). Bits outside NIBBLE_SIGNS are arbitrary (the packers mask them).
NVFP4_HD u32 nibble_signs(const float* s) {
    u32 signs = 0u;
#pragma unroll
    for (int i = WORD_CODES - 1; i >= 0; --i) signs = funnel4(f2u(s[i]), signs);
    return signs;
}

// PTX prmt.b32 (default mode) on the host and the device: byte n of the result is byte (sel >> 4n) & 7 of the
// 8 bytes (b:a), a in bytes 0-3; with bit 3 of that selector nibble set, that byte's top bit replicated over all
// 8 bits (0x00 or 0xFF).
NVFP4_HD u32 byte_perm_sx(u32 a, u32 b, u32 sel) {
#if defined(__CUDA_ARCH__)
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
#else
    const unsigned long long src = ((unsigned long long)b << 32) | a;
    u32 r = 0u;
    for (int n = 0; n < 4; ++n) {
        const u32 nib = (sel >> (4 * n)) & 0xFu;
        u32 byte = (u32)(src >> (8 * (nib & 7u))) & 0xFFu;
        if (nib & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
        r |= byte << (8 * n);
    }
    return r;
#endif
}

// Sign masks of four words x[0..3] of two 16-bit elements each (bf16 or f16: a half's top bit is its sign):
// byte j of low (high) is 0xFF iff the low (high) half of x[j] is negative, else 0x00. Four byte permutes: the
// halves' top bytes (bytes 1 and 3) of x[0], x[1] and of x[2], x[3] gathered, then replicated in order.
NVFP4_HD void sign_masks_16(u32 x0, u32 x1, u32 x2, u32 x3, u32& low, u32& high) {
    constexpr u32 TOP_BYTES = 0x7351u;  // (a.1, b.1, a.3, b.3) of (b:a)
    const u32 p01 = byte_perm_sx(x0, x1, TOP_BYTES), p23 = byte_perm_sx(x2, x3, TOP_BYTES);
    low = byte_perm_sx(p01, p23, 0xDC98u);   // bytes 0, 1, 4, 5 of (p23:p01), sign-replicated
    high = byte_perm_sx(p01, p23, 0xFEBAu);  // bytes 2, 3, 6, 7
}

// A word's sign bits (as nibble_signs) from sign masks (sign_masks_16): byte j of a codes word holds elements
// 2j (bit 3, from byte j of even) and 2j + 1 (bit 7, from byte j of odd). One LOP3.
NVFP4_HD u32 nibble_signs_of_masks(u32 even, u32 odd) {
    constexpr u32 LOW_NIBBLES = 0x0F0F0F0Fu;
    return (even & LOW_NIBBLES) | (odd & ~LOW_NIBBLES);
}

// The word encode of e2m1_rn_word / e2m1_rn_word_bounded (both below): magnitude i from a[i] (BOUNDED: a[i]
// is |y_i| < ELEM_LINES_BOUND already; else a[i] = y_i, clamped here to |y_i| <= maxv as e2m1_rn_mag_lines), sign
// i bit 4i + 3 of signs (nibble_signs). Magnitudes: the biased codes summed as (bits << 4i) mod 2^32 (the shifted
// codes do not overlap, so the sum is their OR), the bias sum(bits(2^23) << 4i) cancelled inside the sum: its
// negative mod 2^32 is LINES_UNBIAS << 4 LINES_UNBIAS_CODE, which the lines of code LINES_UNBIAS_CODE add to their
// constants (min_lines_biased's EXTRA, even: no add of its own).
NVFP4_HD constexpr u32 lines_word_bias() {
    u32 bias = 0u;
    for (int i = 0; i < WORD_CODES; ++i) bias += GRID_MAGIC_BITS << (ELEM_BITS * i);
    return bias;  // 0xFB000000
}
constexpr int LINES_UNBIAS_CODE = 5;
constexpr int LINES_UNBIAS = (int)((0u - lines_word_bias()) >> (ELEM_BITS * LINES_UNBIAS_CODE));  // 0x50
static_assert((u32)LINES_UNBIAS << (ELEM_BITS * LINES_UNBIAS_CODE) == 0u - lines_word_bias(),
              "the word bias cancels in one code's lines");

// Code i of a word (i < 8) of magnitude a, biased for the word sums (sum over i of lines_code_in_word(a_i, i) << 4i
// is the packed codes mod 2^32): min_lines_biased, code LINES_UNBIAS_CODE with the extra that cancels the bias.
template <bool ROUND_DOWN>
NVFP4_HD u32 lines_code_in_word(float a, int i) {
    return i == LINES_UNBIAS_CODE ? min_lines_biased<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS, ROUND_DOWN, LINES_UNBIAS>(a)
                                  : min_lines_biased<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS, ROUND_DOWN>(a);
}

template <bool BOUNDED>
NVFP4_HD u32 e2m1_lines_word(const float* a, u32 signs) {
    u32 mags = 0u;
#pragma unroll
    for (int i = WORD_CODES - 1; i >= 0; --i) {
        const float mag = BOUNDED ? a[i] : fmin_nn(fabsf(a[i]), ELEM_MAX);
        mags += lines_code_in_word<false>(mag, i) << (ELEM_BITS * i);
    }
    return mags | (signs & NIBBLE_SIGNS);
}

// True on the sm_100a families, whose hardware E2M1 cast the word encodes use (e2m1_rn_not_nan per element).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    (__CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000) && (__CUDA_ARCH_FAMILY_SPECIFIC__ < 1300)
#define NVFP4_HW_E2M1 1
#else
#define NVFP4_HW_E2M1 0
#endif

// NUMERICS: §0.5 e2m1_rn_not_nan of y[0..7], packed as §5.4 (element i in nibble i, even element in
// the low nibble of its byte): equal to OR_i e2m1_rn_not_nan(y[i]) << 4i. sm_100a families: the hardware cast
// per element (e2m1_rn_not_nan); else the three lines of min_lines_biased per element (e2m1_lines_word).
NVFP4_HD u32 e2m1_rn_word(const float* y) {
#if NVFP4_HW_E2M1
    u32 word = 0u;
#pragma unroll
    for (int i = 0; i < WORD_CODES; ++i) word |= e2m1_rn_not_nan(y[i]) << (ELEM_BITS * i);
    return word;
#else
    return e2m1_lines_word<false>(y, nibble_signs(y));
#endif
}

// Magnitudes below which the lines need no clamp: the top binade's line reaches the max code + 1/2 (a tie, rounded
// to the code above) at maxv + step(maxv) / 2 (E2M1: 6 + 1 = 7, where a / 2 + 4 = 7.5), and every a in (5, 7)
// already gives the max code (docs/numerics.md §0.5 table: a > 5 -> 7), so there clamping first changes nothing.
constexpr float ELEM_LINES_BOUND =
    ELEM_MAX + 0.5f * (float)(1 << ((1 << ELEM_EXP_BITS) - 1 - ELEM_BIAS - ELEM_MAN_BITS));

// NUMERICS: §0.5 e2m1_rn_not_nan of the values y_i with |y_i| = a[i] < ELEM_LINES_BOUND and the sign bit 4i + 3 of
// signs (nibble_signs of the inputs x_i: y_i = RN(x_i f) with f > 0 has |y_i| = RN(|x_i| f) and the sign of x_i),
// packed as e2m1_rn_word: the same codes without the clamp (one instruction less per element).
NVFP4_HD u32 e2m1_rn_word_bounded(const float* a, u32 signs) {
#if NVFP4_HW_E2M1
    u32 word = 0u;
#pragma unroll
    for (int i = 0; i < WORD_CODES; ++i) word |= e2m1_rn_not_nan(a[i]) << (ELEM_BITS * i);  // a[i] >= 0: magnitude codes
    return word | (signs & NIBBLE_SIGNS);
#else
    return e2m1_lines_word<true>(a, signs);
#endif
}

NVFP4_HD float e2m1_value(u32 code) {
    const float mag = decode_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(code & (ELEM_SIGN - 1u));
    return (code & ELEM_SIGN) ? -mag : mag;
}

// ---- E2M1 stochastic rounding ------------------------------------------------------------------
constexpr int SR_BITS = 8;  // one random byte per element (docs/numerics.md §5.7)

// NUMERICS: §5.7 rounding rule (TE ptx.cuh stochastic_round_fp4_e2m1): a = |y|, u = r/256,
// t = RN(a + u*step(a)), q = fmin(floor(t/step(t))*step(t), 6); sign of y kept; |y| > 6 -> 6.
// step(v) is the E2M1 quantum at magnitude v: 2^(clamp(floor(log2 v), emin, emax) - MAN) (0.5 below
// 2, 1 in [2, 4), 2 from 4 up). For a y known not to be NaN (see e2m1_rn_not_nan).
NVFP4_HD u32 e2m1_sr_not_nan(float y, u32 r) {
    // |y| > 6 and inf -> 6 (then t < 8 and q = 6, i.e. the max code). a <= 6 = max, so a's binade
    // is at most emax: step(a) = 2^(e - MAN) with grid_magic's e.
    const float a = fmin_nn(fabsf(y), ELEM_MAX);
    const GridMagic g = grid_magic<ELEM_MAN_BITS, ELEM_BIAS>(a);
    // step(a) / 256 = 2^(e - MAN - 8) from g.d = (e - emin) << 23 (exact, a normal power of two).
    const float step_r = u2f(g.d + ((u32)(1 - ELEM_BIAS - ELEM_MAN_BITS - SR_BITS + FP32_EXP_BIAS) << FP32_MAN_BITS));
    // float(r) by the 2^23 + r bit pattern (exact, r < 2^23).
    const float two23 = pow2f(FP32_MAN_BITS);
    const float r_f = add_rn(u2f(f2u(two23) | r), -two23);
    // t = RN(a + u * step(a)): r_f * step_r is exact, so the fused multiply-add rounds once, there.
    const float t = fma_rn(r_f, step_r, a);
    // t < 6 + 2 * 255/256 < 8 = 2^(emax + 1): floor onto t's grid is at most 6, fmin(q, 6) = q.
    return e2m1_sign(y) | floor_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(t);
}

// NUMERICS: §5.7 - as e2m1_sr_not_nan, and NaN of either sign gives ELEM_NAN_CODE (+6).
NVFP4_HD u32 e2m1_sr(float y, u32 r) { return is_nan(y) ? (u32)ELEM_NAN_CODE : e2m1_sr_not_nan(y, r); }

// ---- E2M1 SR encode of a word of codes: the cheaper exact path ---------------------------------
// The bits of 2^23 + byte i of rnd (exact: float(byte) = that value - 2^23): one byte permute on the device.
NVFP4_HD u32 sr_byte_magic(u32 rnd, int i) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(rnd, GRID_MAGIC_BITS, 0x7440u | (u32)i);  // bytes (0x4B, 0, 0, rnd byte i)
#else
    return GRID_MAGIC_BITS | ((rnd >> (SR_BITS * i)) & ((1u << SR_BITS) - 1u));
#endif
}
static_assert(SR_BITS == 8 && (GRID_MAGIC_BITS & 0x00FFFFFFu) == 0u, "sr_byte_magic places one byte under 2^23's bits");

// NUMERICS: §5.7 e2m1_sr_not_nan of y[0..7] with the random byte of element i = byte i % 4 of rnd[i / 4], packed
// as §5.4 (equal to OR_i e2m1_sr_not_nan(y[i], r_i) << 4i): t = RN(a + u * step(a)) as e2m1_sr_not_nan, its floor
// code by min_lines_biased (rounding down), magnitudes summed (lines_code_in_word) and signs (nibble_signs) as in
// e2m1_rn_word.
NVFP4_HD u32 e2m1_sr_word(const float* y, const u32* rnd) {
    const float two23 = pow2f(FP32_MAN_BITS);
    u32 mags = 0u;
#pragma unroll
    for (int i = WORD_CODES - 1; i >= 0; --i) {
        const float a = fmin_nn(fabsf(y[i]), ELEM_MAX);  // |y| > 6 and inf -> 6, as e2m1_sr_not_nan
        const GridMagic g = grid_magic<ELEM_MAN_BITS, ELEM_BIAS>(a);
        const float step_r = u2f(g.d + ((u32)(1 - ELEM_BIAS - ELEM_MAN_BITS - SR_BITS + FP32_EXP_BIAS) << FP32_MAN_BITS));
        const float r_f = add_rn(u2f(sr_byte_magic(rnd[i / 4], i % 4)), -two23);
        const float t = fma_rn(r_f, step_r, a);  // NUMERICS: §5.7 t = RN(a + u * step(a)), one rounding
        mags += lines_code_in_word<true>(t, i) << (ELEM_BITS * i);
    }
    return mags | (nibble_signs(y) & NIBBLE_SIGNS);
}

// ---- E4M3 saturating cast (block scale) ------------------------------------------------------
// NUMERICS: §0.5 sat_e4m3, §0.3 - __nv_cvt_float_to_fp8(d, __NV_SATFINITE, __NV_E4M3) (native
// cvt.rn.satfinite.e4m3x2 on sm_89+; cuda_fp8.h's exact software path on the host). d >= 0, not NaN.
NVFP4_HD u32 sat_e4m3(float d) { return (u32)__nv_cvt_float_to_fp8(d, __NV_SATFINITE, SCALE_FP8_INTERP); }

// float(s_blk): exact value of a UE4M3 scale byte (sign 0; 0x00 = 0).
NVFP4_HD float ue4m3_value(u32 code) {
#if defined(__CUDA_ARCH__)
    // cvt.rn.f16x2.e4m3x2 (sm_89+), then f16 -> fp32: both exact, every E4M3 value is an f16 normal.
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, SCALE_FP8_INTERP)));
#else
    return decode_mag<SCALE_EXP_BITS, SCALE_MAN_BITS, SCALE_BIAS>(code);
#endif
}

// ---- the two-level scale chain ---------------------------------------------------------------
struct GlobalScale {
    float s_enc;  // encode scale S_enc
    float s_dec;  // decode scale S_dec = RN(1/S_enc)
    float m;      // the block-scale multiplier RN(S_enc * fl(1/6)) (§5.2), once per copy
};

// NUMERICS: §5.1 - S_enc = fmin(RN(2688 / A_g), FLT_MAX); A_g = 0 or S_enc = 0 -> 1; S_dec = RN(1/S_enc).
NVFP4_HD GlobalScale global_scale(float amax_g) {
    float s = fmin_nn(div_rn(NVFP4_GLOBAL_MAX, amax_g), flt_max());  // 2688 = 6 * 448, exact
    if (amax_g == 0.0f || s == 0.0f) s = 1.0f;
    GlobalScale g;
    g.s_enc = s;
    g.s_dec = rcp_rn(s);
    g.m = mul_rn(s, ELEM_RECIP_MAX);  // NUMERICS: §5.2 m = RN(S_enc * fl(1/6)), fl(1/6) = 0x3E2AAAAB
    return g;
}

struct BlockScale {
    u32 code;  // s_blk, UE4M3 bits
    float f;   // encode factor
};

// NUMERICS: §5.2 m = RN(S_enc * fl(1/6)); d = fmin(RN(A_b * m), FLT_MAX); s_blk = sat_e4m3(d). The fmin is implied:
// RN(A_b * m) is >= 0 and not NaN (A_b >= 0 NaN-ignored, m finite > 0), and sat_e4m3(+inf) = sat_e4m3(FLT_MAX) = 0x7E
// (§0.5 table), so sat_e4m3 of the product is the same code.
NVFP4_HD u32 block_scale_code(float amax_b, GlobalScale g) { return sat_e4m3(mul_rn(amax_b, g.m)); }

// NUMERICS: §5.3 f = fmin(RN(1 / RN(float(s_blk) * S_dec)), FLT_MAX); s_blk = 0 -> f = FLT_MAX.
NVFP4_HD float encode_factor(u32 code, GlobalScale g) {
    return code == 0 ? flt_max() : fmin_nn(rcp_rn(mul_rn(ue4m3_value(code), g.s_dec)), flt_max());
}

// Scale codes sat_e4m3 can return for a d that is not NaN (0 .. 0x7E: UE4M3 has no sign, and
// satfinite never gives the NaN pattern 0x7F): the size of a per-copy table of encode_factor.
constexpr u32 SCALE_CODES = 1u << (SCALE_EXP_BITS + SCALE_MAN_BITS);

// NUMERICS: §5.2-§5.3 the block scale code and its encode factor.
NVFP4_HD BlockScale block_scale(float amax_b, GlobalScale g) {
    BlockScale b;
    b.code = block_scale_code(amax_b, g);
    b.f = encode_factor(b.code, g);
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

// The random words (x0, x1, x2, x3) of group g = floor(L/16) (docs/numerics.md §5.7): key (seed lo, seed hi),
// counter (g lo, g hi, stream, 0). Element L = 16g + 4w + i takes byte i of word w (x0 = .x, x1 = .y, x2 = .z,
// x3 = .w): one call serves 16 consecutive elements, TE's get_rbits order (common/cast/nvfp4/core_nvfp4.cuh).
NVFP4_HD U4 sr_draw(u64 group, u32 stream, u64 seed) {
    U4 c;
    c.x = (u32)group;
    c.y = (u32)(group >> 32);
    c.z = stream;
    c.w = 0u;
    return philox4x32_10(c, (u32)seed, (u32)(seed >> 32));
}

// ---- 16-point random Hadamard transform --------------------------------------------------------
// NUMERICS: §5.6 - out_j = RN_bf16(RN(sum_{i=0..15} v_i * sigma_i * H[i,j] / 4)), H[i,j] =
// (-1)^popcount(i & j), sigma_i = -1 iff bit i of NVFP4_RHT_SIGN_MASK; every term is exact in
// fp64 and the sum runs in fp64 in the fixed order i = 0..15, starting from +0 (so a zero sum is +0,
// never -0).
static_assert(NVFP4_RHT_SIZE == BLOCK, "the RHT chunk is one NVFP4 block");

NVFP4_HD int parity4(int v) { return (v ^ (v >> 1) ^ (v >> 2) ^ (v >> 3)) & 1; }

NVFP4_HD bool rht_sign_negative(int i) { return ((NVFP4_RHT_SIGN_MASK >> i) & 1) != 0; }

// Bf16 significand bits and the growth bounds of the exact paths below.
constexpr int BF16_SIG_BITS = 8;
constexpr int FP32_SIG_BITS = FP32_MAN_BITS + 1;
constexpr int FP64_SIG_BITS = 53;
// Largest exponent-field spread of a chunk's non-zero values for which every partial sum of the 16
// terms is exact in a format of P significand bits: terms are multiples of
// q = 2^(e_min - bias - 7 - 2) and partial sums are below 16 * 2^(e_max - bias + 1) / 4 =
// 2^(e_max - bias + 3), i.e. below 2^P q when e_max - e_min <= P - 8 - 4: 12 in fp32, 41 in fp64.
constexpr u32 RHT_FP32_EXACT_SPREAD = FP32_SIG_BITS - BF16_SIG_BITS - 4;
constexpr u32 RHT_FP64_EXACT_SPREAD = FP64_SIG_BITS - BF16_SIG_BITS - 4;
// Largest exponent field for which the fp32 partial sums stay finite, scaled by 1/4 or not (rht16_amax sums
// the unscaled terms): below 16 * 2^(e_max - bias + 1) = 2^(e_max - bias + 5) <= 2^128, and an exact sum below
// 2^128 is finite.
constexpr u32 RHT_FP32_MAX_EXP_FIELD = 2 * FP32_EXP_BIAS - 4;
constexpr u32 FP32_INF_BITS = FP32_EXP_MASK << FP32_MAN_BITS;

// How a chunk's 16 sums are taken. Where every partial sum is exact, the order cannot change a sum,
// so a butterfly (fast Walsh-Hadamard: y = H x, H symmetric) gives the contract's ordered fp64 sums.
enum RhtPath {
    RHT_FP32_BUTTERFLY,  // finite, spread <= 12, no fp32 overflow: exact in fp32
    RHT_FP64_BUTTERFLY,  // spread <= 41: exact in fp64; or an inf / NaN term: then every sum is
                         // +-inf or NaN by the signs of its infinite terms alone, in any order (the
                         // finite part, < 16 * FLT_MAX / 4, never overflows fp64)
    RHT_FP64_ORDERED,    // anything else: the fp64 sums in the contract's order
};

// The path of a chunk from hi = max |v| (NaN when a v is NaN) and e_lo, the exponent field of its smallest non-zero
// |v| (unused when every v is zero).
NVFP4_HD RhtPath rht_path_of(float hi, u32 e_lo) {
    const u32 hi_bits = f2u(hi);
    if (!(hi_bits < FP32_INF_BITS)) return RHT_FP64_BUTTERFLY;  // an inf or NaN term (a NaN hi compares false)
    if (hi_bits == 0u) return RHT_FP32_BUTTERFLY;              // all zero
    const u32 e_hi = hi_bits >> FP32_MAN_BITS;
    e_lo = e_lo < 1u ? 1u : e_lo;  // subnormals: quantum 2^(1 - bias - 7), like exponent field 1
    if (e_hi - e_lo <= RHT_FP32_EXACT_SPREAD && e_hi <= RHT_FP32_MAX_EXP_FIELD) return RHT_FP32_BUTTERFLY;
    return e_hi - e_lo <= RHT_FP64_EXACT_SPREAD ? RHT_FP64_BUTTERFLY : RHT_FP64_ORDERED;
}

NVFP4_HD RhtPath rht_path(const float (&v)[BLOCK]) {
    float hi = 0.0f;  // max |v|, NaN when a v is NaN
    u32 lo = ~0u;     // min over v of bits(|v|) - 1: the smallest non-zero magnitude's bits - 1 (zeros wrap)
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        hi = fmax_nan(hi, fabsf(v[i]));
        const u32 b = (f2u(v[i]) & ~FP32_SIGN_BIT) - 1u;
        lo = b < lo ? b : lo;
    }
    return rht_path_of(hi, (lo + 1u) >> FP32_MAN_BITS);
}

// rht_path_of's e_lo for both columns of a bf16 colwise item (words[i]: row i, column 0 in the low half, column 1 in
// the high half): e_lo[h] for column h. Per half, (bits(|v|) | 0x8000) - 1 is 0x8000 + bits(|v|) - 1 for a non-zero
// |v| and 0x7FFF for a zero (the 0x8000 keeps the subtraction inside the half), which as signed 16-bit numbers
// orders the non-zero magnitudes as they are and every zero above them: a packed signed minimum over the words (two
// halves and three operands an instruction on sm_90: VIMNMX3.S16x2) gives each column's smallest non-zero bits - 1
// + 0x8000. A bf16's exponent field is its bits >> 7, the field of its fp32 widening.
NVFP4_HD void bf16_pair_low_exponents(const u32 (&words)[BLOCK], u32 (&e_lo)[2]) {
    u32 m = 0x7FFF7FFFu;  // two zero halves
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        const u32 y = ((words[i] & 0x7FFF7FFFu) | 0x80008000u) - 0x00010001u;
#if defined(__CUDA_ARCH__)
        m = __vmins2(m, y);
#else
        u32 r = 0u;
        for (int h = 0; h < 2; ++h) {
            const int a = (short)(m >> (16 * h)), b = (short)(y >> (16 * h));
            r |= (u32)(u16)(a < b ? a : b) << (16 * h);
        }
        m = r;
#endif
    }
    e_lo[0] = (((m & 0xFFFFu) ^ 0x8000u) + 1u) >> (BF16_SIG_BITS - 1);
    e_lo[1] = (((m >> 16) ^ 0x8000u) + 1u) >> (BF16_SIG_BITS - 1);
}

// Stages h = FIRST, 2 FIRST, ... < END of the fast Walsh-Hadamard butterfly on x in place (x[i], x[i + h] <- a + b,
// a - b for every i without bit h), each sum rounded in T.
template <int FIRST, int END, typename T>
NVFP4_HD void butterfly_stages(T (&x)[BLOCK]) {
#pragma unroll
    for (int h = FIRST; h < END; h <<= 1) {
#pragma unroll
        for (int i = 0; i < BLOCK; ++i) {
            if (i & h) continue;
            const T a = x[i], b = x[i + h];
            x[i] = add_rn(a, b);
            x[i + h] = add_rn(a, -b);
        }
    }
}

// The butterfly in T (float or double) over x[i] = v_i * sigma_i / 4. The terms are made with
// fma(v, +-1/4, +0): exact, and a -0 term becomes +0; with no -0 term no partial sum is -0 (RN:
// x + (-x) = +0, and a - b is -0 only for a = -0), as the ordered sum from +0 never is.
template <typename T>
NVFP4_HD void rht_butterfly(const float (&v)[BLOCK], T (&x)[BLOCK]) {
#pragma unroll
    for (int i = 0; i < BLOCK; ++i) {
        const T c = rht_sign_negative(i) ? -(T)NVFP4_RHT_SCALE : (T)NVFP4_RHT_SCALE;
        x[i] = fma_rn((T)v[i], c, (T)0);
    }
    butterfly_stages<1, BLOCK>(x);
}

// rht16's fp64 paths (path RHT_FP64_BUTTERFLY or RHT_FP64_ORDERED: a spread above 12, an inf or NaN, huge values).
NVFP4_HD void rht16_fp64(const float (&v)[BLOCK], float (&out)[BLOCK], RhtPath path) {
    if (path == RHT_FP64_BUTTERFLY) {
        double x[BLOCK];
        rht_butterfly(v, x);
#pragma unroll
        for (int j = 0; j < BLOCK; ++j) out[j] = round_bf16(d2f_rn(x[j]));
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
            s = add_rn(s, neg ? -w[i] : w[i]);
        }
        out[j] = round_bf16(d2f_rn(s));
    }
}

// rht16 given path = rht_path(v) (the quantize kernel's comes from the packed words: rht_path_of).
NVFP4_HD void rht16(const float (&v)[BLOCK], float (&out)[BLOCK], RhtPath path) {
    if (path == RHT_FP32_BUTTERFLY) {
        float x[BLOCK];
        rht_butterfly(v, x);
#pragma unroll
        for (int j = 0; j < BLOCK; ++j) out[j] = round_bf16(x[j]);  // the exact sum: RN_fp32 is the identity
        return;
    }
    rht16_fp64(v, out, path);  // slow path
}

NVFP4_HD void rht16(const float (&v)[BLOCK], float (&out)[BLOCK]) { rht16(v, out, rht_path(v)); }

// block_amax(rht16(v)) (NUMERICS: §5.6, §0.1 - the amax of the chunk's bf16 RHT outputs) for the post-RHT amax
// pass, given path = rht_path(v). On the fp32 path the butterfly runs on the unscaled signed terms sigma_i v_i (the
// signs fold into the first stage's adds, the last stage into the maximum; RHT_FP32_MAX_EXP_FIELD keeps these sums
// finite): every sum is exact, so
// out_j = RN_bf16(s_j / 4) with s_j the exact unscaled sum, and RN_bf16 is monotone and odd, so
// max_j |out_j| = RN_bf16(max_j |s_j| / 4), the quarter exact (a power of two on an exact sum: its terms are
// multiples of 2^-133, far above fp32's quantum 2^-149). A zero sum's sign cannot matter under |.|. The other paths
// (a spread above 12, inf or NaN, huge values) take rht16 itself.
NVFP4_HD float rht16_amax(const float (&v)[BLOCK], RhtPath path) {
    if (path != RHT_FP32_BUTTERFLY) {
        float h[BLOCK];
        rht16(v, h, path);  // slow path
        return block_amax(h);
    }
    float x[BLOCK];
#pragma unroll
    for (int i = 0; i < BLOCK; i += 2) {
        const float a = rht_sign_negative(i) ? -v[i] : v[i], b = rht_sign_negative(i + 1) ? -v[i + 1] : v[i + 1];
        x[i] = add_rn(a, b);
        x[i + 1] = add_rn(a, -b);
    }
    butterfly_stages<2, BLOCK / 2>(x);
    // The last stage's pair a + b, a - b: the larger magnitude is |a| + |b| (exact, as every sum here).
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < BLOCK / 2; ++i) m = fmax_nn(m, add_rn(fabsf(x[i]), fabsf(x[i + BLOCK / 2])));
    return round_bf16(mul_rn(m, NVFP4_RHT_SCALE));
}

}  // namespace nvfp4
