// Exhaustive host check of the word encode of native/cuda/nvfp4.cuh (e2m1_rn_word, the sm_90 path)
// against the per-element software path (e2m1_rn_not_nan: rne_sat_mag, the magic addition) over all
// 2^32 fp32 bit patterns. Patterns 8j .. 8j+7 fill one word, rotated by j so that every lane sees every
// low-bit residue; NaN lanes are masked (the kernels fix NaN codes afterwards, §0.5). Every word whose 8
// patterns are all below ELEM_LINES_BOUND in magnitude (and not NaN) also goes through e2m1_rn_word_bounded
// (|y| and nibble_signs(y), the kernels' unclamped path). Writes to argv[1]: the mismatch count, the bounded path's
// mismatch and word counts (3 x u64), then the runs of the per-element code over the patterns in increasing
// order (a NaN pattern counts as code 0xFF): (first pattern, code) pairs, for the test to check every
// run's ends against reference.nvfp4.e2m1_rn. Built by test_nvfp4_encode_exhaustive.py.
#include <cmath>
#include <cstdio>
#include <vector>

#include "nvfp4.cuh"

namespace {
constexpr nvfp4::u32 NAN_CODE = 0xFFu;
constexpr int CHUNK = 1 << 16;  // patterns per chunk (a multiple of 64: whole rotation cycles)

// The per-element software path (rne_sat_mag), NaN as NAN_CODE.
inline nvfp4::u32 old_code(nvfp4::u32 bits) {
    const float v = nvfp4::u2f(bits);
    return nvfp4::is_nan(v) ? NAN_CODE : nvfp4::e2m1_rn_not_nan(v);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    using nvfp4::u32;
    unsigned long long mismatches = 0, bounded_mismatches = 0, bounded_words = 0;
    std::vector<u32> runs;  // first pattern, code, ...
    std::vector<unsigned char> code(CHUNK);
    u32 run_code = 0x100u;
    for (unsigned long long base = 0; base < (1ull << 32); base += CHUNK) {
        for (int k = 0; k < CHUNK; ++k) code[k] = (unsigned char)old_code((u32)(base + k));
        for (int k = 0; k < CHUNK; ++k) {
            if (code[k] != run_code) {
                runs.push_back((u32)(base + k));
                runs.push_back(code[k]);
                run_code = code[k];
            }
        }
        for (int g = 0; g < CHUNK / 8; ++g) {
            // Group j = (base + 8g) / 8: pattern 8j + i goes to lane (i + j) % 8.
            const int rot = (int)(((base >> 3) + g) & 7u);
            float y[8], a[8];
            u32 want = 0u, care = 0u;
            bool bounded = true;
            for (int i = 0; i < 8; ++i) {
                const int lane = (i + rot) & 7;
                const u32 c = code[8 * g + i];
                y[lane] = nvfp4::u2f((u32)(base + 8 * g + i));
                a[lane] = std::fabs(y[lane]);
                bounded = bounded && a[lane] < nvfp4::ELEM_LINES_BOUND;  // false for a NaN
                const u32 keep = c == NAN_CODE ? 0u : 0xFu;
                want |= (c & keep) << (4 * lane);
                care |= keep << (4 * lane);
            }
            mismatches += (nvfp4::e2m1_rn_word(y) & care) != want;
            if (bounded) {
                ++bounded_words;
                bounded_mismatches += nvfp4::e2m1_rn_word_bounded(a, nvfp4::nibble_signs(y)) != want;
            }
        }
    }
    FILE* out = std::fopen(argv[1], "wb");
    if (!out) return 3;
    std::fwrite(&mismatches, sizeof mismatches, 1, out);
    std::fwrite(&bounded_mismatches, sizeof bounded_mismatches, 1, out);
    std::fwrite(&bounded_words, sizeof bounded_words, 1, out);
    std::fwrite(runs.data(), sizeof(u32), runs.size(), out);
    std::fclose(out);
    return 0;
}
