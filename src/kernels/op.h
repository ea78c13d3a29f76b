// One declaration per op: an op's header declares it once, with its contract, and
// ANVIL_OP_IMPLEMENTATIONS(op) declares its three implementations: ref:: (the scalar
// specification, ref/), cpu:: (the fast CPU kernels, cpu/) and gpu:: (device pointers; gpu/, one
// source for CUDA and HIP). An op's first parameter is the implementation that runs it
// (KernelImpl, chosen by whoever owns the arrays: a model, an optimizer, a test), which the
// implementations do not take; the matrix products take a MatmulContext instead, which carries
// it (ANVIL_CONTEXT_OP_IMPLEMENTATIONS: the implementations take the same parameters).
// dispatch.cpp is the one place that chooses between them. An implementation defined with another
// signature fails to link.
#pragma once

#include "core/host_device.h"
#include "core/kernel_impl.h"

namespace anvil::detail {
template <class F>
struct WithoutImpl;
template <class R, class... A>
struct WithoutImpl<R(KernelImpl, A...)> {
  using type = R(A...);
};
}  // namespace anvil::detail

// Inside namespace anvil, after op's declaration.
#define ANVIL_OP_IMPLEMENTATIONS(op)                            \
  namespace ref {                                               \
  ::anvil::detail::WithoutImpl<decltype(::anvil::op)>::type op; \
  }                                                             \
  namespace cpu {                                               \
  ::anvil::detail::WithoutImpl<decltype(::anvil::op)>::type op; \
  }                                                             \
  namespace gpu {                                               \
  ::anvil::detail::WithoutImpl<decltype(::anvil::op)>::type op; \
  }
#define ANVIL_CONTEXT_OP_IMPLEMENTATIONS(op) \
  namespace ref {                            \
  decltype(::anvil::op) op;                  \
  }                                          \
  namespace cpu {                            \
  decltype(::anvil::op) op;                  \
  }                                          \
  namespace gpu {                            \
  decltype(::anvil::op) op;                  \
  }
