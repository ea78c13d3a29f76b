// The shapes are products of one sequence (or of one microbatch, where training runs the whole
// microbatch in one product) of bench-16m and of GPT-2 124M at sequence 64, and a large square.
#include "kernels/bench_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "kernels/cpu/best_rate.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/onednn_matmul.h"

namespace anvil {
namespace {

// The three products of a linear layer with input inp (rows × in) and weight W (out × in).
enum class Product { kForward, kInputGrad, kWeightGrad };

struct Shape {
  const char* name;
  Product product;
  int rows, in, out;
};

}  // namespace

std::vector<BenchGemmRow> bench_gemm(int rounds, double min_seconds) {
  const Shape shapes[] = {
      {"bench-16m LM head, forward", Product::kForward, 256, 256, 50257},
      {"bench-16m LM head, input gradient", Product::kInputGrad, 256, 256, 50257},
      {"bench-16m LM head, weight gradient", Product::kWeightGrad, 256, 256, 50257},
      {"bench-16m MLP up, forward (microbatch)", Product::kForward, 2048, 256, 1024},
      {"bench-16m MLP down, input gradient", Product::kInputGrad, 256, 1024, 256},
      {"GPT-2 124M qkv, forward (microbatch)", Product::kForward, 256, 768, 2304},
      {"GPT-2 124M MLP up, weight gradient", Product::kWeightGrad, 64, 768, 3072},
      {"GPT-2 124M MLP up, input gradient", Product::kInputGrad, 64, 768, 3072},
      {"GPT-2 124M LM head, forward", Product::kForward, 64, 768, 50257},
      {"GPT-2 124M LM head, input gradient", Product::kInputGrad, 64, 768, 50257},
      {"GPT-2 124M LM head, weight gradient", Product::kWeightGrad, 64, 768, 50257},
      {"square 2048", Product::kForward, 2048, 2048, 2048},
  };
  const std::vector<cpu::GemmIsa> isas = cpu::gemm_bf16_isas();
  const cpu::GemmIsa training = cpu::gemm_isa(cpu::GemmPrecision::bf16);
  std::vector<BenchGemmRow> rows;
  for (const Shape& s : shapes) {
    const int R = s.rows, I = s.in, O = s.out;
    std::vector<float> inp(static_cast<size_t>(R) * I), w(static_cast<size_t>(O) * I), dout(static_cast<size_t>(R) * O);
    for (size_t i = 0; i < inp.size(); i++) inp[i] = static_cast<float>(i % 97) * 0.01f;
    for (size_t i = 0; i < w.size(); i++) w[i] = static_cast<float>(i % 89) * 0.01f;
    for (size_t i = 0; i < dout.size(); i++) dout[i] = static_cast<float>(i % 83) * 0.01f;
    std::vector<float> out(std::max(inp.size(), std::max(w.size(), dout.size())));
    BenchGemmRow row;
    row.name = s.name;
    for (cpu::GemmIsa isa : isas) row.bf16_paths.push_back({cpu::gemm_isa_name(isa), 0});
    // M × N × K (output rows and columns, summed dimension), anvil's operands and OpenBLAS's call.
    cpu::GemmOperand a{}, b{};
    bool accumulate = false;
    CBLAS_TRANSPOSE ta = CblasNoTrans, tb = CblasNoTrans;
    const float *pa = nullptr, *pb = nullptr;
    int lda = 0, ldb = 0;
    switch (s.product) {
      case Product::kForward:
        row.M = R, row.N = O, row.K = I;
        a = {inp.data(), I, 1}, b = {w.data(), 1, I};
        pa = inp.data(), lda = I, pb = w.data(), ldb = I, tb = CblasTrans;
        break;
      case Product::kInputGrad:
        row.M = R, row.N = I, row.K = O;
        a = {dout.data(), O, 1}, b = {w.data(), I, 1};
        pa = dout.data(), lda = O, pb = w.data(), ldb = I;
        break;
      case Product::kWeightGrad:
        row.M = O, row.N = I, row.K = R;
        a = {dout.data(), 1, O}, b = {inp.data(), I, 1};
        pa = dout.data(), lda = O, ta = CblasTrans, pb = inp.data(), ldb = I;
        accumulate = true;
        break;
    }
    const double flops = 2.0 * row.M * row.N * row.K;
    std::unique_ptr<cpu::OneDnnMatmul> onednn_fp32, onednn_bf16;
    if (cpu::onednn_available(nullptr)) {
      onednn_fp32 = std::make_unique<cpu::OneDnnMatmul>(cpu::GemmPrecision::fp32, row.M, row.N, row.K, a, b,
                                                        out.data(), accumulate);
      onednn_bf16 = std::make_unique<cpu::OneDnnMatmul>(cpu::GemmPrecision::bf16, row.M, row.N, row.K, a, b,
                                                        out.data(), accumulate);
      row.onednn_bf16_kernel = onednn_bf16->implementation();
    }
    for (int round = 0; round < rounds; round++) {
      row.openblas = std::max(row.openblas, cpu::best_gflops(flops, min_seconds, 2, [&] {
        cblas_sgemm(CblasRowMajor, ta, tb, row.M, row.N, row.K, 1.0f, pa, lda, pb, ldb, accumulate ? 1.0f : 0.0f,
                    out.data(), row.N);
      }));
      row.anvil_fp32 = std::max(row.anvil_fp32, cpu::best_gflops(flops, min_seconds, 2, [&] {
        cpu::parallel_gemm(cpu::GemmPrecision::fp32, row.M, row.N, row.K, a, b, out.data(), row.N, accumulate);
      }));
      if (onednn_fp32) {
        const double fp32 = cpu::best_gflops(flops, min_seconds, 2, [&] { onednn_fp32->run(); });
        const double bf16 = cpu::best_gflops(flops, min_seconds, 2, [&] { onednn_bf16->run(); });
        row.onednn_fp32 = std::max(row.onednn_fp32, fp32), row.onednn_bf16 = std::max(row.onednn_bf16, bf16);
      }
      for (size_t p = 0; p < isas.size(); p++)
        row.bf16_paths[p].gflops = std::max(row.bf16_paths[p].gflops, cpu::best_gflops(flops, min_seconds, 2, [&] {
          cpu::parallel_gemm(cpu::GemmPrecision::bf16, row.M, row.N, row.K, a, b, out.data(), row.N, accumulate,
                             isas[p]);
        }));
    }
    for (size_t p = 0; p < isas.size(); p++)
      if (isas[p] == training) row.anvil_bf16 = row.bf16_paths[p].gflops;
    rows.push_back(row);
  }
  return rows;
}

std::string bench_gemm_bf16_training_isa() { return cpu::gemm_isa_name(cpu::gemm_isa(cpu::GemmPrecision::bf16)); }

std::string bench_gemm_onednn_missing() {
  std::string why;
  cpu::onednn_available(&why);
  return why;
}

}  // namespace anvil
