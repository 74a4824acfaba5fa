// Programmatic dependent launch (PTX griddepcontrol, sm_90+): the kernel side of native/launch.py
// programmatic_launch. A kernel launched programmatically may start while the kernel before it in the
// stream still runs; before it reads or writes anything that kernel touches it calls wait_for_prior_grid,
// which returns once that grid has completed and its memory is visible (at once for a kernel launched the
// ordinary way). allow_dependent_launch lets the next kernel, if launched programmatically, start before
// this one ends (its CTAs then share the SMs); it changes no ordering of memory: the dependent still waits.
// Both are no-ops before sm_90. Source: CUDA C++ Programming Guide, "Programmatic Dependent Launch";
// docs/design.md §4.1.
#pragma once

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
