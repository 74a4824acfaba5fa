// The driver API's cuLaunchKernelEx structures as cuda.h lays them out, for native/launch.py's ctypes mirror
// (tests/unit/test_native_programmatic_launch.py): sizes, field offsets and the attribute's id, one per line.
#include <cstddef>
#include <cstdio>

#include <cuda.h>

int main() {
    std::printf("attribute_size %zu\n", sizeof(CUlaunchAttribute));
    std::printf("attribute_value_offset %zu\n", offsetof(CUlaunchAttribute, value));
    std::printf("config_size %zu\n", sizeof(CUlaunchConfig));
    std::printf("config_block_offset %zu\n", offsetof(CUlaunchConfig, blockDimX));
    std::printf("config_shared_mem_offset %zu\n", offsetof(CUlaunchConfig, sharedMemBytes));
    std::printf("config_stream_offset %zu\n", offsetof(CUlaunchConfig, hStream));
    std::printf("config_attrs_offset %zu\n", offsetof(CUlaunchConfig, attrs));
    std::printf("config_num_attrs_offset %zu\n", offsetof(CUlaunchConfig, numAttrs));
    std::printf("programmatic_stream_serialization %d\n", (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
