// Host replay of the 16-point RHT of native/cuda/nvfp4.cuh (rht16 and the path it takes, compiled
// for the CPU): reads chunks of 16 fp32 bit patterns from argv[1], writes for each chunk its 16
// output bit patterns and then one byte, the RhtPath rht_path chose, to argv[2]. Built by
// test_nvfp4_host_replay.py (nvcc -x cu: a host program; no kernel, no GPU).
#include <cstdio>

#include "nvfp4.cuh"

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 3;
    unsigned int bits[BLOCK];
    while (std::fread(bits, sizeof bits[0], BLOCK, in) == (size_t)BLOCK) {
        float v[BLOCK], h[BLOCK];
        for (int i = 0; i < BLOCK; ++i) v[i] = nvfp4::u2f(bits[i]);
        nvfp4::rht16(v, h);
        for (int i = 0; i < BLOCK; ++i) bits[i] = nvfp4::f2u(h[i]);
        const unsigned char path = (unsigned char)nvfp4::rht_path(v);
        std::fwrite(bits, sizeof bits[0], BLOCK, out);
        std::fwrite(&path, 1, 1, out);
    }
    std::fclose(in);
    std::fclose(out);
    return 0;
}
