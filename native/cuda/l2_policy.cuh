// L2 eviction priority of loads (PTX createpolicy and ld.global.L2::cache_hint, sm_80+) for the passes that read
// their input only to reduce it: the amax passes (nvfp4_amax_*, nvfp4_rht_amax, tensor_amax_*). Loaded at
// evict-first priority, a pass's own lines are the next ones the L2 replaces, so the dirty outputs that the call
// before left in the L2 (its quantize or cast pass) stay there until a later pass, which is not DRAM-bound, writes
// them back; at normal priority this DRAM-bound pass paid for that write-back. A hint only: the values loaded are
// the same. Measured in docs/performance.md §4.6 (issue #18). Outside device code (nvcc's host pass, the host replay of
// nvfp4.cu) a plain load.
#pragma once

// The policy "every line this access allocates is evict-first" (fraction 1.0).
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
    unsigned long long policy = 0;
#if defined(__CUDA_ARCH__)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
}

// *p under `policy` (the input is read-only while the kernel runs: no volatile, no memory clobber).
__device__ __forceinline__ uint4 load_with_policy(const uint4* p, unsigned long long policy) {
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
#else
    (void)policy;
    return *p;
#endif
}

__device__ __forceinline__ unsigned int load_with_policy(const unsigned int* p, unsigned long long policy) {
#if defined(__CUDA_ARCH__)
    unsigned int v;
    asm("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(policy));
    return v;
#else
    (void)policy;
    return *p;
#endif
}
