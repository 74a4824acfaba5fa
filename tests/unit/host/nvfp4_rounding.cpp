// Host replay of the NVFP4 element rounding of native/cuda/nvfp4.cuh (its __host__ __device__ code,
// compiled for the CPU): reads n fp32 bit patterns and n random bytes from argv[1], writes the
// e2m1_rn codes and the e2m1_sr codes (one byte each) to argv[2]. Built by test_nvfp4_host_replay.py
// (nvcc -x cu: a host program; no kernel, no GPU).
#include <cstdio>
#include <vector>

#include "nvfp4.cuh"

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 3;
    std::vector<unsigned int> bits;
    std::vector<unsigned char> rnd;
    unsigned int b;
    unsigned char r;
    while (std::fread(&b, sizeof b, 1, in) == 1 && std::fread(&r, 1, 1, in) == 1) {
        bits.push_back(b);
        rnd.push_back(r);
    }
    std::fclose(in);
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 4;
    for (size_t i = 0; i < bits.size(); ++i) {
        const float v = nvfp4::u2f(bits[i]);
        const unsigned char codes[2] = {(unsigned char)nvfp4::e2m1_rn(v), (unsigned char)nvfp4::e2m1_sr(v, rnd[i])};
        std::fwrite(codes, 1, 2, out);
    }
    std::fclose(out);
    return 0;
}
