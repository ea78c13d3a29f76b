#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(TokenizerFiles files) : Tokenizer(std::move(files)) {
    model_bytes_ = read_file(files_.model, "SentencePiece model");
    const auto status = sp_.LoadFromSerializedProto(model_bytes_);
    ANVIL_CHECK(status.ok(), "'{}' is not a SentencePiece model: {}", files_.model, status.ToString());
    ANVIL_CHECK(sp_.eos_id() >= 0, "SentencePiece model '{}' has no end-of-sentence piece (train it with an eos_id)",
                files_.model);
  }

  std::vector<int32_t> encode(std::string_view text) override {
    std::vector<int> ids;
    const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    ANVIL_CHECK(status.ok(), "SentencePiece could not encode the text: {}", status.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    for (int32_t id : ids)
      ANVIL_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary (0..{})", id, vocab_size() - 1);
    std::string text;
    const auto status = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    ANVIL_CHECK(status.ok(), "SentencePiece could not decode the ids: {}", status.ToString());
    return text;
  }

  int vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

  // As transformers' LlamaTokenizer reads it: the model file as it is, and the special pieces by
  // their text, BOS added to each input as Llama's tokenizer does.
  void write_hf_files(const std::string& dir, int model_max_length) const override {
    write_file_atomic(dir + "/tokenizer.model", model_bytes_);
    auto piece = [&](int id) { return id >= 0 ? nlohmann::json(sp_.IdToPiece(id)) : nlohmann::json(nullptr); };
    const nlohmann::ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                                           {"model_max_length", model_max_length},
                                           {"bos_token", piece(sp_.bos_id())},
                                           {"eos_token", piece(sp_.eos_id())},
                                           {"unk_token", piece(sp_.unk_id())},
                                           {"pad_token", piece(sp_.pad_id())},
                                           {"add_bos_token", sp_.bos_id() >= 0},
                                           {"add_eos_token", false},
                                           {"legacy", true},
                                           {"clean_up_tokenization_spaces", false}};
    write_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
    nlohmann::ordered_json special = nlohmann::ordered_json::object();
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (!config[key].is_null()) special[key] = config[key];
    write_file_atomic(dir + "/special_tokens_map.json", special.dump(2) + "\n");
  }

 private:
  std::string model_bytes_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(TokenizerFiles files) {
  return std::make_unique<SentencePieceTokenizer>(std::move(files));
}

}  // namespace anvil
