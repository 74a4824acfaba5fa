// Host replay of the NVFP4 variant kernels' per-unit code in native/cuda/nvfp4.cu (4over6 blocks and
// tiles, row amaxes, the row-scaled plain chain; docs/numerics.md §5.10), compiled for the CPU.
// argv: in out rows cols rs cs mode per_row. `in` holds the fp32 bit patterns of X (row-major, any
// shape: the copy [rows, cols] is read through the strides rs, cs); mode 0 = row-scaled plain chain,
// 1 = 4over6 (tiles in IS_2D builds). A_g: the copy's row amaxes (per_row = 1) or the max of them.
// `out` receives the amax [rows, or 1] fp32, the packed codes [rows, cols/2] and the scales
// [rows, cols/16]. Built by test_nvfp4_variants_host_replay.py (nvcc -x cu, no GPU).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "nvfp4.cu"

int main(int argc, char** argv) {
    if (argc != 9) return 2;
    const long long rows = std::atoll(argv[3]), cols = std::atoll(argv[4]), rs = std::atoll(argv[5]),
                    cs = std::atoll(argv[6]);
    const int mode = std::atoi(argv[7]), per_row = std::atoi(argv[8]);
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 3;
    std::vector<float> x((size_t)(rows * cols));
    if (std::fread(x.data(), sizeof(float), x.size(), in) != x.size()) return 4;
    std::fclose(in);
    const nvfp4::CopySrc s = {x.data(), rows, cols, rs, cs};
    std::vector<float> amax((size_t)rows);
    float amax_all = 0.0f;
    for (long long r = 0; r < rows; ++r) {
        amax[r] = nvfp4::copy_row_amax<nvfp4::IN_F32>(s, r);
        amax_all = nvfp4::fmax_nn(amax_all, amax[r]);
    }
    if (!per_row) amax.assign(1, amax_all);
    const long long nbc = cols / BLOCK, stride = nbc;
    std::vector<unsigned char> data((size_t)(rows * cols / 2)), scale((size_t)(rows * nbc));
    if (mode == 0) {
        for (long long r = 0; r < rows; ++r)
            for (long long cb = 0; cb < nbc; ++cb) {
                const nvfp4::QuantArgs a = {cols, &amax[r], 0ull, 0u, data.data(), scale.data(), stride};
                float v[BLOCK];
                nvfp4::copy_block<nvfp4::IN_F32>(s, r, cb, v);
                const nvfp4::AmaxNan an = nvfp4::block_amax_nan(v);
                nvfp4::encode_block<false>(a, nvfp4::global_scale(amax[r]), r, cb, an.amax, an.has_nan, v);
            }
    } else if (nvfp4::k2d) {
        for (long long tr = 0; tr < rows / BLOCK; ++tr)
            for (long long cb = 0; cb < nbc; ++cb)
                nvfp4::four6_tile<nvfp4::IN_F32>(s, amax[0], tr, cb, data.data(), scale.data(), stride);
    } else {
        for (long long r = 0; r < rows; ++r)
            for (long long cb = 0; cb < nbc; ++cb)
                nvfp4::four6_block<nvfp4::IN_F32>(s, amax[per_row ? r : 0], r, cb, data.data(), scale.data(), stride);
    }
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 5;
    std::fwrite(amax.data(), sizeof(float), amax.size(), out);
    std::fwrite(data.data(), 1, data.size(), out);
    std::fwrite(scale.data(), 1, scale.size(), out);
    std::fclose(out);
    return 0;
}
