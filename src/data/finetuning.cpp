#include "data/finetuning.h"

#include <algorithm>
#include <filesystem>
#include <fmt/ranges.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "core/targets.h"
#include "data/mds.h"

namespace anvil {
namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};  // Foundry's

}  // namespace

std::string chat_template_json(const ChatTemplate& t) {
  if (t.is_jinja()) return json{{"name", t.name}, {"origin", t.origin}, {"chat_template", t.jinja}}.dump(2) + "\n";
  return json{{"name", t.name}, {"message", t.message}, {"generation_prompt", t.generation_prompt}}.dump(2) + "\n";
}

std::vector<TextTurn> record_turns(const ojson& record, const ChatFormatter& chat) {
  ANVIL_CHECK(record.is_object(), "a record must be a JSON object, got {}", record.type_name());
  auto keys = [&] {
    std::vector<std::string> k;
    for (auto it = record.begin(); it != record.end(); ++it) k.push_back(it.key());
    return fmt::format("{}", fmt::join(k, ", "));
  };
  if (record.size() == 1 && record.contains("messages")) {
    const ojson& messages = record["messages"];
    ANVIL_CHECK(messages.is_array(), "\"messages\" must be a list, got {}", messages.type_name());
    ANVIL_CHECK(messages.size() >= 2, "a chat needs at least 2 messages, got {}", messages.size());
    std::string previous_role;
    for (size_t i = 0; i < messages.size(); i++) {
      const ojson& m = messages[i];
      ANVIL_CHECK(m.is_object() && m.size() == 2 && m.contains("role") && m.contains("content"),
                  "message {} must be {{\"role\": ..., \"content\": ...}}, got {}", i, m.dump());
      ANVIL_CHECK(m["role"].is_string(), "message {}: the role must be a string, got {}", i, m["role"].dump());
      const std::string role = m["role"];
      ANVIL_CHECK(kRoles.count(role), "message {}: unknown role '{}' (expected {})", i, role, fmt::join(kRoles, ", "));
      ANVIL_CHECK(m["content"].is_string(), "message {}: the content must be a string, got {}", i,
                  m["content"].type_name());
      ANVIL_CHECK(role != previous_role, "messages {} and {} are both from '{}': roles must alternate", i - 1, i, role);
      previous_role = role;
    }
    ANVIL_CHECK(previous_role == "assistant", "a chat must end with the assistant's message, not the {}'s",
                previous_role);
    return chat.turns(messages);
  }
  const bool has_response = record.contains("response"), has_completion = record.contains("completion");
  ANVIL_CHECK(record.size() == 2 && record.contains("prompt") && has_response != has_completion,
              "a record is {{\"prompt\", \"response\"}} (or \"completion\") or {{\"messages\"}}; this one has keys: {}",
              keys());
  const ojson& prompt = record["prompt"];
  const ojson& response = record[has_response ? "response" : "completion"];
  ANVIL_CHECK(prompt.is_string(), "the prompt must be a string, got {}", prompt.type_name());
  ANVIL_CHECK(response.is_string(), "the response must be a string, got {}", response.type_name());
  return {{prompt.get<std::string>(), response.get<std::string>()}};
}

std::vector<Turn> tokenize_turns(const std::vector<TextTurn>& turns, Tokenizer& tokenizer, bool bos) {
  std::vector<Turn> out;
  for (const TextTurn& t : turns) {
    Turn turn;
    if (bos && out.empty() && tokenizer.bos_id() >= 0) turn.prompt.push_back(tokenizer.bos_id());
    const std::vector<int32_t> p = tokenizer.encode(t.prompt);
    turn.prompt.insert(turn.prompt.end(), p.begin(), p.end());
    turn.response = tokenizer.encode(t.response);
    out.push_back(std::move(turn));
  }
  return out;
}

json turns_json(const std::vector<Turn>& turns) {
  json list = json::array();
  for (const Turn& t : turns) list.push_back({{"input_ids", t.prompt}, {"labels", t.response}});
  return {{"turns", list}};
}

std::vector<Turn> parse_turns_json(std::string_view text, const std::string& where) {
  try {
    const json j = json::parse(text);
    std::vector<Turn> turns;
    for (const json& t : j.at("turns")) {
      Turn turn;
      turn.prompt = t.at("input_ids").get<std::vector<int32_t>>();
      turn.response = t.at("labels").get<std::vector<int32_t>>();
      turns.push_back(std::move(turn));
    }
    ANVIL_CHECK(!turns.empty(), "{}: no turns", where);
    return turns;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    ANVIL_FAIL("{}: not a fine-tuning sample {{\"turns\": [{{\"input_ids\": [...], \"labels\": [...]}}, ...]}} ({})",
               where, e.what());
  }
}

Stitched stitch_turns(const std::vector<Turn>& turns, const TargetPolicy& policy, int32_t eos_id) {
  Stitched s;
  auto add = [&](const std::vector<int32_t>& tokens, bool target) {
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    s.labels.insert(s.labels.end(), tokens.size(), kIgnoreIndex);
    if (target) std::copy(tokens.begin(), tokens.end(), s.labels.end() - static_cast<std::ptrdiff_t>(tokens.size()));
  };
  for (size_t i = 0; i < turns.size(); i++) {
    const bool last = i + 1 == turns.size();
    std::vector<int32_t> response = turns[i].response;
    if (last && eos_id >= 0 && (response.empty() || response.back() != eos_id)) response.push_back(eos_id);
    const int64_t prompt_len = static_cast<int64_t>(turns[i].prompt.size());
    const bool prompt_target =
        policy.prompts == TargetPolicy::Prompts::kAll ||
        (policy.prompts == TargetPolicy::Prompts::kLengthAtLeast && prompt_len >= policy.prompt_min_length);
    add(turns[i].prompt, prompt_target);
    add(response, last || policy.responses == TargetPolicy::Responses::kAll);
  }
  return s;
}

int64_t finetuning_example(const Stitched& s, int seq_len, int32_t* inputs, int32_t* targets) {
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), seq_len);
  int64_t count = 0;
  for (int64_t i = 0; i < seq_len; i++) {
    inputs[i] = i < n ? s.tokens[static_cast<size_t>(i)] : 0;
    targets[i] = i + 1 < n ? s.labels[static_cast<size_t>(i) + 1] : kIgnoreIndex;
    count += targets[i] != kIgnoreIndex;
  }
  return count;
}

namespace {

// Hugging Face's split keywords (datasets' data_files patterns).
const std::vector<std::pair<std::string, std::vector<std::string>>> kSplitKeywords = {
    {"train", {"train", "training"}},
    {"validation", {"validation", "valid", "val", "dev"}},
    {"test", {"test", "testing", "eval", "evaluation"}},
};

bool record_file(const fs::path& p) { return p.extension() == ".jsonl" || p.extension() == ".json"; }

// Which split a file's path (relative to the directory) names, or "".
std::string split_named_by(const std::string& relative) {
  std::vector<std::string> words;
  std::string word;
  for (char c : relative + "/") {
    if (c == '-' || c == '.' || c == '_' || c == ' ' || c == '/' || (c >= '0' && c <= '9')) {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  for (const auto& [split, keys] : kSplitKeywords)
    for (const std::string& w : words)
      if (std::find(keys.begin(), keys.end(), w) != keys.end()) return split;
  return "";
}

// The split a name means ("validation" for "val"), or the name itself.
std::string canonical_split(const std::string& split) {
  for (const auto& [name, keys] : kSplitKeywords)
    if (name == split || std::find(keys.begin(), keys.end(), split) != keys.end()) return name;
  return split;
}

// The record files of a directory by the split each names (every file is train when none names
// one; files that name none are left out when others do), in path order.
std::map<std::string, std::vector<std::string>> files_by_split(const std::string& dir, const std::string& where) {
  ANVIL_CHECK(fs::is_directory(dir), "{}: '{}' is not a directory", where, dir);
  std::vector<std::pair<std::string, std::string>> found;  // (relative path, split it names)
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), dir).string();
    if (rel.front() == '.') continue;
    if (!record_file(e.path())) {
      const std::string ext = e.path().extension().string();
      if (ext == ".csv" || ext == ".parquet")
        ANVIL_FAIL("{}: '{}' is {}; anvil reads fine-tuning records from .jsonl or .json files", where,
                   e.path().string(), ext);
      continue;
    }
    found.emplace_back(rel, split_named_by(rel));
  }
  std::sort(found.begin(), found.end());
  ANVIL_CHECK(!found.empty(), "{}: '{}' holds no .jsonl or .json file", where, dir);
  const bool any_named = std::any_of(found.begin(), found.end(), [](const auto& f) { return !f.second.empty(); });
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [rel, named] : found)
    if (!any_named || !named.empty()) out[any_named ? named : "train"].push_back((fs::path(dir) / rel).string());
  return out;
}

std::vector<std::string> files_of_split(const std::string& dir, const std::string& split, const std::string& where) {
  const auto splits = files_by_split(dir, where);
  const std::string canonical = canonical_split(split);
  const auto it = splits.find(canonical);
  if (it != splits.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [name, files] : splits) names.push_back(name);
  ANVIL_FAIL("{}: no file in '{}' is of split '{}' (found split(s): {}; a file's name or directory names its split, "
             "e.g. {}.jsonl)", where, dir, split, fmt::join(names, ", "), canonical);
}

}  // namespace

std::vector<std::string> finetuning_files(const FinetuningConfig& cfg, const std::string& split, const std::string& where) {
  if (cfg.hf_name == "json") {
    ANVIL_CHECK(cfg.data_dir.empty() != cfg.data_files.empty(), "{}: hf_name json reads hf_kwargs.data_dir (a "
                "directory) or hf_kwargs.data_files (files): give one of them", where);
    if (!cfg.data_dir.empty()) return files_of_split(cfg.data_dir, split, where);
    for (const std::string& f : cfg.data_files)
      ANVIL_CHECK(fs::is_regular_file(f), "{}: data file '{}' does not exist", where, f);
    return cfg.data_files;
  }
  ANVIL_CHECK(cfg.data_dir.empty() && cfg.data_files.empty(), "{}: hf_kwargs.data_dir and data_files go with "
              "hf_name: json", where);
  if (fs::is_regular_file(cfg.hf_name)) {
    ANVIL_CHECK(record_file(cfg.hf_name), "{}: '{}' is not a .jsonl or .json file", where, cfg.hf_name);
    return {cfg.hf_name};
  }
  if (fs::is_directory(cfg.hf_name)) return files_of_split(cfg.hf_name, split, where);
  ANVIL_FAIL("{}: hf_name '{}' is not a local file or directory; anvil does not download from the Hugging Face "
             "hub: download the dataset's JSONL files and name their path", where, cfg.hf_name);
}

std::vector<std::string> finetuning_splits(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& [name, files] : files_by_split(dir, dir)) names.push_back(name);
  return names;
}

std::string FinetuningReport::summary() const {
  std::string s = fmt::format("{} record(s): {} example(s), {} tokens, {} carrying loss", records, written, tokens,
                              target_tokens);
  if (truncated) s += fmt::format("; {} longer than max_seq_len truncated", truncated);
  if (dropped) s += fmt::format("; {} longer than max_seq_len dropped", dropped);
  if (empty) s += fmt::format("; {} with an empty prompt or response dropped", empty);
  if (no_target) s += fmt::format("; {} with no token carrying loss within max_seq_len dropped", no_target);
  if (malformed) s += fmt::format("; {} malformed skipped", malformed);
  return s;
}

namespace {

// Calls fn(record, line) for each record of a JSON-lines file, or of a file holding one JSON array.
template <class Fn>
void for_each_record(const std::string& file, Fn fn, FinetuningReport& report, bool skip_malformed) {
  const std::string text = read_file(file, "fine-tuning records");
  auto malformed = [&](int64_t line, const std::string& what) {
    const std::string problem = fmt::format("{}:{}: {}", file, line, what);
    ANVIL_CHECK(skip_malformed, "{} (set skip_malformed: true to skip such records)", problem);
    report.malformed++;
    if (report.problems.size() < 5) report.problems.push_back(problem);
  };
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    ojson all;
    try {
      all = ojson::parse(text);
    } catch (const std::exception& e) {
      ANVIL_FAIL("{}: not valid JSON ({})", file, e.what());
    }
    for (size_t i = 0; i < all.size(); i++) {
      report.records++;
      try {
        fn(all[i]);
      } catch (const Error& e) {
        malformed(static_cast<int64_t>(i), fmt::format("record {}: {}", i, e.what()));
      }
    }
    return;
  }
  int64_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view l(text.data() + pos, end - pos);
    line++;
    pos = end + 1;
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    report.records++;
    ojson record;
    try {
      record = ojson::parse(l);
    } catch (const std::exception& e) {
      malformed(line, fmt::format("not valid JSON ({})", e.what()));
      continue;
    }
    try {
      fn(record);
    } catch (const Error& e) {
      malformed(line, e.what());
    }
  }
}

}  // namespace

FinetuningReport prepare_finetuning(const std::vector<std::string>& files, const std::string& out_dir,
                                    Tokenizer& tokenizer, const FinetuningPrepareOptions& opt) {
  ANVIL_CHECK(opt.max_seq_len >= 2, "max_seq_len must be at least 2, got {}", opt.max_seq_len);
  ANVIL_CHECK(!files.empty(), "no fine-tuning record files given");
  const FinetuningConfig& ft = opt.finetuning;
  const ChatFormatter chat(resolve_chat_template(ft.chat_template, tokenizer.files()), tokenizer.files());
  ANVIL_CHECK(!fs::exists(out_dir) || fs::is_empty(out_dir), "output directory '{}' already exists and is not empty",
              out_dir);
  FinetuningReport report;
  write_directory_atomic(out_dir, [&](const std::string& tmp) {
    make_dirs(tmp);
    MdsWriter writer(tmp, opt.mds, MdsSampleKind::kTurns);
    std::vector<int32_t> inputs(static_cast<size_t>(opt.max_seq_len)), targets(inputs.size());
    for (const std::string& file : files) {
      for_each_record(file, [&](const ojson& record) {
        const bool chat_record = record.is_object() && record.contains("messages");
        const std::vector<Turn> turns = tokenize_turns(record_turns(record, chat), tokenizer,
                                                       !(chat_record && chat.writes_special_tokens()));
        for (const Turn& t : turns) {
          if (t.prompt.empty() || t.response.empty()) {
            report.empty++;
            return;
          }
        }
        const Stitched s = stitch_turns(turns, ft.targets, tokenizer.eos_id());
        const bool too_long = static_cast<int64_t>(s.tokens.size()) > opt.max_seq_len;
        if (too_long && ft.too_long == TooLong::kDrop) {
          report.dropped++;
          return;
        }
        const int64_t targets_kept = finetuning_example(s, opt.max_seq_len, inputs.data(), targets.data());
        if (targets_kept == 0) {
          report.no_target++;
          return;
        }
        report.truncated += too_long;
        report.tokens += static_cast<int64_t>(s.tokens.size());
        report.target_tokens += targets_kept;
        writer.write_json(turns_json(turns));
        report.written++;
      }, report, ft.skip_malformed);
    }
    ANVIL_CHECK(report.written > 0, "no usable example in {}: {}", fmt::join(files, ", "), report.summary());
    writer.finish();
    write_file_atomic(tmp + "/" + kTokenizerRecordFile, tokenizer_record_json(tokenizer.record()));
  });
  return report;
}

}  // namespace anvil
