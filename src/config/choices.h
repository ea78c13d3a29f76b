// The closed sets of values a config chooses between, each with its names in one table: the
// config reads a name once into the enum (an unknown name is an error listing the valid ones)
// and writes the name back; the code reads the enum. Header only. Enums that modules below the
// config's parser use (ComputeDtype, KernelImpl) live in core; their names are here.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/kernel_impl.h"
#include "core/rope.h"

namespace anvil {

// The model's family (`model.name`): which architecture options the config fills in
// (config/families/) and under which names they are read; one decoder builds them all.
enum class ModelFamily { kGpt2, kMpt, kLlama, kMistral, kMixtral, kQwen2, kQwen3, kQwen3Moe };
enum class OptimizerKind {
  kDecoupledAdamW,  // Composer's: p -= (lr / optimizer.lr)·wd·p, weight_decay not scaled by the lr
  kAdamW,           // PyTorch's: p -= lr·wd·p
};
// Composer's schedules (LLM Foundry's names), then DeepSpeed's (a ds_config's scheduler types).
enum class SchedulerKind {
  kConstant,
  kConstantWithWarmup,
  kCosineWithWarmup,
  kLinearDecayWithWarmup,
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kOneCycle,
};
enum class WarmupType { kLog, kLinear };  // DeepSpeed's warmup_type
enum class SaveFailure { kStop, kContinue };  // what a checkpoint that cannot be written does
// A loader's `name`: packed pretraining text, or fine-tuning examples (config/finetuning_config.h).
enum class LoaderKind { kText, kFinetuning };
enum class TooLong { kTruncate, kDrop };  // what a fine-tuning example longer than max_seq_len becomes
// parallel/collectives.h describes the algorithms.
enum class AllReduceAlgo { kAuto, kRing, kRecursiveDoubling, kRankOrdered };
enum class GradCompression { kNone, kBf16 };
// Under kernels=gpu: NCCL/RCCL, or host copies around anvil's collectives (parallel/op_collectives.h).
enum class GpuCollectivesChoice { kAuto, kNccl, kHost };
// Where ZeRO-Offload keeps the optimizer states or the parameters (DeepSpeed's offload device).
enum class OffloadDevice { kNone, kCpu };
// The values the optimizer keeps (master weights, moments): fp32, or rounded to bf16 after every step
// as DeepSpeed's bf16_master_weights_and_grads / bf16_optimizer_states keep them.
enum class StateDtype { kFp32, kBf16 };

// Choices<E>::names: every value of E with the name configs spell it.
template <class E>
struct Choices;
template <>
struct Choices<ModelFamily> {
  static constexpr std::pair<ModelFamily, const char*> names[] = {
      {ModelFamily::kGpt2, "gpt2"},
      {ModelFamily::kMpt, "mpt_causal_lm"},
      {ModelFamily::kLlama, "llama"},
      {ModelFamily::kMistral, "mistral"},
      {ModelFamily::kMixtral, "mixtral"},
      {ModelFamily::kQwen2, "qwen2"},
      {ModelFamily::kQwen3, "qwen3"},
      {ModelFamily::kQwen3Moe, "qwen3_moe"}};
};
template <>
struct Choices<RopeScalingKind> {  // transformers' rope_scaling.rope_type
  static constexpr std::pair<RopeScalingKind, const char*> names[] = {
      {RopeScalingKind::kNone, "default"}, {RopeScalingKind::kLinear, "linear"}, {RopeScalingKind::kLlama3, "llama3"}};
};
template <>
struct Choices<ComputeDtype> {  // the `precision` key
  static constexpr std::pair<ComputeDtype, const char*> names[] = {
      {ComputeDtype::kFp32, "fp32"}, {ComputeDtype::kBf16, "amp_bf16"}, {ComputeDtype::kFp16, "amp_fp16"}};
};
template <>
struct Choices<KernelImpl> {
  static constexpr std::pair<KernelImpl, const char*> names[] = {
      {KernelImpl::kCpu, "cpu"}, {KernelImpl::kGpu, "gpu"}, {KernelImpl::kRef, "ref"}};
};
template <>
struct Choices<OptimizerKind> {
  static constexpr std::pair<OptimizerKind, const char*> names[] = {{OptimizerKind::kDecoupledAdamW, "decoupled_adamw"},
                                                                    {OptimizerKind::kAdamW, "adamw"}};
};
template <>
struct Choices<SchedulerKind> {
  static constexpr std::pair<SchedulerKind, const char*> names[] = {
      {SchedulerKind::kConstant, "constant"},
      {SchedulerKind::kConstantWithWarmup, "constant_with_warmup"},
      {SchedulerKind::kCosineWithWarmup, "cosine_with_warmup"},
      {SchedulerKind::kLinearDecayWithWarmup, "linear_decay_with_warmup"},
      {SchedulerKind::kWarmupLR, "WarmupLR"},
      {SchedulerKind::kWarmupDecayLR, "WarmupDecayLR"},
      {SchedulerKind::kWarmupCosineLR, "WarmupCosineLR"},
      {SchedulerKind::kOneCycle, "OneCycle"}};
};
template <>
struct Choices<LoaderKind> {
  static constexpr std::pair<LoaderKind, const char*> names[] = {{LoaderKind::kText, "text"},
                                                                 {LoaderKind::kFinetuning, "finetuning"}};
};
template <>
struct Choices<TooLong> {
  static constexpr std::pair<TooLong, const char*> names[] = {{TooLong::kTruncate, "truncate"},
                                                              {TooLong::kDrop, "drop"}};
};
template <>
struct Choices<SaveFailure> {
  static constexpr std::pair<SaveFailure, const char*> names[] = {{SaveFailure::kStop, "stop"},
                                                                  {SaveFailure::kContinue, "continue"}};
};
template <>
struct Choices<WarmupType> {
  static constexpr std::pair<WarmupType, const char*> names[] = {{WarmupType::kLog, "log"},
                                                                 {WarmupType::kLinear, "linear"}};
};
template <>
struct Choices<AllReduceAlgo> {
  static constexpr std::pair<AllReduceAlgo, const char*> names[] = {
      {AllReduceAlgo::kAuto, "auto"},
      {AllReduceAlgo::kRing, "ring"},
      {AllReduceAlgo::kRecursiveDoubling, "recursive_doubling"},
      {AllReduceAlgo::kRankOrdered, "rank_ordered"}};
};
template <>
struct Choices<GradCompression> {
  static constexpr std::pair<GradCompression, const char*> names[] = {{GradCompression::kNone, "none"},
                                                                      {GradCompression::kBf16, "bf16"}};
};
template <>
struct Choices<GpuCollectivesChoice> {
  static constexpr std::pair<GpuCollectivesChoice, const char*> names[] = {{GpuCollectivesChoice::kAuto, "auto"},
                                                                           {GpuCollectivesChoice::kNccl, "nccl"},
                                                                           {GpuCollectivesChoice::kHost, "host"}};
};
template <>
struct Choices<OffloadDevice> {
  static constexpr std::pair<OffloadDevice, const char*> names[] = {{OffloadDevice::kNone, "none"},
                                                                    {OffloadDevice::kCpu, "cpu"}};
};

template <>
struct Choices<StateDtype> {
  static constexpr std::pair<StateDtype, const char*> names[] = {{StateDtype::kFp32, "fp32"},
                                                                 {StateDtype::kBf16, "bf16"}};
};

template <class E>
const char* choice_name(E value) {
  for (const auto& [v, name] : Choices<E>::names)
    if (v == value) return name;
  return "?";
}

// The value named name; false when none is.
template <class E>
bool parse_choice(std::string_view name, E* out) {
  for (const auto& [v, n] : Choices<E>::names)
    if (name == n) {
      *out = v;
      return true;
    }
  return false;
}

// "a, b or c", for errors.
inline std::string or_list(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); i++) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return list;
}

// E's names as or_list writes them.
template <class E>
std::string choice_list() {
  std::vector<std::string> names;
  for (const auto& [v, name] : Choices<E>::names) names.push_back(name);
  return or_list(names);
}

}  // namespace anvil
