// transformers' fast tokenizer format, tokenizer.json (the Rust `tokenizers` library's), read
// without Python: a BPE model with its options (ignore_merges, byte_fallback, fuse_unk,
// continuing_subword_prefix, end_of_word_suffix, unk_token), the normalizers, pre-tokenizers and
// decoders that published LLM tokenizers use, and the added tokens, matched before the model as
// the library matches them. Split patterns run on Oniguruma, the library's own regex engine, and
// normalization forms on ICU. tokenizer_config.json beside it gives the BOS and EOS tokens and
// add_bos_token; without add_bos_token, a TemplateProcessing post-processor that starts with a
// special token says the BOS. Anything in the file anvil does not implement is an error naming it.
#pragma once
#include <memory>

#include "data/tokenizer.h"

namespace anvil {

std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerFiles& files);

}  // namespace anvil
