// `anvil bench train`: the trainer's own step on synthetic tokens, so the benchmark measures
// exactly what training runs.
#include "train/bench.h"

#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "device/device.h"
#include "kernels/impl.h"
#include "kernels/matmul.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"
#include "train/microbatch.h"
#include "train/stack.h"
#include "train/step.h"

namespace anvil {

BenchTrainResult bench_train(const TrainConfig& config, int warmup_steps, int steps, bool profile) {
  ANVIL_CHECK(steps > 0 && warmup_steps >= 0, "--steps must be positive and --warmup not negative");
  TrainConfig cfg = config;  // with the batch sizes and microbatch resolved
  prepare_kernel_impl(cfg.kernels, 0);
  const int T = cfg.max_seq_len;
  const int sharing = cfg.distributed.tensor_parallel, stages = cfg.distributed.pipeline_parallel;
  const int expert_ranks = cfg.distributed.expert_parallel;
  const int ranks = sharing * stages * expert_ranks;
  std::unique_ptr<Communicator> comm = make_communicator(/*require_mpi=*/false, /*threads_at_once=*/ranks > 1);
  ANVIL_CHECK(comm->size() == ranks, "bench train runs one copy of the model: on one process, or under mpirun on as "
              "many ranks as distributed.tensor_parallel × distributed.pipeline_parallel × "
              "distributed.expert_parallel ({} × {} × {}) to share it; {} ranks here (anvil train runs data-parallel "
              "copies)", sharing, stages, expert_ranks, comm->size());
  // The groups as anvil train forms them: pipeline stages, then the ranks sharing each stage (its
  // blocks, or its experts).
  std::unique_ptr<PipelineGroups> pipeline;
  if (stages > 1) pipeline = std::make_unique<PipelineGroups>(make_pipeline_groups(*comm, cfg.model, stages));
  Communicator& stage_ranks = pipeline ? *pipeline->data : *comm;
  std::unique_ptr<TensorGroups> tensor;
  if (sharing > 1)
    tensor = std::make_unique<TensorGroups>(make_tensor_groups(stage_ranks, cfg.model, sharing));
  std::unique_ptr<ExpertGroups> experts;
  if (expert_ranks > 1)
    experts = std::make_unique<ExpertGroups>(make_expert_groups(stage_ranks, cfg.model, expert_ranks));
  // The ranks that split the batch (the experts' ranks each take a block of it, as in training),
  // and those holding the same parameters.
  Communicator& data = tensor ? *tensor->data : stage_ranks;
  Communicator& holders = experts ? *experts->data : data;
  resolve_batch_sizes(cfg, data.size());
  cfg.device_eval_batch_size = 0;  // no evaluation here: activations for the microbatch alone
  const int GB = cfg.global_train_batch_size;
  ANVIL_CHECK(GB % data.size() == 0, "global_train_batch_size {} is not divisible by the {} ranks sharing the "
              "experts: each takes an equal block of the batch", GB, data.size());
  const int local_batch = GB / data.size();
  TrainingStack stack = build_training_stack(cfg, holders, local_batch, T, [&](Model& model) {
    // A base from the seed: the speed and memory are those of any base.
    std::vector<float> whole(model_num_params(cfg.model.base()));
    model_init_params(model_param_layout(cfg.model.base()), cfg.seed, 0, whole.size(), whole.data());
    std::vector<float> base(model_num_params(model.config().base()));
    take_share(cfg.model.base(), model.config().base(), whole.data(), base.data());
    model.set_base_weights(base, cfg.precision == ComputeDtype::kBf16);
  }, pipeline.get(), tensor.get(), experts.get());
  Model& model = *stack.model;
  DataParallel& dp = *stack.dp;
  const MemoryReport mem = dp.memory();
  dp.init_weights(cfg.seed);
  TrainStep step(cfg, model, dp, data, LrSchedule::constant(), stack.pipeline.get());

  // Synthetic data: uniform random tokens, the next-token targets of a random stream.
  std::vector<int32_t> stream(static_cast<size_t>(GB) * T + 1);
  Rng rng(cfg.seed, 1);
  for (auto& x : stream) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.model.vocab_size)));
  const size_t block = static_cast<size_t>(data.rank()) * local_batch * T;  // this rank's sequences
  std::vector<int32_t> tokens(stream.begin() + block, stream.begin() + block + static_cast<size_t>(local_batch) * T),
      targets(stream.begin() + block + 1, stream.begin() + block + static_cast<size_t>(local_batch) * T + 1);

  BenchTrainResult r;
  r.peak_gflops = matmul_peak_gflops(cfg.kernels, cfg.precision);
  r.peak_source = matmul_backend_description(cfg.kernels);
  r.activation_mib = static_cast<double>(stack.pipeline ? stack.pipeline->activation_bytes()
                                                        : model.activation_bytes()) / (1 << 20);
  r.model_states_mib = static_cast<double>(mem.model_states()) / (1 << 20);
  r.frozen_base_mib = static_cast<double>(model.base_bytes()) / (1 << 20);
  r.microbatch = cfg.device_train_microbatch_size;
  r.ranks = ranks;
  r.rank = comm->rank();
  r.tensor_parallel = sharing;
  r.pipeline_parallel = stages;
  r.expert_parallel = expert_ranks;
  r.bubble = pipeline_bubble(stages, (local_batch + r.microbatch - 1) / r.microbatch);
  if (comm->rank() == 0)
    log_info("bench train: {}; seq {}, batch {} (microbatch {}), {:.2f}M parameters{}; {}; {} kernels, {}{}",
             model_architecture_summary(cfg.model), T, GB, cfg.device_train_microbatch_size,
             model_num_params(cfg.model) / 1e6,
             ranks > 1 ? fmt::format(" shared by {} ranks", ranks) : "", r.peak_source, choice_name(cfg.kernels),
             choice_name(cfg.precision), cfg.activation_checkpointing ? "; activation checkpointing" : "");
  for (int i = 0; i < warmup_steps; i++) step.run(tokens.data(), targets.data(), local_batch, T, i);
  if (profile) op_profile_start();
  // The timed steps alone are what a GPU profiler started with collection off records
  // (bench/gpu_kernel_times.sh).
  const bool gpu = cfg.kernels == KernelImpl::kGpu;
  if (gpu) gpu_profiler_start();
  const int64_t exchanged = experts ? experts->experts->bytes_sent() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; i++) {
    const StepResult s = step.run(tokens.data(), targets.data(), local_batch, T, warmup_steps + i);
    r.final_loss = s.loss;
    r.steps_run_again += s.ran_again;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (gpu) gpu_profiler_stop();
  if (profile) r.profile = op_profile_stop();
  if (experts)
    r.all_to_all_mib = static_cast<double>(sum_exact(*comm, experts->experts->bytes_sent() - exchanged)) / steps /
                       (1 << 20);
  r.step_ms = 1e3 * secs / steps;
  r.tokens_per_s = static_cast<double>(GB) * T * steps / secs;
  r.gflops = r.tokens_per_s * model_train_flops_per_token(cfg.model, T) / 1e9;
  r.mfu = r.gflops / (r.peak_gflops * ranks);  // each rank measured its own peak
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  r.peak_rss_mib = static_cast<double>(u.ru_maxrss) / 1024.0;
  if (gpu) r.gpu_peak_mib = static_cast<double>(gpu_allocator_stats().peak_in_use) / (1 << 20);
  const std::vector<double> rss = all_gather_values(*comm, r.peak_rss_mib),
                            act = all_gather_values(*comm, r.activation_mib),
                            states = all_gather_values(*comm, r.model_states_mib);
  for (size_t k = 0; k < rss.size(); k++) r.per_rank.push_back({rss[k], act[k], states[k]});
  return r;
}

std::string bench_train_json(const TrainConfig& cfg, const BenchTrainResult& r, int steps) {
  const ModelConfig& m = cfg.model;
  auto norm = [&] { return m.norm == NormKind::kRmsNorm ? "rmsnorm" : "layernorm"; };
  auto positions = [&] {
    switch (m.positions) {
      case PositionKind::kLearned: return "learned";
      case PositionKind::kAlibi: return "alibi";
      case PositionKind::kRope: return "rope";
      case PositionKind::kNone: break;
    }
    return "none";
  };
  auto mlp = [&] {
    switch (m.mlp) {
      case MlpKind::kGeluTanh: return "gelu_tanh";
      case MlpKind::kGeluErf: return "gelu_erf";
      case MlpKind::kSwiglu: break;
    }
    return "swiglu";
  };
  nlohmann::ordered_json j = {
      {"tokens_per_s", r.tokens_per_s}, {"gflops", r.gflops}, {"peak_gflops", r.peak_gflops}, {"mfu", r.mfu},
      {"peak_rss_mib", r.peak_rss_mib}, {"activation_mib", r.activation_mib},
      {"model_states_mib", r.model_states_mib}, {"frozen_base_mib", r.frozen_base_mib},
      {"gpu_peak_mib", r.gpu_peak_mib},
      {"microbatch", r.microbatch}, {"tensor_parallel", r.tensor_parallel}, {"pipeline_parallel", r.pipeline_parallel},
      {"bubble", r.bubble}, {"expert_parallel", r.expert_parallel}, {"all_to_all_mib", r.all_to_all_mib},
      {"steps", steps}, {"steps_run_again", r.steps_run_again}, {"seq_len", cfg.max_seq_len},
      {"batch", cfg.global_train_batch_size}, {"precision", choice_name(cfg.precision)},
      {"kernels", choice_name(cfg.kernels)},
      {"model",
       {{"family", choice_name(m.name)}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads},
        {"n_kv_heads", m.kv_heads()}, {"head_dim", m.head_size()}, {"d_model", m.d_model}, {"vocab_size", m.vocab_size}, {"norm", norm()},
        {"norm_bias", m.norm_bias}, {"norm_eps", float_as_written(m.norm_eps)}, {"qk_norm", m.qk_norm == QkNorm::kWhole ? "whole" : m.qk_norm == QkNorm::kPerHead ? "per_head" : "none"}, {"positions", positions()},
        {"rope_theta", float_as_written(m.rope.theta)}, {"alibi_bias_max", float_as_written(m.alibi_bias_max)}, {"mlp", mlp()},
        {"mlp_hidden", m.mlp_width()}, {"linear_bias", m.linear_bias}, {"qkv_bias", m.qkv_bias}, {"tied_embeddings", m.tied_embeddings},
        {"init_std", float_as_written(m.init_std)}, {"emb_pdrop", float_as_written(m.emb_pdrop)},
        {"attn_pdrop", float_as_written(m.attn_pdrop)}, {"resid_pdrop", float_as_written(m.resid_pdrop)}}}};
  if (r.ranks > 1)
    for (const BenchTrainResult::RankMemory& k : r.per_rank)
      j["per_rank"].push_back({{"peak_rss_mib", k.peak_rss_mib}, {"activation_mib", k.activation_mib},
                               {"model_states_mib", k.model_states_mib}});
  if (m.has_moe())
    j["model"]["moe"] = {{"experts", m.moe.experts},
                         {"top_k", m.moe.top_k},
                         {"capacity_factor", float_as_written(m.moe.capacity_factor)},
                         {"normalize_p", float_as_written(m.moe.normalize_p)},
                         {"loss_weight", float_as_written(m.moe.loss_weight)}};
  return j.dump();
}

}  // namespace anvil
