// A small function the GPU kernels share with the host code (one definition for both).
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ANVIL_HOST_DEVICE __host__ __device__
#else
#define ANVIL_HOST_DEVICE
#endif
