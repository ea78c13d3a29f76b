// A mixture of experts' MLP in the decoder's blocks (ModelConfig::moe): the router, the routes
// with their capacity, the experts' products and the combination, forward and backward; under
// expert parallelism (set_expert_exchange) the experts' rows cross to the ranks that hold them.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/round.h"
#include "model/decoder.h"

namespace anvil {

Decoder::MoeRoutes Decoder::moe_routes(int l) {
  const size_t n = static_cast<size_t>(max_batch_) * max_seq_ * cfg_.moe.top_k;
  int32_t* base = moe_routes_memory_.data() + layer_slot(l) * 7 * n;
  return {base, base + n, base + 2 * n, base + 3 * n, base + 4 * n, base + 5 * n, base + 6 * n};
}

void Decoder::moe_assign_slots(int l) {
  const int B = B_, T = T_, E = cfg_.moe.experts, k = cfg_.moe.top_k, G = grain_sequences();
  const size_t Nk = static_cast<size_t>(B) * T * k;
  const MoeRoutes r = moe_routes(l);
  MoeHostRoutes& h = moe_host_[layer_slot(l)];
  int32_t* experts = moe_scratch_.data();
  int32_t *slots = experts + Nk, *slot_tokens = slots + Nk, *slot_choices = slot_tokens + Nk,
          *grain_slots = slot_choices + Nk, *grain_tokens = grain_slots + Nk, *grain_choices = grain_tokens + Nk;
  op_copy_to_host(kernels(), experts, r.experts, Nk * sizeof(int32_t));
  // Each sequence's choices of each expert, and what the expert takes of them: MegaBlocks'
  // truncated capacity, where 0 (a short sequence) means none. It is a max_seq_len sequence's (a
  // training sequence's) in every pass, so that an evaluation's sequence is routed alike whatever
  // length its batch is padded to.
  long capacity = std::numeric_limits<long>::max();
  if (cfg_.moe.capacity_factor > 0) {
    const long c = static_cast<long>(cfg_.moe.capacity_factor * k * cfg_.max_seq_len / E);
    if (c > 0) capacity = c;
  }
  h.choices.assign(static_cast<size_t>(B) * E, 0);
  for (size_t i = 0; i < Nk; i++) h.choices[i / (static_cast<size_t>(T) * k) * E + experts[i]]++;
  h.segment.assign(static_cast<size_t>(E) * (B + 1), 0);
  int32_t next = 0;
  for (int e = 0; e < E; e++) {
    for (int b = 0; b < B; b++) {
      h.segment[static_cast<size_t>(e) * (B + 1) + b] = next;
      next += static_cast<int32_t>(std::min<long>(h.choices[static_cast<size_t>(b) * E + e], capacity));
    }
    h.segment[static_cast<size_t>(e) * (B + 1) + B] = next;
  }
  const int32_t n_slots = next;
  std::vector<int32_t> taken(static_cast<size_t>(E) * B, 0);
  int64_t skipped = 0;
  for (int b = 0; b < B; b++)
    for (size_t i = static_cast<size_t>(b) * T * k; i < static_cast<size_t>(b + 1) * T * k; i++) {
      const int e = experts[i];
      int32_t& used = taken[static_cast<size_t>(e) * B + b];
      if (used >= capacity) {
        slots[i] = -1;
        skipped++;
        continue;
      }
      const int32_t s = h.segment[static_cast<size_t>(e) * (B + 1) + b] + used++;
      slots[i] = s;
      slot_tokens[s] = static_cast<int32_t>(i / k);
      slot_choices[s] = static_cast<int32_t>(i % k);
    }
  // The grains' packing: grain from b0, expert by expert, its sequences' slots in order.
  std::vector<int32_t> packed_of(n_slots);
  for (int b0 = 0; b0 < B; b0 += G) {
    const int b1 = std::min(B, b0 + G);
    int32_t q = 0;
    for (int e = 0; e < E; e++)
      for (int32_t s = h.segment[static_cast<size_t>(e) * (B + 1) + b0];
           s < h.segment[static_cast<size_t>(e) * (B + 1) + b1]; s++, q++) {
        packed_of[s] = q;
        const size_t at = static_cast<size_t>(b0) * T * k + q;
        grain_tokens[at] = slot_tokens[s] - b0 * T;
        grain_choices[at] = slot_choices[s];
      }
  }
  for (size_t i = 0; i < Nk; i++) grain_slots[i] = slots[i] < 0 ? -1 : packed_of[slots[i]];
  if (training_ && !recomputing_) {
    moe_stats_.choices += static_cast<int64_t>(Nk);
    moe_stats_.skipped += skipped;
  }
  op_copy_from_host(kernels(), r.slots, slots, Nk * sizeof(int32_t));
  op_copy_from_host(kernels(), r.slot_tokens, slot_tokens, static_cast<size_t>(n_slots) * sizeof(int32_t));
  op_copy_from_host(kernels(), r.slot_choices, slot_choices, static_cast<size_t>(n_slots) * sizeof(int32_t));
  op_copy_from_host(kernels(), r.grain_slots, grain_slots, Nk * sizeof(int32_t));
  op_copy_from_host(kernels(), r.grain_slot_tokens, grain_tokens, Nk * sizeof(int32_t));
  op_copy_from_host(kernels(), r.grain_slot_choices, grain_choices, Nk * sizeof(int32_t));
}

void Decoder::expert_products(const float* weights, int e, float* out, const float* inp, int in_w, int out_w,
                              const int32_t* bounds, int runs) {
  const float* w = weights + static_cast<size_t>(e) * in_w * out_w;
  auto run = [&](int32_t s0, int32_t s1) {
    if (s1 > s0)
      matmul_forward(matmul_, out + static_cast<size_t>(s0) * out_w, inp + static_cast<size_t>(s0) * in_w, w, nullptr,
                     s1 - s0, in_w, out_w);
  };
  if (!microbatch_invariant() || matmul_rows_independent(kernels())) return run(bounds[0], bounds[runs]);
  for (int i = 0; i < runs; i++) run(bounds[i], bounds[i + 1]);
}

void Decoder::moe_forward(int l, const BlockActs& x, const Block& p, const float* adapters, float* out) {
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, E = cfg_.moe.experts, k = cfg_.moe.top_k;
  const Widths w(cfg_);
  ANVIL_CHECK(!cfg_.expert_share() || expert_parallel(), "a share of the experts (expert_share_config) runs with "
              "the exchange to the ranks holding the others: set_expert_exchange first");
  linear_forward(l, linear(p, BlockProduct::kRouter), acts_.router_logits, x.ln2, adapters);
  const MoeRoutes r = moe_routes(l);
  moe_route(kernels(), x.probs, r.experts, x.route_weights, acts_.router_logits, N, E, k, cfg_.moe.normalize_p);
  moe_assign_slots(l);
  const MoeHostRoutes& h = moe_host_[layer_slot(l)];
  const long S = h.segment.back();
  gather_rows(kernels(), acts_.expert_in, x.ln2, r.slot_tokens, S, C);
  if (expert_parallel()) {
    experts_exchanged_forward(l, x, p);
  } else {
    auto segments = [&](int e) { return h.segment.data() + static_cast<size_t>(e) * (B + 1); };
    for (int e = 0; e < E; e++) expert_products(p.fcw, e, x.fch, acts_.expert_in, C, w.fc, segments(e), B);
    round_to_dtype(kernels(), x.fch, S * w.fc, dtype());
    mlp_activation(acts_.fch_gelu, x.fch, static_cast<int>(S));
    for (int e = 0; e < E; e++)
      expert_products(p.fcprojw, e, x.expert_out, acts_.fch_gelu, w.hidden, C, segments(e), B);
    round_to_dtype(kernels(), x.expert_out, S * C, dtype());
  }
  moe_combine(kernels(), out, x.expert_out, r.slots, x.route_weights, N, k, C, false);
  round_to_dtype(kernels(), out, static_cast<long>(N) * C, dtype());
  if (!training_ || recomputing_) return;
  // The balancing loss, a sequence at a time: loss_weight · E/(k·T²) · Σ_e n_e · Σ_t p_te, once
  // per target of the sequence (as the cross-entropy counts), averaged over the layers.
  op_copy_to_host(kernels(), moe_probs_host_.data(), x.probs, static_cast<size_t>(N) * E * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int e = 0; e < E; e++) {
      double p_sum = 0;
      for (int t = 0; t < T; t++) p_sum += moe_probs_host_[(static_cast<size_t>(b) * T + t) * E + e];
      moe_stats_.balance[static_cast<size_t>(l - stage().first_layer) * B + b] +=
          balance_scale(b) * h.choices[static_cast<size_t>(b) * E + e] * p_sum;
    }
}

double Decoder::balance_scale(int b) const {
  const double k = cfg_.moe.top_k, T = T_;
  return static_cast<double>(cfg_.moe.loss_weight) * cfg_.moe.experts * sequence_targets_[b] /
         (k * T * T * cfg_.n_layers);
}

float* Decoder::weight_grads(int l, const Block& p, const float* w, size_t n) {
  return frozen() ? nullptr : units_in_stage_.grads(1 + l, static_cast<size_t>(w - p.ln1w), n, 1);
}

void Decoder::weight_grads_done(int l, const Block& p, const float* w, size_t n) {
  if (!frozen()) units_in_stage_.grain_done(1 + l, static_cast<size_t>(w - p.ln1w), n, 1);
}

void Decoder::moe_backward(int l, const BlockActs& x, const Block& p, const float* adapters, const float* dout,
                           float* dinp, int b, int n) {
  const int T = T_, B = B_, C = cfg_.d_model, E = cfg_.moe.experts, k = cfg_.moe.top_k, Ng = n * T;
  const Widths w(cfg_);
  const size_t t0 = static_cast<size_t>(b) * T, F = w.hidden, FC = w.fc;
  const MoeRoutes r = moe_routes(l);
  const MoeHostRoutes& h = moe_host_[layer_slot(l)];
  auto segment = [&](int e, int at) { return h.segment[static_cast<size_t>(e) * (B + 1) + at]; };
  const float* droute_weights = droute_weights_;
  if (expert_parallel()) {
    // The experts' part ran over the microbatch (experts_exchanged_backward).
    moe_combine(kernels(), dinp, ep_dexpert_in_.data(), r.slots + t0 * k, nullptr, Ng, k, C, false);
    droute_weights = ep_droute_weights_.data() + t0 * k;
  } else {
    long Sg = 0;  // the grain's slots
    for (int e = 0; e < E; e++) Sg += segment(e, b + n) - segment(e, b);
    moe_combine_backward(kernels(), dexpert_out_, droute_weights_, dout, x.expert_out, r.slots + t0 * k,
                         r.grain_slot_tokens + t0 * k, r.grain_slot_choices + t0 * k, x.route_weights + t0 * k, Ng,
                         k, C, Sg);
    round_to_dtype(kernels(), dexpert_out_, Sg * C, dtype());
    long q = 0;  // the expert's first row in the grain's packing
    for (int e = 0; e < E; e++) {
      const int32_t s0 = segment(e, b), rows = segment(e, b + n) - s0;
      if (rows == 0) continue;
      const float* fch = x.fch + s0 * FC;
      float* act = acts_.fch_gelu + q * F;  // recomputed, as the dense MLP's
      mlp_activation(act, fch, rows);
      const float* w2 = p.fcprojw + static_cast<size_t>(e) * C * F;
      matmul_backward(matmul_, dbig_ + q * F, weight_grads(l, p, w2, C * F), nullptr, dexpert_out_ + q * C, C, act,
                      w2, rows, F, C, false);
      weight_grads_done(l, p, w2, C * F);
      round_to_dtype(kernels(), dbig_ + q * F, rows * F, dtype());
      mlp_activation_backward(dfc_ + q * FC, fch, dbig_ + q * F, rows);
      float* inp = acts_.expert_in + q * C;
      gather_rows(kernels(), inp, x.ln2, r.slot_tokens + s0, rows, C);
      const float* w1 = p.fcw + static_cast<size_t>(e) * FC * C;
      matmul_backward(matmul_, dexpert_in_ + q * C, weight_grads(l, p, w1, FC * C), nullptr, dfc_ + q * FC, FC, inp, w1,
                      rows, C, FC, false);
      weight_grads_done(l, p, w1, FC * C);
      q += rows;
    }
    round_to_dtype(kernels(), dexpert_in_, Sg * C, dtype());
    moe_combine(kernels(), dinp, dexpert_in_, r.grain_slots + t0 * k, nullptr, Ng, k, C, false);
  }
  // The balancing loss's gradient on the router's probabilities: dloss · balance_scale · n_e, each
  // position of a sequence alike.
  for (int i = 0; i < n; i++)
    for (int e = 0; e < E; e++) {
      const float g =
          static_cast<float>(dloss_ * balance_scale(b + i) * h.choices[static_cast<size_t>(b + i) * E + e]);
      for (int t = 0; t < T; t++) moe_dprobs_host_[(static_cast<size_t>(i) * T + t) * E + e] = g;
    }
  op_copy_from_host(kernels(), dprobs_, moe_dprobs_host_.data(), static_cast<size_t>(Ng) * E * sizeof(float));
  moe_route_backward(kernels(), drouter_, x.probs + t0 * E, r.experts + t0 * k, x.route_weights + t0 * k,
                     droute_weights, dprobs_, Ng, E, k, cfg_.moe.normalize_p);
  round_to_dtype(kernels(), drouter_, static_cast<long>(Ng) * E, dtype());
  const size_t router = static_cast<size_t>(E) * C;
  matmul_backward(matmul_, dinp, weight_grads(l, p, p.routerw, router), nullptr, drouter_, E, x.ln2 + t0 * C,
                  p.routerw, Ng, C, E, true);
  weight_grads_done(l, p, p.routerw, router);
  lora_backward(l, BlockProduct::kRouter, dinp, drouter_, E, x.ln2 + t0 * C, adapters, b, n);
  round_to_dtype(kernels(), dinp, static_cast<long>(Ng) * C, dtype());
}

std::vector<int32_t> Decoder::received_runs(const ExpertRows& o, int j) const {
  const int R = expert_exchange_->ranks(), El = cfg_.held_experts();
  const size_t stride = 1 + static_cast<size_t>(El) * max_batch_;
  std::vector<int32_t> bounds{o.start[static_cast<size_t>(j) * R]};
  for (int q = 0; q < R; q++) {
    const int32_t* counts = o.counts.data() + q * stride;
    int32_t at = o.start[static_cast<size_t>(j) * R + q];
    for (int b = 0; b < counts[0]; b++) bounds.push_back(at += counts[1 + static_cast<size_t>(j) * max_batch_ + b]);
  }
  return bounds;
}

void Decoder::exchange_expert_rows(int l, float* local, float* remote, int width, bool to_experts, const char* what) {
  const int R = expert_exchange_->ranks(), El = cfg_.held_experts(), B = B_;
  const MoeHostRoutes& h = moe_host_[layer_slot(l)];
  const ExpertRows& o = expert_rows_[layer_slot(l)];
  const size_t row = static_cast<size_t>(width) * sizeof(float);
  std::vector<ExpertExchange::Message> mine, theirs;
  // Both lists go rank by rank, and a rank's messages expert by expert: the order they match in.
  for (int q = 0; q < R; q++)
    for (int j = 0; j < El; j++) {
      const int32_t* seg = h.segment.data() + static_cast<size_t>(q * El + j) * (B + 1);
      mine.push_back({q, local + static_cast<size_t>(seg[0]) * width, (seg[B] - seg[0]) * row});
      const size_t at = static_cast<size_t>(j) * R + q;
      theirs.push_back({q, remote + static_cast<size_t>(o.start[at]) * width, (o.start[at + 1] - o.start[at]) * row});
    }
  if (to_experts) {
    expert_exchange_->exchange(mine, theirs, what);
  } else {
    expert_exchange_->exchange(theirs, mine, what);
  }
}

void Decoder::experts_exchanged_forward(int l, const BlockActs& x, const Block& p) {
  ExpertExchange& ex = *expert_exchange_;
  const int R = ex.ranks(), El = cfg_.held_experts(), B = B_, C = cfg_.d_model;
  const Widths w(cfg_);
  const MoeHostRoutes& h = moe_host_[layer_slot(l)];
  ExpertRows& o = expert_rows_[layer_slot(l)];
  // Every rank's row counts for this rank's experts: its sequences, then each (expert, sequence)'s.
  const size_t stride = 1 + static_cast<size_t>(El) * max_batch_;
  ep_counts_.assign(R * stride, 0);
  o.counts.assign(R * stride, 0);
  std::vector<ExpertExchange::Message> sends, receives;
  for (int q = 0; q < R; q++) {
    int32_t* c = ep_counts_.data() + q * stride;
    c[0] = B;
    for (int j = 0; j < El; j++)
      for (int b = 0; b < B; b++) {
        const int32_t* seg = h.segment.data() + static_cast<size_t>(q * El + j) * (B + 1);
        c[1 + static_cast<size_t>(j) * max_batch_ + b] = seg[b + 1] - seg[b];
      }
    sends.push_back({q, c, stride * sizeof(int32_t)});
    receives.push_back({q, o.counts.data() + q * stride, stride * sizeof(int32_t)});
  }
  ex.exchange(sends, receives, "expert parallelism: the experts' row counts");
  o.start.assign(static_cast<size_t>(El) * R + 1, 0);
  int32_t rows = 0;
  for (int j = 0; j < El; j++)
    for (int q = 0; q < R; q++) {
      o.start[static_cast<size_t>(j) * R + q] = rows;
      const int32_t* counts = o.counts.data() + q * stride;
      for (int b = 0; b < counts[0]; b++) rows += counts[1 + static_cast<size_t>(j) * max_batch_ + b];
    }
  o.start.back() = rows;
  const size_t S = rows;
  grow(o.in, S * C);
  grow(o.fch, S * w.fc);
  grow(ep_act_, S * w.hidden);
  grow(ep_out_, S * C);
  exchange_expert_rows(l, acts_.expert_in, o.in.data(), C, true, "expert parallelism: rows to the experts");
  std::vector<std::vector<int32_t>> runs(El);
  for (int j = 0; j < El; j++) {
    runs[j] = received_runs(o, j);
    expert_products(p.fcw, j, o.fch.data(), o.in.data(), C, w.fc, runs[j].data(),
                    static_cast<int>(runs[j].size()) - 1);
  }
  round_to_dtype(kernels(), o.fch.data(), S * w.fc, dtype());
  mlp_activation(ep_act_.data(), o.fch.data(), rows);
  for (int j = 0; j < El; j++)
    expert_products(p.fcprojw, j, ep_out_.data(), ep_act_.data(), w.hidden, C, runs[j].data(),
                    static_cast<int>(runs[j].size()) - 1);
  round_to_dtype(kernels(), ep_out_.data(), S * C, dtype());
  exchange_expert_rows(l, x.expert_out, ep_out_.data(), C, false, "expert parallelism: outputs from the experts");
}

void Decoder::experts_exchanged_backward(int l, const BlockActs& x, const Block& p) {
  const int El = cfg_.held_experts();
  const int B = B_, T = T_, N = B * T, C = cfg_.d_model, k = cfg_.moe.top_k, G = grain_sequences();
  const Widths w(cfg_);
  const size_t F = w.hidden, FC = w.fc, TC = static_cast<size_t>(T) * C;
  const MoeRoutes r = moe_routes(l);
  const MoeHostRoutes& h = moe_host_[layer_slot(l)];
  ExpertRows& o = expert_rows_[layer_slot(l)];
  const long S = h.segment.back(), So = o.start.back();
  grow(ep_dbranch_, static_cast<size_t>(N) * C);
  grow(ep_dexpert_out_, S * C);
  grow(ep_dexpert_in_, S * C);
  grow(ep_droute_weights_, static_cast<size_t>(N) * k);
  grow(ep_dout_, So * C);
  grow(ep_dbig_, So * F);
  grow(ep_dfc_, So * FC);
  grow(ep_din_, So * C);
  for (int b = 0; b < B; b += G) {
    const int n = std::min(G, B - b);
    const float* dbranch = branch_grad(dresidual_ + b * TC, 1 + l, DropoutKind::kMlpOutput, b, n);
    op_copy(kernels(), ep_dbranch_.data() + b * TC, dbranch, n * TC * sizeof(float));
  }
  moe_combine_backward(kernels(), ep_dexpert_out_.data(), ep_droute_weights_.data(), ep_dbranch_.data(), x.expert_out,
                       r.slots, r.slot_tokens, r.slot_choices, x.route_weights, N, k, C, S);
  round_to_dtype(kernels(), ep_dexpert_out_.data(), S * C, dtype());
  exchange_expert_rows(l, ep_dexpert_out_.data(), ep_dout_.data(), C, true,
                       "expert parallelism: output gradients to the experts");
  // Each run (a sequence of a rank) forms its weight gradients as one process forms that sequence's.
  for (int j = 0; j < El; j++) {
    const float* w2 = p.fcprojw + static_cast<size_t>(j) * C * F;
    const float* w1 = p.fcw + static_cast<size_t>(j) * FC * C;
    std::vector<int32_t> runs = received_runs(o, j);
    if (!microbatch_invariant()) runs = {runs.front(), runs.back()};
    for (size_t i = 0; i + 1 < runs.size(); i++) {
      const size_t s0 = runs[i];
      const int rows = runs[i + 1] - runs[i];
      if (rows == 0) continue;
      float *act = ep_act_.data() + s0 * F, *dbig = ep_dbig_.data() + s0 * F, *dfc = ep_dfc_.data() + s0 * FC;
      const float* fch = o.fch.data() + s0 * FC;
      mlp_activation(act, fch, rows);
      matmul_backward(matmul_, dbig, weight_grads(l, p, w2, C * F), nullptr, ep_dout_.data() + s0 * C, C, act, w2,
                      rows, F, C, false);
      weight_grads_done(l, p, w2, C * F);
      round_to_dtype(kernels(), dbig, rows * F, dtype());
      mlp_activation_backward(dfc, fch, dbig, rows);
      matmul_backward(matmul_, ep_din_.data() + s0 * C, weight_grads(l, p, w1, FC * C), nullptr, dfc, FC,
                      o.in.data() + s0 * C, w1, rows, C, FC, false);
      weight_grads_done(l, p, w1, FC * C);
    }
  }
  round_to_dtype(kernels(), ep_din_.data(), So * C, dtype());
  exchange_expert_rows(l, ep_dexpert_in_.data(), ep_din_.data(), C, false,
                       "expert parallelism: input gradients from the experts");
}

}  // namespace anvil
