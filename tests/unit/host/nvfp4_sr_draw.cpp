// Host replay of the quantize kernel's SR block encode (native/cuda/nvfp4.cu encode_block<true> -> encode_words<true>:
// the block's Philox draw, nvfp4.cuh sr_draw, and its four words handed to e2m1_sr_word; docs/numerics.md §5.7),
// compiled for the CPU. argv: in out rows cols rs cs seed stream. `in` holds the fp32 bit patterns of X (row-major,
// any shape: the copy [rows, cols] is read through the strides rs, cs); A_g is the amax of the copy. `out` receives
// the packed codes [rows, cols/2] and the scales [rows, cols/16]. Built by test_nvfp4_host_replay.py (nvcc -x cu,
// no GPU) with the defines of the 1x16 SR build.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "nvfp4.cu"

static_assert(nvfp4::kSr, "built with STOCHASTIC = 1");

int main(int argc, char** argv) {
    if (argc != 9) return 2;
    const long long rows = std::atoll(argv[3]), cols = std::atoll(argv[4]), rs = std::atoll(argv[5]),
                    cs = std::atoll(argv[6]);
    const unsigned long long seed = std::strtoull(argv[7], nullptr, 0);
    const nvfp4::u32 stream = (nvfp4::u32)std::strtoul(argv[8], nullptr, 0);
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 3;
    std::vector<float> x((size_t)(rows * cols));
    if (std::fread(x.data(), sizeof(float), x.size(), in) != x.size()) return 4;
    std::fclose(in);
    const nvfp4::CopySrc s = {x.data(), rows, cols, rs, cs};
    float amax_g = 0.0f;
    for (long long r = 0; r < rows; ++r) amax_g = nvfp4::fmax_nn(amax_g, nvfp4::copy_row_amax<nvfp4::IN_F32>(s, r));
    const long long nbc = cols / BLOCK;
    std::vector<unsigned char> data((size_t)(rows * cols / 2)), scale((size_t)(rows * nbc));
    const nvfp4::QuantArgs a = {cols, &amax_g, seed, stream, data.data(), scale.data(), nbc};
    const nvfp4::GlobalScale g = nvfp4::global_scale(amax_g);
    for (long long r = 0; r < rows; ++r)
        for (long long cb = 0; cb < nbc; ++cb) {
            float v[BLOCK];
            nvfp4::copy_block<nvfp4::IN_F32>(s, r, cb, v);
            const nvfp4::AmaxNan an = nvfp4::block_amax_nan(v);
            nvfp4::encode_block<true>(a, g, r, cb, an.amax, an.has_nan, v);
        }
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 5;
    std::fwrite(data.data(), 1, data.size(), out);
    std::fwrite(scale.data(), 1, scale.size(), out);
    std::fclose(out);
    return 0;
}
