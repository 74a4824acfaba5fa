// Host replay of the NVFP4 element rounding of native/cuda/nvfp4.cuh (its __host__ __device__ code,
// compiled for the CPU): reads n fp32 bit patterns and n random bytes from argv[1], writes four codes per
// input (one byte each) to argv[2]: e2m1_rn, e2m1_sr (per element), and the same two from the word encodes
// the kernels run (e2m1_rn_word, e2m1_sr_word over inputs 8j .. 8j+7, the bytes of 4j .. 4j+3 as one random
// word; NaN lanes set to ELEM_NAN_CODE as encode_words does). Built by test_nvfp4_host_replay.py
// (nvcc -x cu: a host program; no kernel, no GPU).
#include <cstdio>
#include <vector>

#include "nvfp4.cuh"

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    using nvfp4::u32;
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 3;
    std::vector<u32> bits;
    std::vector<unsigned char> rnd;
    u32 b;
    unsigned char r;
    while (std::fread(&b, sizeof b, 1, in) == 1 && std::fread(&r, 1, 1, in) == 1) {
        bits.push_back(b);
        rnd.push_back(r);
    }
    std::fclose(in);
    const size_t n = bits.size();
    while (bits.size() % 8) {  // whole words: zero padding, not written out
        bits.push_back(0u);
        rnd.push_back(0);
    }
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 4;
    for (size_t j = 0; j < bits.size(); j += 8) {
        float y[8];
        u32 words[2] = {0u, 0u};
        for (int i = 0; i < 8; ++i) {
            y[i] = nvfp4::u2f(bits[j + i]);
            words[i / 4] |= (u32)rnd[j + i] << (8 * (i % 4));
        }
        const u32 rn_word = nvfp4::e2m1_rn_word(y), sr_word = nvfp4::e2m1_sr_word(y, words);
        for (int i = 0; i < 8 && j + i < n; ++i) {
            const bool nan = nvfp4::is_nan(y[i]);
            const unsigned char codes[4] = {
                (unsigned char)nvfp4::e2m1_rn(y[i]), (unsigned char)nvfp4::e2m1_sr(y[i], rnd[j + i]),
                (unsigned char)(nan ? (u32)ELEM_NAN_CODE : (rn_word >> (4 * i)) & 0xFu),
                (unsigned char)(nan ? (u32)ELEM_NAN_CODE : (sr_word >> (4 * i)) & 0xFu)};
            std::fwrite(codes, 1, 4, out);
        }
    }
    std::fclose(out);
    return 0;
}
