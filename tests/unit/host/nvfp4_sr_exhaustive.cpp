// Exhaustive host check of the SR word encode of native/cuda/nvfp4.cuh (e2m1_sr_word) against the per-element
// software path (e2m1_sr_not_nan): (1) its floor code (min_lines_biased rounding down) equals floor_mag for every fp32
// pattern t in [+0, 8), the whole range of t = RN(a + u * step(a)); (2) the packed word equals the OR of the
// per-element codes for every fp32 pattern y in [+0, 6] (a = |y| clamped to 6 is all the codes see of y but its
// sign) and every 16th word of the other patterns (the negatives, |y| > 6, inf, NaN): patterns 8j .. 8j+7 fill
// one word, rotated by j so every lane sees every low-bit residue, with random bytes from a counter hash of j
// (NaN lanes masked: the kernels fix them). Prints the two mismatch counts. Built by
// test_nvfp4_encode_exhaustive.py.
#include <cstdio>

#include "nvfp4.cuh"

namespace {
// A 32-bit counter hash (the finaliser of MurmurHash3): the random words of group j.
inline nvfp4::u32 mix(nvfp4::u32 h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}
}  // namespace

int main() {
    using nvfp4::u32;
    unsigned long long floor_bad = 0, word_bad = 0;
    const u32 eight = nvfp4::f2u(8.0f);
    for (u32 b = 0; b < eight; ++b) {
        const float t = nvfp4::u2f(b);
        const u32 lines = nvfp4::min_lines_biased<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS, true>(t) - nvfp4::GRID_MAGIC_BITS;
        floor_bad += lines != nvfp4::floor_mag<ELEM_EXP_BITS, ELEM_MAN_BITS, ELEM_BIAS>(t);
    }
    const u32 six = nvfp4::f2u(6.0f);
    for (unsigned long long j = 0; j < (1ull << 29); ++j) {
        if (8 * j > six && j % 16 != 0) continue;
        const int rot = (int)(j & 7u);
        const u32 rnd[2] = {mix((u32)j * 2u), mix((u32)j * 2u + 1u)};
        float y[8];
        for (int i = 0; i < 8; ++i) y[(i + rot) & 7] = nvfp4::u2f((u32)(8 * j + i));
        u32 want = 0u, care = 0u;
        for (int lane = 0; lane < 8; ++lane) {
            if (nvfp4::is_nan(y[lane])) continue;
            const u32 r = (rnd[lane / 4] >> (8 * (lane % 4))) & 0xFFu;
            want |= nvfp4::e2m1_sr_not_nan(y[lane], r) << (4 * lane);
            care |= 0xFu << (4 * lane);
        }
        word_bad += (nvfp4::e2m1_sr_word(y, rnd) & care) != want;
    }
    std::printf("%llu %llu\n", floor_bad, word_bad);
    return 0;
}
