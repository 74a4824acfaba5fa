// Host replay of the 16-point RHT of native/cuda/nvfp4.cuh (rht16 and the path it takes, and the post-RHT amax
// pass's pieces: rht16_amax, and the path from the packed words' low exponents), compiled for the CPU: reads chunks
// of 16 fp32 bit patterns (bf16 values) from argv[1] and writes for each chunk n its 16 output bit patterns, the
// RhtPath rht_path chose, the RhtPath that rht_path_of chooses from bf16_pair_low_exponents of the words pairing
// chunk n with chunk n ^ 1 (chunk n in the low halves when n is even), and the bits of rht16_amax, to argv[2].
// Built by test_nvfp4_host_replay.py (nvcc -x cu: a host program; no kernel, no GPU).
#include <cstdio>
#include <vector>

#include "nvfp4.cuh"

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 3;
    std::vector<unsigned int> all;
    unsigned int bits[BLOCK];
    while (std::fread(bits, sizeof bits[0], BLOCK, in) == (size_t)BLOCK) all.insert(all.end(), bits, bits + BLOCK);
    const size_t n = all.size() / BLOCK;
    if (n % 2 != 0) return 4;  // chunks come in pairs (the packed words)
    for (size_t c = 0; c < n; ++c) {
        float v[BLOCK], h[BLOCK];
        for (int i = 0; i < BLOCK; ++i) v[i] = nvfp4::u2f(all[c * BLOCK + i]);
        nvfp4::rht16(v, h);
        for (int i = 0; i < BLOCK; ++i) bits[i] = nvfp4::f2u(h[i]);
        const nvfp4::RhtPath path = nvfp4::rht_path(v);
        const size_t lo = c & ~(size_t)1, hi = lo + 1;  // the pair: lo in the low halves
        unsigned int words[BLOCK];
        for (int i = 0; i < BLOCK; ++i) words[i] = (all[lo * BLOCK + i] >> 16) | (all[hi * BLOCK + i] & 0xFFFF0000u);
        unsigned int e_lo[2];
        nvfp4::bf16_pair_low_exponents(words, e_lo);
        float v_max = 0.0f;  // the NaN-propagating max |v| (the kernel's pair_amax_nan)
        for (int i = 0; i < BLOCK; ++i) v_max = nvfp4::fmax_nan(v_max, fabsf(v[i]));
        const unsigned char packed = (unsigned char)nvfp4::rht_path_of(v_max, e_lo[c & 1]);
        const unsigned int amax = nvfp4::f2u(nvfp4::rht16_amax(v, path));
        const unsigned char p = (unsigned char)path;
        std::fwrite(bits, sizeof bits[0], BLOCK, out);
        std::fwrite(&p, 1, 1, out);
        std::fwrite(&packed, 1, 1, out);
        std::fwrite(&amax, sizeof amax, 1, out);
    }
    std::fclose(in);
    std::fclose(out);
    return 0;
}
