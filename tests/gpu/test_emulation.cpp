// The emulated GPU runtime (src/device/emulated/emulation.h) keeps the promises the kernel tests rely on:
// a block's threads meet at barriers, warp shuffles exchange between lanes of the warp width
// device/arch.h names, and what would hang or be refused on a GPU is an error, not a wrong result.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/error.h"
#include "device/arch.h"
#include "device/device.h"
#include "device/stream.h"

namespace anvil {
namespace {

constexpr int kThreads = 256;

// out[block] = the sum of in[block's 256 values], by a shared-memory tree: every step reads what
// other threads wrote before the barrier.
__global__ void block_sum_kernel(float* out, const float* in) {
  __shared__ float shared[kThreads];
  shared[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

// Each thread writes its warp's total and what lane 3 of its warp holds.
__global__ void warp_kernel(float* total, float* from_lane3, const float* in) {
  const float v = in[threadIdx.x];
  total[threadIdx.x] = gpu::warp_sum(v);
  from_lane3[threadIdx.x] = gpu::shfl(v, 3);
}

// Only the first half of the block reaches the barrier: a GPU would hang.
__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < kThreads / 2) __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Thread 0 leaves before the barrier the others reach.
__global__ void late_barrier_kernel(float* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void write_kernel(float* out) { out[blockIdx.y] = 1.0f; }

std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> h(n);
  gpu_copy_to_host(h.data(), d, n * sizeof(float));
  return h;
}

class GpuEmulation : public ::testing::Test {
 protected:
  void SetUp() override { gpu_select(0); }
  float* device_floats(const std::vector<float>& h) {
    auto* d = static_cast<float*>(gpu_alloc(h.size() * sizeof(float)));
    gpu_copy_to_device(d, h.data(), h.size() * sizeof(float));
    held_.push_back(d);
    return d;
  }
  void TearDown() override {
    for (float* d : held_) gpu_release(d);
  }

 private:
  std::vector<float*> held_;
};

TEST_F(GpuEmulation, ThreadsOfABlockMeetAtBarriers) {
  std::vector<float> in(3 * kThreads);
  std::iota(in.begin(), in.end(), 0.0f);
  float* d_in = device_floats(in);
  float* d_out = device_floats(std::vector<float>(3, 0.0f));
  GPU_LAUNCH(block_sum_kernel, 3, kThreads)(d_out, d_in);
  GPU_CHECK_LAUNCH();
  const std::vector<float> out = to_host(d_out, 3);
  for (int b = 0; b < 3; b++) {
    const float want = static_cast<float>(kThreads) * (kThreads - 1) / 2 + static_cast<float>(b) * kThreads * kThreads;
    EXPECT_EQ(out[b], want) << "block " << b;
  }
}

TEST_F(GpuEmulation, WarpShufflesStayWithinTheWarp) {
  std::vector<float> in(kThreads);
  for (int t = 0; t < kThreads; t++) in[t] = static_cast<float>(t % 7 + 100 * (t / gpu::kWarpSize));
  float* d_in = device_floats(in);
  float* d_total = device_floats(std::vector<float>(kThreads));
  float* d_lane3 = device_floats(std::vector<float>(kThreads));
  GPU_LAUNCH(warp_kernel, 1, kThreads)(d_total, d_lane3, d_in);
  GPU_CHECK_LAUNCH();
  const std::vector<float> total = to_host(d_total, kThreads), lane3 = to_host(d_lane3, kThreads);
  for (int t = 0; t < kThreads; t++) {
    const int first = t - t % gpu::kWarpSize;
    const float want = std::accumulate(in.begin() + first, in.begin() + first + gpu::kWarpSize, 0.0f);
    EXPECT_EQ(total[t], want) << "thread " << t;
    EXPECT_EQ(lane3[t], in[first + 3]) << "thread " << t;
  }
}

TEST_F(GpuEmulation, ABarrierNotEveryThreadReachesIsAnError) {
  float* d_out = device_floats(std::vector<float>(kThreads));
  GPU_LAUNCH(divergent_barrier_kernel, 1, kThreads)(d_out);
  EXPECT_THROW(
      {
        try {
          GPU_CHECK_LAUNCH();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("barrier was not reached"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  GPU_LAUNCH(late_barrier_kernel, 1, kThreads)(d_out);
  EXPECT_THROW(GPU_CHECK_LAUNCH(), Error);
  // The error was taken: the next launch starts clean.
  GPU_LAUNCH(write_kernel, 1, 1)(d_out);
  GPU_CHECK_LAUNCH();
}

// A GPU faults on host memory where device memory is meant; the emulated one, whose memory is all
// host memory, checks instead.
TEST_F(GpuEmulation, HostMemoryWhereDeviceMemoryIsMeantIsAnError) {
  std::vector<float> host(kThreads);
  GPU_LAUNCH(write_kernel, 1, 1)(host.data());
  EXPECT_THROW(GPU_CHECK_LAUNCH(), Error);
  EXPECT_EQ(host[0], 0.0f);  // the kernel did not run
  float* d = device_floats(std::vector<float>(kThreads));
  EXPECT_THROW(gpu_copy_to_device(host.data(), d, sizeof(float)), Error);  // the direction reversed
  EXPECT_THROW(gpu_copy_to_host(host.data(), host.data() + 1, sizeof(float)), Error);
  gpu_copy_to_host(host.data(), d + kThreads - 1, sizeof(float));  // the allocation's last element
}

TEST_F(GpuEmulation, ALaunchAGpuWouldRefuseIsAnError) {
  float* d_out = device_floats(std::vector<float>(1));
  GPU_LAUNCH(write_kernel, dim3(1, 65536), 1)(d_out);
  EXPECT_THROW(GPU_CHECK_LAUNCH(), Error);
  GPU_LAUNCH(write_kernel, 1, 2048)(d_out);
  EXPECT_THROW(GPU_CHECK_LAUNCH(), Error);
}

}  // namespace
}  // namespace anvil
