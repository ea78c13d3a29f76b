// SentencePiece models (BPE or unigram, with or without byte fallback) through Debian's
// libsentencepiece, so that ids are the library's own; documents start with the model's BOS and
// end with its EOS, as Llama's tokenizer and LLM Foundry's data conversion use them.
#pragma once
#include <memory>

#include "data/tokenizer.h"

namespace anvil {

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(TokenizerFiles files);

}  // namespace anvil
