// `anvil data prepare`: text to a tokenized MDS dataset. Each input document (a text file, or one
// JSON line's text field) is tokenized as a training document (Tokenizer::encode_document: BOS
// where the tokenizer has one, the text, EOS); the token stream of each split is cut into samples
// of exactly max_seq_len tokens (the remainder shorter than one sample is dropped), written as
// {"tokens": "ndarray:int32"} MDS under OUT/train and OUT/val (val held out by documents, or by
// tokens when there are too few documents for a val sample), each with the tokenizer's record
// (tokenizer_record.json). The same inputs and options always give the same bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/mds.h"

namespace anvil {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files and directories (recursive, in name order)
  std::string out_dir;
  std::string tokenizer = "gpt2";    // a tokenizer name (data/tokenizer.h)
  std::string text_field = "text";  // the field of each JSON line in .jsonl / .json files
  int max_seq_len = 2048;
  double val_fraction = 0.05;       // of documents, spread evenly; of tokens when too few documents
  MdsWriterOptions mds;
};

struct PrepareSummary {
  int64_t documents = 0, input_bytes = 0, bytes_written = 0;
  int64_t tokens = 0, train_samples = 0, val_samples = 0, dropped_tokens = 0;
  bool val_by_tokens = false;  // too few documents to hold some out: val is the stream's last tokens
};

// Writes into a temporary directory renamed into place at the end: a failure leaves nothing under
// out_dir. Refuses to replace an existing out_dir.
PrepareSummary prepare_dataset(const PrepareOptions& opt);

}  // namespace anvil
