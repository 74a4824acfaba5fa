// Host check of the quantize kernel's sign words from 16-bit words as loaded (native/cuda/nvfp4.cu row_signs_16,
// column_signs_16; nvfp4.cuh sign_masks_16, byte_perm_sx) against block_signs of the widened values (the funnel
// shifts of nibble_signs). Every pattern of the 16 sign bits that a codes word of a colwise item's two columns
// depends on (rows 8q .. 8q + 7, both halves), with the other 15 bits of each half drawn at random; the rowwise
// block's 8 words get the same 16 sign bits. bf16 and f16 words. Writes to argv[1]: mismatching sign bits of the
// rowwise blocks, then of the colwise items, then the words compared (3 x u64). Built by
// test_nvfp4_host_replay.py.
#include <cstdio>
#include <random>

#include "nvfp4.cu"

namespace {
using nvfp4::u32;

// Element e (0: low half, 1: high half) of a word of two 16-bit values, widened to fp32.
template <int DT>
float half_value(u32 w, int e) {
    const nvfp4::u16 h = (nvfp4::u16)(e == 0 ? w : w >> 16);
    return DT == nvfp4::IN_BF16 ? nvfp4::bf16_to_f32(h) : nvfp4::f16_to_f32(h);
}

template <int DT>
void check(std::mt19937& rng, unsigned long long& row_bad, unsigned long long& col_bad, unsigned long long& words) {
    for (u32 signs = 0; signs < (1u << 16); ++signs) {
        u32 w[BLOCK];
        for (int i = 0; i < BLOCK; ++i) {
            const int q = i / 8;  // both codes words of the item see the same sign pattern, rows shifted
            const u32 s = (signs >> (2 * (i % 8) + q)) & 1u, s_hi = (signs >> ((2 * (i % 8) + 1 + q) % 16)) & 1u;
            w[i] = (rng() & 0x7FFF7FFFu) | (s << 15) | (s_hi << 31);
        }
        // Rowwise: the block's 16 elements are the 8 words' halves in order (element 2j low, 2j + 1 high).
        nvfp4::Raw<DT> raw;
        float v[BLOCK];
        for (int j = 0; j < BLOCK / 2; ++j) {
            raw.w[j] = w[j];
            v[2 * j] = half_value<DT>(w[j], 0);
            v[2 * j + 1] = half_value<DT>(w[j], 1);
        }
        u32 want[2], got[2];
        nvfp4::block_signs(v, want);
        nvfp4::row_signs_16<DT>(raw, got);
        for (int q = 0; q < 2; ++q) row_bad += __builtin_popcount((want[q] ^ got[q]) & nvfp4::NIBBLE_SIGNS);
        // Colwise: column e is the e halves of the 16 words (row i = word i).
        u32 col[2][2];
        nvfp4::column_signs_16(w, col);
        for (int e = 0; e < 2; ++e) {
            for (int i = 0; i < BLOCK; ++i) v[i] = half_value<DT>(w[i], e);
            nvfp4::block_signs(v, want);
            for (int q = 0; q < 2; ++q) col_bad += __builtin_popcount((want[q] ^ col[e][q]) & nvfp4::NIBBLE_SIGNS);
        }
        words += 6;
    }
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    std::mt19937 rng(7);
    unsigned long long row_bad = 0, col_bad = 0, words = 0;
    check<nvfp4::IN_BF16>(rng, row_bad, col_bad, words);
    check<nvfp4::IN_F16>(rng, row_bad, col_bad, words);
    FILE* out = std::fopen(argv[1], "wb");
    if (!out) return 3;
    std::fwrite(&row_bad, sizeof row_bad, 1, out);
    std::fwrite(&col_bad, sizeof col_bad, 1, out);
    std::fwrite(&words, sizeof words, 1, out);
    std::fclose(out);
    return 0;
}
