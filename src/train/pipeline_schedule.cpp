#include "train/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"
#include "model/tensor_parallel.h"
#include "parallel/collectives.h"

namespace anvil {
namespace {
// Tags of the stages' messages, apart from the collectives' (parallel/collectives.cpp).
constexpr int kTagActivations = 0x5a01, kTagActivationGrads = 0x5a02;
}  // namespace

double pipeline_bubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / (microbatches + stages - 1);
}

PipelineSchedule::PipelineSchedule(const PipelineGroups& groups, std::vector<std::unique_ptr<Model>> slots,
                                   Model& first_slot, DataParallel& dp)
    : groups_(groups), comm_(*groups.pipeline), dp_(dp), owned_(std::move(slots)) {
  slots_.push_back(&first_slot);
  for (auto& m : owned_) {
    m->set_unit_access(&dp);
    slots_.push_back(m.get());
  }
  inputs_.resize(slots_.size());
  output_grads_.resize(slots_.size());
  outputs_.resize(slots_.size());
  input_grads_.resize(slots_.size());
}

PipelineSchedule::~PipelineSchedule() {
  for (std::vector<Outbox>* boxes : {&outputs_, &input_grads_})
    for (Outbox& box : *boxes)
      if (box.pending) new std::vector<float>(std::move(box.rows));  // left to MPI, on purpose
}

void PipelineSchedule::set_compute_dtype(ComputeDtype dtype) {
  for (size_t k = 1; k < slots_.size(); k++) slots_[k]->set_compute_dtype(dtype);  // the first: TrainStep's
}

void PipelineSchedule::share_from_last(void* data, size_t bytes) { broadcast(comm_, data, bytes, groups_.stages - 1); }

void PipelineSchedule::sum_over_stages(int64_t* counts, size_t n) { all_reduce(comm_, counts, n); }

size_t PipelineSchedule::activation_bytes() const {
  size_t bytes = 0;
  for (const Model* m : slots_) bytes += m->activation_bytes();
  return bytes;
}

size_t PipelineSchedule::crossing_floats(int rows) const {
  const ModelConfig& cfg = slots_[0]->config();
  return static_cast<size_t>(tensor_held_rows(cfg, cfg.tensor_rank, rows).n) * cfg.d_model;
}

void PipelineSchedule::receive(std::vector<float>& rows, size_t n, int peer, int tag, const char* what) {
  rows.resize(std::max(rows.size(), n));
  PeerRequest r = comm_.irecv(rows.data(), n * sizeof(float), peer, tag);
  comm_.wait_all(&r, 1, what);
}

float* PipelineSchedule::ready(Outbox& box, size_t n) {
  if (box.pending) comm_.wait_all(&box.send, 1, "pipeline: a send to a neighbouring stage");
  box.pending = false;
  box.rows.resize(std::max(box.rows.size(), n));
  return box.rows.data();
}

void PipelineSchedule::post(Outbox& box, size_t n, int peer, int tag) {
  box.send = comm_.isend(box.rows.data(), n * sizeof(float), peer, tag);
  box.pending = true;
}

void PipelineSchedule::finish_sends() {
  for (std::vector<Outbox>* boxes : {&outputs_, &input_grads_})
    for (Outbox& box : *boxes) ready(box, 0);
}

void PipelineSchedule::train(const int32_t* tokens, const int32_t* targets, const int32_t* positions, int B, int T,
                             int microbatch, float dloss, const Model::DropoutPosition& at, const TakeLosses& take,
                             const TakeMoeStats& take_moe) {
  const int P = groups_.stages, s = groups_.stage;
  const bool first = groups_.first(), last = groups_.last();
  const int M = (B + microbatch - 1) / microbatch;
  const int K = static_cast<int>(slots_.size());
  const int warmup = std::min(P - s - 1, M);
  ANVIL_CHECK(std::min(P - s, M) <= K, "stage {} holds {} microbatches at once, and has models for {}", s,
              std::min(P - s, M), K);
  auto rows_of = [&](int i) { return crossing_floats(std::min(microbatch, B - i * microbatch) * T); };
  auto forward = [&](int i) {
    const int k = i % K, b0 = i * microbatch, n = std::min(microbatch, B - b0);
    const size_t rows = rows_of(i), at_token = static_cast<size_t>(b0) * T;
    Model& m = *slots_[k];
    if (!first) receive(inputs_[k], rows, s - 1, kTagActivations, "pipeline: activations from the previous stage");
    float* out = last ? nullptr : ready(outputs_[k], rows);
    m.set_dropout_position({at.seed, at.step, at.first_sample + b0});
    m.stage_forward(first ? tokens + at_token : nullptr, positions ? positions + at_token : nullptr,
                    first ? nullptr : inputs_[k].data(), n, T, targets + at_token, out);
    if (!last) post(outputs_[k], rows, s + 1, kTagActivations);
  };
  auto backward = [&](int i) {
    const int k = i % K, b0 = i * microbatch, n = std::min(microbatch, B - b0);
    const size_t rows = rows_of(i), at_token = static_cast<size_t>(b0) * T;
    Model& m = *slots_[k];
    if (!last)
      receive(output_grads_[k], rows, s + 1, kTagActivationGrads, "pipeline: gradients from the next stage");
    float* din = first ? nullptr : ready(input_grads_[k], rows);
    dp_.begin_microbatch(i == M - 1);
    const double sum = m.stage_backward(last ? targets + at_token : nullptr, dloss,
                                        last ? nullptr : output_grads_[k].data(), din, nullptr);
    if (last) take(m.losses(), n, sum);
    if (m.config().has_moe()) take_moe(m.moe_stats());
    if (!first) post(input_grads_[k], rows, s - 1, kTagActivationGrads);
  };
  for (int i = 0; i < warmup; i++) forward(i);
  for (int i = warmup; i < M; i++) {
    forward(i);
    backward(i - warmup);
  }
  for (int i = M - warmup; i < M; i++) backward(i);
  finish_sends();
}

void PipelineSchedule::evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, const TakeLosses& take) {
  const int s = groups_.stage;
  const bool first = groups_.first(), last = groups_.last();
  const size_t rows = crossing_floats(B * T);
  Model& m = *slots_[0];
  if (!first) receive(inputs_[0], rows, s - 1, kTagActivations, "pipeline: activations from the previous stage");
  float* out = last ? nullptr : ready(outputs_[0], rows);
  m.stage_forward(first ? tokens : nullptr, nullptr, first ? nullptr : inputs_[0].data(), B, T, nullptr, out);
  if (!last) post(outputs_[0], rows, s + 1, kTagActivations);
  if (last) {
    const double sum = m.stage_loss(targets, nullptr);
    take(m.losses(), B, sum);
  }
  finish_sends();
}

}  // namespace anvil
