// `anvil doctor`: the report, the op-parity self-test and the all-reduce self-test.
#include "train/doctor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "device/device.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "parallel/gpu_collectives.h"
#include "parallel/op_collectives.h"
#include "kernels/attention.h"
#include "kernels/buffer.h"
#include "kernels/crossentropy.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "train/loss_plot.h"

namespace anvil {
namespace {

std::vector<float> random_values(size_t n, uint64_t stream) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(normal_at(7, stream, i));
  return v;
}

double rel_norm_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Inputs and outputs of one op, run under a kernel implementation: host vectors in, host vectors
// out, whatever memory its ops use.
struct OpRun {
  explicit OpRun(KernelImpl k) : impl(k) {}
  KernelImpl impl;
  std::vector<OpArray<float>> arrays;
  float* put(const std::vector<float>& host) {
    arrays.emplace_back();
    arrays.back().assign_zeros(impl, host.size());
    op_copy_from_host(impl, arrays.back().data(), host.data(), host.size() * sizeof(float));
    return arrays.back().data();
  }
  float* zeros(size_t n) { return put(std::vector<float>(n, 0.0f)); }
  std::vector<float> get(const float* p, size_t n) const {
    std::vector<float> host(n);
    op_copy_to_host(impl, host.data(), p, n * sizeof(float));
    return host;
  }
};

// Each op's output under impl against the reference's, on small random inputs; the worst
// relative norm error.
struct ParityResult {
  std::string op;
  double error;
};
std::vector<ParityResult> op_parity(KernelImpl impl) {
  const int N = 64, C = 96, OC = 160, T = 37, NH = 3, V = 1000;
  auto x = random_values(N * C, 1), w = random_values(OC * C, 2), b = random_values(OC, 3);
  auto qkv = random_values(2 * T * 3 * C, 4), logits = random_values(N * V, 5);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; i++) targets[i] = (i * 37) % V;
  // Each op: the outputs of an implementation, flattened.
  const std::vector<std::pair<std::string, std::function<std::vector<float>(KernelImpl)>>> ops = {
      {"matmul",
       [&](KernelImpl k) {
         OpRun r(k);
         float* out = r.zeros(N * OC);
         MatmulContext ctx(k);
         matmul_forward(ctx, out, r.put(x), r.put(w), r.put(b), N, C, OC);
         return r.get(out, N * OC);
       }},
      {"layernorm",
       [&](KernelImpl k) {
         OpRun r(k);
         float *out = r.zeros(N * C), *m = r.zeros(N), *s = r.zeros(N);
         layernorm_forward(k, out, m, s, r.put(x), r.put(std::vector<float>(w.begin(), w.begin() + C)),
                           r.put(std::vector<float>(b.begin(), b.begin() + C)), N, C);
         return r.get(out, N * C);
       }},
      {"attention",
       [&](KernelImpl k) {
         OpRun r(k);
         float *out = r.zeros(2 * T * C), *lse = r.zeros(2 * NH * T), *dqkv = r.zeros(qkv.size());
         float* in = r.put(qkv);
         attention_forward(k, out, lse, in, nullptr, 2, T, {NH, NH, C / NH});
         float* dout = r.put(random_values(2 * T * C, 6));
         attention_backward(k, dqkv, dout, in, out, lse, nullptr, 2, T, {NH, NH, C / NH});
         std::vector<float> all = r.get(out, 2 * T * C), d = r.get(dqkv, qkv.size());
         all.insert(all.end(), d.begin(), d.end());
         return all;
       }},
      {"cross-entropy",
       [&](KernelImpl k) {
         OpRun r(k);
         OpArray<int32_t> t;
         t.assign_zeros(k, N);
         op_copy_from_host(k, t.data(), targets.data(), N * sizeof(int32_t));
         float *losses = r.zeros(N), *d = r.put(logits);
         crossentropy_forward_backward(k, losses, d, d, t.data(), 0.5f, N, V, ComputeDtype::kFp32);
         std::vector<float> all = r.get(losses, N), g = r.get(d, logits.size());
         all.insert(all.end(), g.begin(), g.end());
         return all;
       }},
  };
  std::vector<ParityResult> results;
  for (const auto& [name, run] : ops) results.push_back({name, rel_norm_error(run(impl), run(KernelImpl::kRef))});
  return results;
}

// What kernels=gpu measures against: fp32 products, reduction order aside, agree to ~1e-6.
constexpr double kParityTolerance = 1e-5;

bool report_parity(const char* label, KernelImpl impl) {
  bool ok = true;
  std::printf("  %s:", label);
  for (const ParityResult& r : op_parity(impl)) {
    const bool pass = r.error <= kParityTolerance;
    ok = ok && pass;
    std::printf(" %s %.1e%s", r.op.c_str(), r.error, pass ? "" : " FAIL");
  }
  std::printf("  (relative error vs the reference; limit %.0e)\n", kParityTolerance);
  return ok;
}

}  // namespace

// NCCL/RCCL over every rank's GPU, in GPU memory: the same exact integer sums.
bool gpu_all_reduce_exact(Communicator& comm, const std::vector<int64_t>& contribution,
                          const std::vector<int64_t>& want) {
  const size_t bytes = contribution.size() * sizeof(int64_t);
  void* d = gpu_alloc(bytes);
  gpu_copy_to_device(d, contribution.data(), bytes);
  make_gpu_collectives(comm)->all_reduce(static_cast<int64_t*>(d), contribution.size());
  std::vector<int64_t> got(contribution.size());
  gpu_copy_to_host(got.data(), d, bytes);
  gpu_release(d);
  return got == want;
}

int run_doctor() {
  std::unique_ptr<Communicator> comm = make_communicator();
  const bool rank0 = comm->rank() == 0;
  bool ok = true;
  const std::vector<GpuInfo> gpus = gpu_devices();
  // Each rank on the GPU training would give it.
  if (!gpus.empty()) gpu_select(static_cast<int>(static_cast<size_t>(comm->local_rank()) % gpus.size()));
  if (rank0) {
    std::printf("anvil doctor\n");
    const CpuInfo& cpu = cpu_info();
    std::printf("cpu: %s, %d threads, %s; %s\n", cpu.model.c_str(), cpu.threads,
                cpu.amx_bf16     ? "AVX-512 with BF16 and AMX"
                : cpu.avx512bf16 ? "AVX-512 with BF16"
                : cpu.avx512     ? "AVX-512"
                : cpu.avx2       ? "AVX2"
                                 : "no AVX2",
                matmul_backend_description(KernelImpl::kCpu).c_str());
    std::printf("gpu backend: %s\n", gpu_backend_description().c_str());
    if (gpus.empty()) std::printf("gpus: none visible\n");
    for (const GpuInfo& g : gpus)
      std::printf("gpu %d: %s, %s, %d multiprocessors, %.1f GiB (%.1f GiB free)\n", g.index, g.name.c_str(),
                  g.arch.c_str(), g.multiprocessors, g.total_bytes / 1073741824.0, g.free_bytes / 1073741824.0);
    std::printf("gpu collectives: %s\n", gpu_collectives_description().c_str());
    std::printf("communicator: %s, %d rank(s)\n", comm->backend().c_str(), comm->size());
    std::printf("launch: %s\n", describe_launch(*comm).c_str());
    std::printf("tokenizers: GPT-2 byte-level BPE%s\n",
                sentencepiece_available() ? ", SentencePiece" : " (no SentencePiece: built without libsentencepiece)");
    const std::string no_plots = loss_plot_unavailable();
    std::printf("loss plots: %s\n", no_plots.empty() ? "PLplot, PNG" : ("none: " + no_plots).c_str());
    std::printf("self-test, op parity:\n");
    ok = report_parity("cpu", KernelImpl::kCpu) && ok;
    if (!gpus.empty()) {
      ok = report_parity("gpu", KernelImpl::kGpu) && ok;
    } else {
      std::printf("  gpu: skipped (no GPU)\n");
    }
  }
  // Integers sum exactly: every rank must see W(W+1)/2 · (i+1) in element i.
  const int64_t W = comm->size();
  std::vector<int64_t> mine(1000), want(1000);
  for (size_t i = 0; i < mine.size(); i++) {
    mine[i] = static_cast<int64_t>(comm->rank() + 1) * static_cast<int64_t>(i + 1);
    want[i] = W * (W + 1) / 2 * static_cast<int64_t>(i + 1);
  }
  std::vector<int64_t> v = mine;
  all_reduce(*comm, v.data(), v.size());
  bool all_exact = sum_exact(*comm, v == want ? 0 : 1) == 0;
  if (rank0)
    std::printf("self-test, all-reduce over %d rank(s): %s\n", comm->size(), all_exact ? "exact" : "WRONG SUMS");
  ok = ok && all_exact;
  // The same through NCCL/RCCL, where every rank has a GPU of its own (NCCL refuses two ranks on
  // one GPU).
  const bool all_have_gpus = sum_exact(*comm, gpu_collectives_built() && !gpus.empty()) == W;
  const bool shared = all_have_gpus && gpu_sharing(*comm).any;
  if (all_have_gpus && !shared) {
    all_exact = sum_exact(*comm, gpu_all_reduce_exact(*comm, mine, want) ? 0 : 1) == 0;
    if (rank0)
      std::printf("self-test, %s all-reduce over %d GPU(s): %s\n", gpu_collectives_description().c_str(),
                  comm->size(), all_exact ? "exact" : "WRONG SUMS");
    ok = ok && all_exact;
  } else if (rank0) {
    std::printf("self-test, GPU all-reduce: skipped (%s)\n",
                !gpu_collectives_built() ? "no NCCL/RCCL in this build"
                : gpus.empty()           ? "no GPU"
                : !all_have_gpus         ? "a rank without a GPU"
                                         : "ranks share a GPU");
  }
  if (rank0) std::printf("%s\n", ok ? "all self-tests passed" : "a self-test FAILED");
  return ok ? 0 : 1;
}

}  // namespace anvil
