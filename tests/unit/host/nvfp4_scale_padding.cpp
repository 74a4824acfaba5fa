// Host replay of the NVFP4 scales' zero padding (native/cuda/nvfp4.cu zero_scale_padding, the grid-stride loops every
// thread of the padding launch runs). Reads cases from stdin, one a line: scale_rows scale_stride rows nb threads;
// for each, a [scale_rows, scale_stride] byte buffer filled with 0xAB is passed through zero_scale_padding once for
// every thread of a grid of `threads` (first = 0 .. threads - 1, step = threads), and the buffer is appended to
// argv[1]. test_nvfp4_host_replay.py checks the bytes against the padded and valid shapes of reference.layouts.
#include <cstdio>
#include <vector>

#include "nvfp4.cu"

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    FILE* out = std::fopen(argv[1], "wb");
    if (!out) return 2;
    long long scale_rows, stride, rows, nb, threads;
    while (std::scanf("%lld %lld %lld %lld %lld", &scale_rows, &stride, &rows, &nb, &threads) == 5) {
        std::vector<nvfp4::u8> buf((size_t)(scale_rows * stride), 0xAB);
        for (long long first = 0; first < threads; ++first)
            nvfp4::zero_scale_padding(buf.data(), stride, scale_rows, rows, nb, first, threads);
        std::fwrite(buf.data(), 1, buf.size(), out);
    }
    return std::fclose(out) == 0 ? 0 : 2;
}
