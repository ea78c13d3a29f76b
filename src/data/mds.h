// MDS v2, the shard format of MosaicML streaming, written from its specification
// (docs/formats.md): a directory with index.json and shard.NNNNN.mds files (optionally compressed
// to shard.NNNNN.mds.zstd). anvil writes the two one-column layouts LLM Foundry uses, byte for
// byte as streaming's MDSWriter does: {"tokens": "ndarray:int32"} for pretraining text, and
// {"turns": "json"} for tokenized fine-tuning examples (each sample {"turns": [{"input_ids": [...],
// "labels": [...]}, ...]}, a prompt and its response per turn). It reads any MDS dataset whose
// "tokens" column is an integer ndarray, or whose "turns" column is json.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/fs.h"

namespace anvil {

struct MdsFileInfo {
  std::string basename;
  int64_t bytes = 0;
  std::vector<std::pair<std::string, std::string>> hashes;  // (algorithm, hex digest), sorted
};

struct MdsShardInfo {
  MdsFileInfo raw;
  std::optional<MdsFileInfo> zip;  // the file actually stored when the shard is compressed
  std::string compression;         // "" or "algo[:level]"
  int64_t samples = 0;
  std::vector<std::string> column_names, column_encodings;
  std::vector<int64_t> column_sizes;  // -1: variable-size column
  int64_t size_limit = -1;            // -1: null (no limit)
  std::vector<std::string> hashes;
  // The basename to fetch from a remote (the compressed file if there is one).
  const MdsFileInfo& stored() const { return zip ? *zip : raw; }
};

struct MdsIndex {
  std::vector<MdsShardInfo> shards;
  int64_t num_samples() const;
};

// Parses and validates index.json text; `where` names the file in errors.
MdsIndex parse_mds_index(std::string_view text, const std::string& where);

// The hex digest MosaicML streaming records for algorithm `algo` (xxh32, xxh64, xxh3_64,
// xxh128, md5, sha1, sha224, sha256, sha384, sha512, blake2b, blake2s, ...).
std::string mds_hash(std::string_view algo, const void* data, size_t bytes);
bool mds_hash_supported(std::string_view algo);

// Decompresses a stored shard ("zstd" or "zstd:level") into the raw shard bytes.
std::string mds_decompress(std::string_view compression, std::string_view data, int64_t raw_bytes,
                           const std::string& where);

// What a dataset's samples hold.
enum class MdsSampleKind {
  kTokens,  // a "tokens" integer ndarray: pretraining text
  kTurns,   // a "turns" json column: fine-tuning examples, tokenized
};
const char* mds_sample_kind_name(MdsSampleKind kind);  // "tokens", "turns"

// How a shard's samples hold their data: which column, its element type, and where the column
// starts inside an encoded sample.
struct MdsColumnLayout {
  MdsSampleKind kind = MdsSampleKind::kTokens;
  int column = -1;
  int variable_ordinal = -1;   // index among variable-size columns, or -1 if fixed-size
  int num_variable = 0;        // variable-size columns in the sample header
  int dtype_code = -1;         // tokens: MDS ndarray dtype code, or -1 when each sample carries it
  int64_t fixed_elements = -1; // tokens: fixed shape's element count, or -1 when each sample carries it
  std::vector<int64_t> fixed_sizes;  // per column: size or -1
};
MdsColumnLayout mds_column_layout(const MdsShardInfo& shard, const std::string& where);

// A raw shard held in memory (mapped), validated against its index entry on open: sample count,
// offsets monotonic and inside the file, the embedded config, the byte size.
class MdsShardFile {
 public:
  MdsShardFile(const std::string& path, const MdsShardInfo& info);
  MdsShardFile(const MdsShardFile&) = delete;
  MdsShardFile& operator=(const MdsShardFile&) = delete;

  int64_t num_samples() const { return num_samples_; }
  std::span<const uint8_t> sample(int64_t i) const;
  // The bytes of sample i's column (the layout's).
  std::span<const uint8_t> column(int64_t i, const MdsColumnLayout& layout) const;
  // Decodes sample i's tokens into out (at most max_tokens); returns the sample's token count.
  int64_t tokens(int64_t i, const MdsColumnLayout& layout, int32_t* out, int64_t max_tokens) const;

 private:
  std::string path_;
  MappedFile file_;
  const uint8_t* data_;
  size_t size_;
  int64_t num_samples_ = 0;
};

struct MdsWriterOptions {
  std::string compression;          // "" or "zstd[:level]"
  std::vector<std::string> hashes;  // sorted, unique
  int64_t size_limit = int64_t{1} << 26;
};

// Writes samples of one kind into `dir` (which must exist and be empty), starting a new shard
// when the next sample would exceed size_limit, as MDSWriter does.
class MdsWriter {
 public:
  MdsWriter(std::string dir, MdsWriterOptions opt, MdsSampleKind kind = MdsSampleKind::kTokens);
  void write_tokens(const int32_t* tokens, int64_t n);     // kTokens
  void write_json(const nlohmann::json& sample);           // kTurns: {"turns": [...]}
  // Flushes the last shard and writes index.json. Returns the number of bytes written.
  int64_t finish();

 private:
  void append(std::initializer_list<std::string_view> column);
  void flush_shard();
  std::string dir_;
  MdsWriterOptions opt_;
  MdsSampleKind kind_;
  std::string config_json_;
  std::vector<std::string> shards_;  // index.json entries, already serialised
  std::string samples_;               // encoded samples of the shard being built
  std::vector<uint32_t> sample_sizes_;
  int64_t shard_size_ = 0;
  int64_t bytes_written_ = 0;
};

}  // namespace anvil
