// Fine-tuning examples as LLM Foundry reads them. A record is a JSON object, either
// {"prompt": ..., "response": ...} ("completion" may name the response) or a chat
// {"messages": [{"role": ..., "content": ...}, ...]} whose messages a chat template renders; it
// becomes turns, a prompt and its response each, tokenized and stored in MDS as Foundry stores
// them ({"turns": [{"input_ids": prompt, "labels": response}, ...]}). A training example puts the
// turns back to back with EOS closing the last response, and the target policy chooses which
// tokens carry loss.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/finetuning_config.h"
#include "data/chat_template.h"
#include "data/mds.h"
#include "data/tokenizer.h"

namespace anvil {

// What the run directory records of the template used (resolved: its Jinja source and origin).
std::string chat_template_json(const ChatTemplate& t);

// A record's turns as text; a record Foundry would refuse (wrong keys, a role it does not know,
// two messages of one role in a row, a chat that does not end with the assistant, ...) throws an
// Error saying what is wrong.
std::vector<TextTurn> record_turns(const nlohmann::ordered_json& record, const ChatFormatter& chat);

struct Turn {
  std::vector<int32_t> prompt, response;  // Foundry's input_ids and labels
};
// With `bos`, the first prompt begins with BOS where the tokenizer has one (a prompt/response
// record, a chat rendered by a message template); a chat rendered by the tokenizer's own template
// carries its special tokens in its text.
std::vector<Turn> tokenize_turns(const std::vector<TextTurn>& turns, Tokenizer& tokenizer, bool bos);

// Foundry's MDS sample for the turns, and back (`where` names the sample in errors).
nlohmann::json turns_json(const std::vector<Turn>& turns);
std::vector<Turn> parse_turns_json(std::string_view text, const std::string& where);

// The turns back to back, EOS appended to the last response unless it ends with one; labels
// hold each token that carries loss under the policy, kIgnoreIndex elsewhere.
struct Stitched {
  std::vector<int32_t> tokens, labels;
};
Stitched stitch_turns(const std::vector<Turn>& turns, const TargetPolicy& policy, int32_t eos_id);

// A training example from a stitched sequence, cut to its first seq_len tokens: inputs are the
// tokens (0 past the end) and targets[i] is labels[i + 1], as transformers shifts labels
// (kIgnoreIndex past the end). Returns the number of targets that carry loss.
int64_t finetuning_example(const Stitched& s, int seq_len, int32_t* inputs, int32_t* targets);

// The JSON record files of one split, found as Hugging Face's json loader finds them: `hf_name`
// a .jsonl/.json file (the split itself) or a directory; "json" with `data_files` (the files) or
// `data_dir` (a directory). In a directory, a file belongs to a split when a part of its path
// names it (train/training; validation/valid/val/dev; test/testing/eval/evaluation); when no
// file names any split, every file is the train split.
std::vector<std::string> finetuning_files(const FinetuningConfig& cfg, const std::string& split,
                                          const std::string& where);

// The splits a directory of record files holds (train, validation, test), found as above.
std::vector<std::string> finetuning_splits(const std::string& dir);

struct FinetuningPrepareOptions {
  int max_seq_len = 0;
  FinetuningConfig finetuning;
  MdsWriterOptions mds;
};

// What became of the records.
struct FinetuningReport {
  int64_t records = 0;    // records read
  int64_t written = 0;    // examples written
  int64_t malformed = 0;  // not a record Foundry reads (skip_malformed: skipped)
  int64_t empty = 0;      // a prompt or response with no tokens: dropped, as Foundry drops them
  int64_t no_target = 0;  // no token carries loss within max_seq_len: dropped
  int64_t truncated = 0;  // longer than max_seq_len, kept cut (too_long: truncate)
  int64_t dropped = 0;    // longer than max_seq_len, dropped (too_long: drop)
  int64_t tokens = 0;     // tokens written, EOS included, before any cut
  int64_t target_tokens = 0;  // tokens carrying loss within max_seq_len
  std::vector<std::string> problems;  // the first few malformed records: file:line: what is wrong
  std::string summary() const;        // one line
};

// Tokenizes the records of `files` (JSON lines, or one JSON array) into an MDS dataset of turns
// in `out_dir` (created; it must not exist or be empty), with the tokenizer's record beside it.
// Malformed records stop it (naming file and line) unless skip_malformed; an output with no
// example is an error.
FinetuningReport prepare_finetuning(const std::vector<std::string>& files, const std::string& out_dir,
                                    Tokenizer& tokenizer, const FinetuningPrepareOptions& opt);

}  // namespace anvil
