// One declaration per op: an op's header declares it once, with its contract, and
// ANVIL_OP_IMPLEMENTATIONS(op) declares its three implementations with the same signature:
// ref:: (the scalar specification, ref/), cpu:: (the fast CPU kernels, cpu/) and gpu:: (device
// pointers; gpu/, one source for CUDA and HIP). dispatch.cpp is the one place that chooses
// between them. An implementation defined with another signature fails to link.
#pragma once

#include "core/host_device.h"

// Inside namespace anvil, after op's declaration.
#define ANVIL_OP_IMPLEMENTATIONS(op)   \
  namespace ref {                      \
  decltype(::anvil::op) op;            \
  }                                    \
  namespace cpu {                      \
  decltype(::anvil::op) op;            \
  }                                    \
  namespace gpu {                      \
  decltype(::anvil::op) op;            \
  }
