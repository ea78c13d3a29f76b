// Tensor parallelism's cut of a model (model/tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/crossentropy.h"
#include "kernels/matmul.h"
#include "model/decoder_layout.h"
#include "model/model.h"

namespace anvil {
namespace {

// How a tensor is cut: whole on every rank; by rows, in sections of these many rows (each
// section's rows cut in R, the share holding its part of each section in order); by columns
// (every row's columns cut in R); or by the vocabulary's rows (tensor_vocab_slice).
struct Cut {
  enum Kind { kWhole, kRows, kColumns, kVocabRows } kind = kWhole;
  std::vector<int> sections;
};

// The block tensor's name within its block ("qkvw"); empty outside the blocks (the embeddings,
// the final norm, the LM head).
std::string block_tensor_name(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return "";
  return name.substr(name.rfind('.') + 1);
}

Cut::Kind cut_kind(const std::string& name) {
  if (name == "wte" || name == "lm_head") return Cut::kVocabRows;
  const std::string t = block_tensor_name(name);
  if (t == "qkvw" || t == "qkvb" || t == "fcw" || t == "fcb") return Cut::kRows;
  if (t == "attprojw" || t == "fcprojw") return Cut::kColumns;
  return Cut::kWhole;  // norms, the row-parallel products' biases, the positional embeddings
}

Cut cut_of(const ModelConfig& cfg, const std::string& name) {
  const Cut::Kind kind = cut_kind(name);
  if (kind != Cut::kRows) return {kind, {}};
  const Widths w(cfg);
  return {kind, block_tensor_name(name).rfind("qkv", 0) == 0 ? w.qkv_parts() : w.fc_parts()};
}

// Whether the block tensor is an expert's weight: a mixture of experts' fc and fcproj, which an
// expert-parallel share holds its own experts of.
bool expert_tensor(const ModelConfig& cfg, const std::string& name) {
  const std::string t = block_tensor_name(name);
  return cfg.has_moe() && (t == "fcw" || t == "fcprojw");
}

// Calls copy(whole_offset, share_offset, n) for every run of n floats of a share of whole's model.
template <class Copy>
void for_each_share_run(const ModelConfig& whole_cfg, const ModelConfig& share_cfg, const Copy& copy) {
  const std::vector<ParamTensor> whole = model_param_layout(whole_cfg);
  const std::vector<ParamTensor> share = model_param_layout(share_cfg);
  ANVIL_CHECK(whole.size() == share.size(), "internal: a share of a model has {} tensors, the model {}", share.size(),
              whole.size());
  const int ranks = share_cfg.tensor_ranks, rank = share_cfg.tensor_rank;
  for (size_t k = 0; k < whole.size(); k++) {
    const ParamTensor &t = whole[k], &s = share[k];
    if (share_cfg.expert_share()) {
      // The held experts' weights, one run of the whole tensor's.
      const bool cut = expert_tensor(share_cfg, t.name);
      copy(t.offset + (cut ? t.numel / share_cfg.moe.experts * share_cfg.first_expert() : 0), s.offset, s.numel);
      continue;
    }
    const Cut cut = share_cfg.tensor_share() ? cut_of(whole_cfg, t.name) : Cut{};
    const size_t row = t.shape.size() > 1 ? static_cast<size_t>(t.shape[1]) : 1;
    if (cut.kind == Cut::kWhole) {
      copy(t.offset, s.offset, t.numel);
    } else if (cut.kind == Cut::kVocabRows) {
      copy(t.offset + static_cast<size_t>(share_cfg.vocab_first) * row, s.offset,
           static_cast<size_t>(share_cfg.vocab_size) * row);
    } else if (cut.kind == Cut::kRows) {
      size_t section = 0, at = s.offset;
      for (int rows : cut.sections) {
        const size_t part = static_cast<size_t>(rows / ranks);
        copy(t.offset + (section + rank * part) * row, at, part * row);
        section += static_cast<size_t>(rows);
        at += part * row;
      }
    } else {
      const size_t cols = row / ranks, n_rows = static_cast<size_t>(t.shape[0]);
      for (size_t i = 0; i < n_rows; i++) copy(t.offset + i * row + rank * cols, s.offset + i * cols, cols);
    }
  }
}

}  // namespace

std::string tensor_parallel_problem(const ModelConfig& cfg, int ranks) {
  if (ranks < 1) return fmt::format("tensor parallelism needs at least 1 rank, not {}", ranks);
  if (ranks == 1) return "";
  if (cfg.has_lora()) return "tensor parallelism does not cut a LoRA model's adapters yet";
  if (cfg.has_moe()) return "tensor parallelism does not cut a mixture of experts' blocks yet";
  const Widths w(cfg);
  const int kv = cfg.kv_heads();
  if (cfg.n_heads % ranks || kv % ranks || w.hidden % ranks)
    return fmt::format("tensor parallelism over {} ranks cuts the {} query heads, the {} key/value heads and the "
                       "MLP's {} hidden units into equal shares: {} must divide each", ranks, cfg.n_heads, kv,
                       w.hidden, ranks);
  const int blocks = (cfg.vocab_size + kCrossentropySumBlock - 1) / kCrossentropySumBlock;
  if (blocks < ranks)
    return fmt::format("tensor parallelism over {} ranks cuts the vocabulary at multiples of {} (the cross-entropy's "
                       "sum blocks), so that the ranks' parts of the loss add up to one process's bits: vocab_size {} "
                       "must be more than {}", ranks, kCrossentropySumBlock, cfg.vocab_size,
                       (ranks - 1) * kCrossentropySumBlock);
  return "";
}

VocabSlice tensor_vocab_slice(int vocab, int ranks, int rank) {
  ANVIL_CHECK(rank >= 0 && rank < ranks, "internal: tensor-parallel rank {} of {}", rank, ranks);
  const int blocks = (vocab + kCrossentropySumBlock - 1) / kCrossentropySumBlock;
  const int per = blocks / ranks, extra = blocks % ranks;
  const int b0 = rank * per + std::min(rank, extra), b1 = b0 + per + (rank < extra);
  const int first = b0 * kCrossentropySumBlock;
  return {first, std::min(vocab, b1 * kCrossentropySumBlock) - first};
}

HeldRows tensor_held_rows(const ModelConfig& cfg, int rank, int N) {
  if (!cfg.tensor_share()) return {0, N};
  const int64_t R = cfg.tensor_ranks;
  const int first = static_cast<int>(int64_t{N} * rank / R), end = static_cast<int>(int64_t{N} * (rank + 1) / R);
  return {first, end - first};
}

std::vector<KChainPiece> tensor_k_chain(const std::vector<KSegment>& whole_k) {
  std::vector<KChainPiece> pieces;
  size_t s = 0;
  int used = 0;  // of segment s
  while (s < whole_k.size()) {
    KChainPiece block;
    for (int room = kMatmulSumBlock; room > 0 && s < whole_k.size();) {
      const KSegment& seg = whole_k[s];
      const int take = std::min(room, seg.len - used);
      if (take > 0) block.segments.push_back({seg.rank, seg.local + used, take});
      used += take;
      room -= take;
      if (used == seg.len) {
        s++;
        used = 0;
      }
    }
    if (block.segments.empty()) break;
    block.rank = block.segments.back().rank;
    // A whole block of one rank's k, right after the same rank's run, lengthens that run.
    if (!block.assembled() && !pieces.empty() && !pieces.back().assembled() && pieces.back().rank == block.rank) {
      KSegment& run = pieces.back().segments[0];
      if (run.local + run.len == block.segments[0].local) {
        run.len += block.segments[0].len;
        continue;
      }
    }
    pieces.push_back(std::move(block));
  }
  return pieces;
}

ModelConfig tensor_share_config(const ModelConfig& cfg, int ranks, int rank) {
  const std::string problem = tensor_parallel_problem(cfg, ranks);
  ANVIL_CHECK(problem.empty(), "{}", problem);
  ANVIL_CHECK(!cfg.tensor_share(), "internal: a tensor-parallel share cut again");
  ModelConfig s = cfg;
  s.head_dim = cfg.head_size();
  s.n_heads = cfg.n_heads / ranks;
  s.n_kv_heads = cfg.kv_heads() / ranks;
  s.mlp_hidden = cfg.mlp_width() / ranks;
  if (ranks > 1) {
    const VocabSlice v = tensor_vocab_slice(cfg.vocab_size, ranks, rank);
    s.vocab_first = v.first;
    s.vocab_size = v.size;
    s.vocab_whole = cfg.vocab_size;
    s.tensor_ranks = ranks;
    s.tensor_rank = rank;
  }
  return s;
}

ModelConfig expert_share_config(const ModelConfig& cfg, int ranks, int rank) {
  ANVIL_CHECK(cfg.has_moe() && ranks >= 1 && cfg.moe.experts % ranks == 0 && rank >= 0 && rank < ranks,
              "internal: rank {} of {} sharing {} experts", rank, ranks, cfg.moe.experts);
  ANVIL_CHECK(!cfg.expert_share() && !cfg.tensor_share(), "internal: a share of a model cut again");
  ModelConfig s = cfg;
  s.expert_ranks = ranks;
  s.expert_rank = ranks > 1 ? rank : 0;
  return s;
}

bool share_cut(const ModelConfig& share, const std::string& name) {
  if (share.expert_share()) return expert_tensor(share, name);
  return share.tensor_share() && cut_kind(name) != Cut::kWhole;
}

void take_share(const ModelConfig& whole, const ModelConfig& share, const float* from, float* to) {
  for_each_share_run(whole, share, [&](size_t w, size_t s, size_t n) {
    std::memcpy(to + s, from + w, n * sizeof(float));
  });
}

void init_share(const ModelConfig& whole, const ModelConfig& share, uint64_t seed, size_t lo, size_t hi, float* out) {
  // Each value depends only on the seed, its tensor and its place in the whole tensor.
  const std::vector<ParamTensor> layout = model_param_layout(whole);
  for_each_share_run(whole, share, [&](size_t w, size_t s, size_t n) {
    const size_t a = std::max(s, lo), b = std::min(s + n, hi);
    if (a < b) model_init_params(layout, seed, w + (a - s), w + (b - s), out + (a - lo));
  });
}

void put_share(const ModelConfig& whole, const ModelConfig& share, const float* from, float* to) {
  for_each_share_run(whole, share, [&](size_t w, size_t s, size_t n) {
    std::memcpy(to + w, from + s, n * sizeof(float));
  });
}

void put_share_range(const ModelConfig& whole, const ModelConfig& share, const float* from, size_t lo, size_t hi,
                     float* out) {
  for_each_share_run(whole, share, [&](size_t w, size_t s, size_t n) {
    const size_t a = std::max(w, lo), b = std::min(w + n, hi);
    if (a < b) std::memcpy(out + (a - lo), from + s + (a - w), (b - a) * sizeof(float));
  });
}

}  // namespace anvil
