// Mixture of experts: the router's choice of each token's top-k experts, and the combination of
// the experts' outputs. N tokens, E experts, k experts per token. The experts themselves are
// matrix products over the rows sent to them (model/decoder.cpp), gathered with gather_rows into
// slots: row s of the experts' input is token slot_tokens[s]'s, and slots[t·k + j] is the slot
// of token t's j-th choice, or -1 where the expert was full (capacity) and the token skips it.
// Each output is formed on its own, its sums over j in order: the same bits in every batching.
#pragma once
#include <cstdint>

#include "kernels/op.h"

namespace anvil {

// The router's choice (moe_route's): of row's E logits, the indices of the k largest, largest
// first, of equal ones the lower index first. One definition for every backend.
ANVIL_HOST_DEVICE inline void moe_top_k(int32_t* chosen, const float* row, int E, int k) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || row[e] > row[best])) best = e;
    }
    chosen[j] = best;
  }
}

// probs (N,E) = softmax(logits (N,E)), in fp32; experts (N,k) = the indices of each row's k
// largest logits, largest first (of equal ones, the lower index first: chosen from the logits,
// every backend makes the same choices); weights (N,k) = their probabilities, divided by their
// p-norm (Σ_j w_j^p)^(1/p) when norm_p > 0.
void moe_route(KernelImpl impl, float* probs, int32_t* experts, float* weights, const float* logits, int N, int E,
               int k, float norm_p);
// dlogits (N,E) = the gradient wrt the logits, given dweights (N,k) (of moe_route's weights) and
// dprobs (N,E) (of its probs, from the load-balancing loss; may be null: none), through the
// normalisation and the softmax. probs, experts and weights: moe_route's.
void moe_route_backward(KernelImpl impl, float* dlogits, const float* probs, const int32_t* experts,
                        const float* weights, const float* dweights, const float* dprobs, int N, int E, int k,
                        float norm_p);
// out (n_rows, C) = rows rows[r] of inp (·, C).
void gather_rows(KernelImpl impl, float* out, const float* inp, const int32_t* rows, long n_rows, int C);
// out (N,C) = Σ_j weights[t,j] · y[slots[t,j]] over j < k with slots[t,j] >= 0 (0 where none is),
// or += with accumulate; weights (N,k) may be null: each 1. y (·, C): the experts' output rows.
void moe_combine(KernelImpl impl, float* out, const float* y, const int32_t* slots, const float* weights, int N, int k,
                 int C, bool accumulate);
// The combination's backward: dy (S,C) row s = weights[t,j] · dout[t] for t = slot_tokens[s] and
// j = slot_choices[s] (its rows may be ordered otherwise than y's: the model forms them for a few
// sequences at a time); dweights (N,k) = dout[t] · y[slots[t,j]] (0 for a skipped choice).
void moe_combine_backward(KernelImpl impl, float* dy, float* dweights, const float* dout, const float* y,
                          const int32_t* slots, const int32_t* slot_tokens, const int32_t* slot_choices,
                          const float* weights, int N, int k, int C, long S);

ANVIL_OP_IMPLEMENTATIONS(moe_route)
ANVIL_OP_IMPLEMENTATIONS(moe_route_backward)
ANVIL_OP_IMPLEMENTATIONS(gather_rows)
ANVIL_OP_IMPLEMENTATIONS(moe_combine)
ANVIL_OP_IMPLEMENTATIONS(moe_combine_backward)

}  // namespace anvil
