#include "train/icl_eval.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "config/map_reader.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/targets.h"
#include "data/python_text.h"
#include "data/tokenizer.h"
#include "interop/hf_import.h"
#include "kernels/buffer.h"
#include "model/model.h"

namespace anvil {

namespace {

// Foundry's metric for a task type (its default metric_names).
const char* metric_of(IclTaskType type) {
  switch (type) {
    case IclTaskType::kLanguageModeling: return "InContextLearningLMAccuracy";
    case IclTaskType::kGenerationWithAnswers: return "InContextLearningGenerationExactMatchAccuracy";
    default: return "InContextLearningMultipleChoiceAccuracy";
  }
}

}  // namespace

namespace {

// A task's generation_kwargs. Foundry generates greedily, and so does anvil: it takes the keys
// that change what greedy decoding gives (max_new_tokens, eos_token_id), and those that leave it
// as it is (do_sample: false, num_beams: 1, use_cache, and pad_token_id, which a batch of one
// sequence never reads); anything else is an error naming it.
void read_generation_kwargs(MapReader& task, IclTaskSpec& spec, const std::string& where) {
  if (!task.has("generation_kwargs")) return;
  ANVIL_CHECK(task.raw("generation_kwargs").IsMap(), "{}: generation_kwargs must be a mapping of arguments to "
              "transformers' generate()", where);
  MapReader g = task.sub("generation_kwargs");
  for (const char* key : {"temperature", "top_k", "top_p", "typical_p", "num_beam_groups", "penalty_alpha"})
    ANVIL_CHECK(!g.has(key), "{}: generation_kwargs.{}: anvil's ICL evaluation decodes greedily (do_sample: false, "
                "num_beams: 1), as Foundry's defaults do", where, key);
  bool do_sample = false, use_cache = true;
  int num_beams = 1, pad_token_id = 0;
  g.get("do_sample", do_sample);
  g.get("num_beams", num_beams);
  g.get("use_cache", use_cache);
  g.get("pad_token_id", pad_token_id);
  ANVIL_CHECK(!do_sample && num_beams == 1, "{}: generation_kwargs: anvil's ICL evaluation decodes greedily "
              "(do_sample: false, num_beams: 1), as Foundry's defaults do", where);
  g.get("max_new_tokens", spec.max_new_tokens);
  ANVIL_CHECK(!g.has("max_new_tokens") || spec.max_new_tokens > 0, "{}: generation_kwargs.max_new_tokens = {} "
              "must be positive", where, spec.max_new_tokens);
  if (g.has("eos_token_id")) {
    const YAML::Node eos = g.raw("eos_token_id");
    const std::string expected = fmt::format("{}: generation_kwargs.eos_token_id must be a token id or a list of "
                                             "them", where);
    ANVIL_CHECK(eos.IsScalar() || (eos.IsSequence() && eos.size() > 0), "{}", expected);
    std::vector<YAML::Node> ids;
    if (eos.IsScalar()) ids.push_back(eos);
    else for (const YAML::Node& n : eos) ids.push_back(n);
    for (const YAML::Node& n : ids) {
      int64_t id = -1;
      try {
        id = n.as<int64_t>();
      } catch (const YAML::Exception&) {
      }
      ANVIL_CHECK(n.IsScalar() && id >= 0 && id <= INT32_MAX, "{}", expected);
      spec.eos_ids.push_back(static_cast<int32_t>(id));
    }
  }
  g.finish();
}

// The entries of an icl_tasks list; path: the file that holds it, for messages.
std::vector<IclTaskEntry> read_task_list(const YAML::Node& list, const std::string& path) {
  std::vector<IclTaskEntry> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < list.size(); i++) {
    MapReader r(list[i], fmt::format("icl_tasks[{}]", i), path);
    IclTaskEntry t;
    std::string type;
    for (const char* key : {"label", "dataset_uri", "icl_task_type"})
      ANVIL_CHECK(r.has(key), "{}: icl_tasks[{}] has no {}", path, i, key);
    r.get("label", t.label);
    r.get("dataset_uri", t.dataset_uri);
    r.get("icl_task_type", type);
    const std::string where = fmt::format("{}: icl_tasks[{}] ({})", path, i, t.label);
    t.spec.type = icl_task_type_named(type, where);
    const YAML::Node shots = r.raw("num_fewshot");
    ANVIL_CHECK(shots && shots.IsSequence() && shots.size() > 0, "{}: num_fewshot must be a list of shot counts, as "
                "in LLM Foundry's task files (num_fewshot: [0])", where);
    for (const YAML::Node& n : shots) {
      int k = -1;
      try {
        k = n.as<int>();
      } catch (const YAML::Exception&) {
      }
      ANVIL_CHECK(k >= 0, "{}: num_fewshot holds '{}' (expected counts of 0 or more)", where, n.Scalar());
      t.num_fewshot.push_back(k);
    }
    r.get("prompt_string", t.spec.prompt_string);
    r.get("example_delimiter", t.spec.example_delimiter);
    r.get("continuation_delimiter", t.spec.continuation_delimiter);
    ANVIL_CHECK(!(r.has("prelimiter") && r.has("question_prelimiter")), "{}: give prelimiter or question_prelimiter, "
                "not both", where);
    r.get("prelimiter", t.spec.prelimiter);
    r.get("question_prelimiter", t.spec.prelimiter);
    r.get("fewshot_random_seed", t.spec.fewshot_random_seed);
    r.get("strip_dataset", t.spec.strip_dataset);
    r.get("has_categories", t.has_categories);
    // Keys of generation tasks alone, as Foundry's other task types take no such argument.
    for (const char* key : {"cot_delimiter", "early_stopping_criteria", "do_normalization"})
      ANVIL_CHECK(t.spec.type == IclTaskType::kGenerationWithAnswers || !r.has(key), "{}: {} is a key of "
                  "generation_task_with_answers tasks, not of {} ones", where, key, type);
    r.get("cot_delimiter", t.spec.cot_delimiter);
    r.get("do_normalization", t.spec.do_normalization);
    if (r.has("early_stopping_criteria")) {
      const YAML::Node stops = r.raw("early_stopping_criteria");
      ANVIL_CHECK(stops.IsSequence(), "{}: early_stopping_criteria must be a list of strings", where);
      for (const YAML::Node& stop : stops) {
        ANVIL_CHECK(stop.IsScalar(), "{}: early_stopping_criteria must be a list of strings", where);
        t.spec.early_stopping_criteria.push_back(stop.Scalar());
      }
      check_icl_stop_strings(t.spec, where);
    }
    read_generation_kwargs(r, t.spec, where);
    r.get("batch_size", t.batch_size);
    r.get("max_seq_len", t.max_seq_len);
    ANVIL_CHECK(t.batch_size >= 0, "{}: batch_size = {} must be positive", where, t.batch_size);
    ANVIL_CHECK(t.max_seq_len >= 0, "{}: max_seq_len = {} must be positive", where, t.max_seq_len);
    if (r.has("metric_names")) {
      const YAML::Node m = r.raw("metric_names");
      const std::string expected = metric_of(t.spec.type);
      ANVIL_CHECK(m.IsSequence() && m.size() == 1 && m[0].Scalar() == expected, "{}: metric_names = {}: anvil computes "
                  "[{}] for {} tasks (Foundry's default)", where, YAML::Dump(m), expected, type);
    }
    // Foundry's other keys change what is read or scored in ways anvil does not reproduce yet.
    for (const char* key : {"context_key", "answer_key", "choices_key", "padding_size", "hf_loading_vars",
                            "hf_parsing_map", "tokenize_labels", "pad_tok_id"})
      ANVIL_CHECK(!list[i][key], "{}: {} is LLM Foundry's key, not honoured by anvil yet", where, key);
    r.finish();
    ANVIL_CHECK(seen.insert(t.label).second, "{}: the label '{}' is given twice", where, t.label);
    out.push_back(std::move(t));
  }
  ANVIL_CHECK(!out.empty(), "'{}': icl_tasks is empty", path);
  return out;
}

YAML::Node load_yaml_file(const std::string& path, const char* what) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ANVIL_FAIL("cannot read the {} file '{}': {}", what, path, e.what());
  }
}

}  // namespace

std::vector<IclTaskEntry> read_icl_tasks(const std::string& path) {
  const YAML::Node root = load_yaml_file(path, "task");
  ANVIL_CHECK(root.IsMap() && root["icl_tasks"] && root["icl_tasks"].IsSequence(),
              "'{}' has no icl_tasks list (LLM Foundry's task files hold one at the top level)", path);
  return read_task_list(root["icl_tasks"], path);
}

std::vector<IclTaskEntry> read_icl_tasks_setting(const std::string& yaml, const std::string& where) {
  const YAML::Node n = YAML::Load(yaml);
  return n.IsScalar() ? read_icl_tasks(n.Scalar()) : read_task_list(n, where);
}

// One evaluator's questions, as the model is to score them.
struct IclSuite::Job {
  std::string task;
  IclTaskSpec spec;
  int batch;  // questions per batch, as the task counts them (icl_subset_num_batches)
  std::vector<IclQuestion> questions;
  std::string benchmark;   // "label/N-shot" of a category's job, else ""
  int max_new_tokens = 0;  // generation
  // generation: each stop string's window, its tokens that decode to some text and one more.
  std::vector<size_t> stop_windows;
  // multiple_choice, schema: per question, the leading tokens its rows share, which run once
  // (Model::keep_prefix); no further than the first continuation's, as a row's scores read the
  // position before it.
  std::vector<int> shared;
};

namespace {

int shared_prefix(const IclQuestion& q) {
  size_t shared = q.rows[0].tokens.size();
  for (const IclRow& r : q.rows) {
    shared = std::min(shared, static_cast<size_t>(r.continuation_begin) - 1);
    size_t k = 0;
    while (k < shared && r.tokens[k] == q.rows[0].tokens[k]) k++;
    shared = k;
  }
  return static_cast<int>(shared);
}

// How many of n questions rank takes (i % world == rank).
int64_t share_of(int64_t n, const IclShare& share) {
  return n > share.rank ? (n - share.rank + share.world - 1) / share.world : 0;
}

// A greedy prediction: the index of the largest of n logits, the first of equal maxima (as
// torch.argmax).
int32_t first_max(const float* logits, size_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// The model's greedy prediction after position t of the last forward pass's last sequence.
int32_t greedy_token(const Model& model, int t, int vocab_size, std::vector<float>& row) {
  row.resize(static_cast<size_t>(vocab_size));
  op_copy_to_host(model.kernels(), row.data(), model.logits() + static_cast<size_t>(t) * vocab_size,
                  row.size() * sizeof(float));
  return first_max(row.data(), row.size());
}

}  // namespace

std::vector<std::vector<IclExample>> read_icl_task_examples(const std::vector<IclTaskEntry>& tasks) {
  std::vector<std::vector<IclExample>> out;
  for (const IclTaskEntry& t : tasks)
    out.push_back(read_icl_examples(t.dataset_uri, t.spec.type, t.spec.strip_dataset, t.has_categories));
  return out;
}

IclSuite::IclSuite(const std::vector<IclTaskEntry>& tasks, const std::vector<std::vector<IclExample>>& task_examples,
                   Tokenizer& tok, int vocab_size, const IclSuiteOptions& opt)
    : tok_(tok), vocab_size_(vocab_size), prefix_space_(tokenizer_needs_prefix_space(tok)) {
  ANVIL_CHECK(task_examples.size() == tasks.size(), "ICL: {} tasks and {} example lists", tasks.size(),
              task_examples.size());
  ANVIL_CHECK(tok.eos_id() >= 0 && tok.eos_id() < vocab_size, "the tokenizer's EOS id {} (the ICL rows' padding) "
              "is outside the model's vocab_size {}", tok.eos_id(), vocab_size);
  for (size_t ti = 0; ti < tasks.size(); ti++) {
    const IclTaskEntry& t = tasks[ti];
    const int L = t.max_seq_len > 0 ? t.max_seq_len : opt.max_seq_len;
    ANVIL_CHECK(L <= opt.longest, "task {}: max_seq_len {} is longer than the model's {}", t.label, L, opt.longest);
    const std::vector<IclExample>& all = task_examples[ti];
    // Foundry evaluates each category as a dataset of its own: its rows in file order, its own
    // few-shot pool and generator.
    std::map<std::string, std::vector<IclExample>> parts;
    if (t.has_categories)
      for (const IclExample& e : all) parts[e.category].push_back(e);
    for (const int shots : t.num_fewshot) {
      IclTaskSpec spec = t.spec;
      spec.num_fewshot = shots;
      const std::string name = fmt::format("{}/{}-shot", t.label, shots);
      const int batch = t.batch_size > 0 ? t.batch_size : opt.batch;
      auto add = [&](const std::string& task, const std::vector<IclExample>& examples, const std::string& benchmark) {
        const std::string where = fmt::format("{} ({})", task, t.dataset_uri);
        // A generation's prompt leaves room for the longest answer (Foundry's padding_size).
        int prompt_len = L, answer_len = 0;
        if (spec.type == IclTaskType::kGenerationWithAnswers) {
          answer_len = icl_answer_tokens(spec, examples, tok);
          prompt_len = L - answer_len;
          ANVIL_CHECK(prompt_len > 0, "{}: answers of up to {} tokens leave no room for a prompt in max_seq_len {}",
                      where, answer_len, L);
        }
        std::vector<IclQuestionText> texts = icl_question_texts(spec, examples, prefix_space_);
        // Foundry's subset is the evaluator's first batches (a task with categories is whole).
        if (opt.subset_batches > 0 && benchmark.empty())
          texts.resize(std::min(texts.size(), static_cast<size_t>(opt.subset_batches) * static_cast<size_t>(batch)));
        Job j{task, spec, batch, tokenize_icl_questions(texts, tok, prompt_len, where), benchmark, 0, {}, {}};
        if (spec.type == IclTaskType::kGenerationWithAnswers) {
          // Foundry generates at least one token, or generation_kwargs' max_new_tokens.
          j.max_new_tokens = spec.max_new_tokens > 0 ? spec.max_new_tokens : std::max(answer_len, 1);
          for (const int32_t id : spec.eos_ids)
            ANVIL_CHECK(id < vocab_size, "{}: generation_kwargs.eos_token_id {} is outside the model's vocab_size {}",
                        where, id, vocab_size);
          for (const std::string& stop : spec.early_stopping_criteria) {
            size_t n = 1;
            for (const int32_t id : tok.encode(stop)) n += !tok.decode({id}).empty();
            j.stop_windows.push_back(n);
          }
        }
        if (spec.type == IclTaskType::kMultipleChoice || spec.type == IclTaskType::kSchema)
          for (const IclQuestion& q : j.questions) j.shared.push_back(shared_prefix(q));
        for (const IclQuestion& q : j.questions)
          for (const IclRow& r : q.rows) {
            // Every rank learns of a bad id here, not one rank in the middle of an evaluation.
            for (const int32_t id : r.tokens)
              ANVIL_CHECK(id >= 0 && id < vocab_size, "{}: the tokenizer gives id {}, outside the model's vocab_size "
                          "{}", where, id, vocab_size);
            const int len = static_cast<int>(r.tokens.size()) + j.max_new_tokens;
            ANVIL_CHECK(len <= opt.longest, "{}: a prompt of {} tokens and a generated one are longer than the "
                        "model's {} (answers of no tokens)", where, r.tokens.size(), opt.longest);
            max_len_ = std::max(max_len_, len);
          }
        max_batch_ = std::max(max_batch_, batch);
        jobs_.push_back(std::move(j));
      };
      if (!t.has_categories) add(name, all, "");
      for (const auto& [category, examples] : parts) add(name + "/" + category, examples, name);
    }
  }
}

IclSuite::~IclSuite() = default;

int64_t IclSuite::questions(const IclShare& share) const {
  int64_t n = 0;
  for (const Job& j : jobs_) n += share_of(static_cast<int64_t>(j.questions.size()), share);
  return n;
}

std::string IclSuite::generate(Model& model, const Job& job, const IclRow& prompt, bool lockstep) const {
  // Text as transformers decodes it: bytes that end inside a character as U+FFFD.
  const auto text_of = [&](const std::vector<int32_t>& ids) { return python_utf8_replace(tok_.decode(ids)); };
  const std::vector<std::string>& stops = job.spec.early_stopping_criteria;
  std::vector<int32_t> ids = prompt.tokens;
  std::vector<float> row;
  const size_t begin = ids.size();
  // The prompt but its last token runs once (Model::keep_prefix); each step runs the tokens after
  // it, on the CPU with the bits of the whole sequence.
  const int P = static_cast<int>(begin) - 1;
  if (P > 0) model.keep_prefix(ids.data(), P);
  else if (lockstep) model.forward(ids.data(), nullptr, 1, 1, nullptr);  // the pass a prefix takes elsewhere
  bool done = false;
  for (int n = 0; n < job.max_new_tokens && (!done || lockstep); n++) {
    const int T = static_cast<int>(ids.size()) - std::max(P, 0);
    if (P > 0) model.forward_after_prefix(ids.data() + P, nullptr, 1, T, nullptr);
    else model.forward(ids.data(), nullptr, 1, T, nullptr);
    if (done) continue;  // a pass the other ranks' generations need
    const int32_t next = greedy_token(model, T - 1, vocab_size_, row);
    const std::vector<int32_t>& eos = job.spec.eos_ids;
    if (eos.empty() ? next == tok_.eos_id() : std::find(eos.begin(), eos.end(), next) != eos.end()) {
      // transformers keeps the token it stopped at, and decoding skips it where it is the
      // tokenizer's own EOS (a special token).
      if (next != tok_.eos_id()) ids.push_back(next);
      done = true;
      continue;
    }
    ids.push_back(next);
    for (size_t k = 0; k < stops.size() && !done; k++) {
      const size_t w = std::min(job.stop_windows[k], ids.size());
      done = text_of(std::vector<int32_t>(ids.end() - static_cast<long>(w), ids.end())).find(stops[k]) !=
             std::string::npos;
    }
  }
  // The generated text; a BOS dropped as transformers' skip_special_tokens drops it (an EOS
  // ended the generation before it was kept), and a space before it where the tokenizer marks
  // word starts itself (SentencePiece's), as Composer's eval_forward adds one.
  std::vector<int32_t> generated;
  for (size_t i = begin; i < ids.size(); i++)
    if (ids[i] != tok_.bos_id()) generated.push_back(ids[i]);
  std::string text = text_of(generated);
  if (!prefix_space_) text.insert(text.begin(), ' ');
  return text;
}

int64_t IclSuite::score(Model& model, const Job& job, const IclShare& share, int max_rows, Progress* bar,
                        int64_t& done) const {
  const std::vector<IclQuestion>& questions = job.questions;
  const int64_t n = static_cast<int64_t>(questions.size());
  std::vector<size_t> mine;  // this rank's questions
  for (int64_t q = share.rank; q < n; q += share.world) mine.push_back(static_cast<size_t>(q));
  // Under lockstep, the passes of the rank with the most questions (or rows).
  int64_t most = static_cast<int64_t>(mine.size());
  if (share.lockstep) most = share_of(n, {0, share.world, true});
  const auto tick = [&] {
    if (bar) bar->update(++done, "");
  };
  int64_t right = 0;
  if (job.spec.type == IclTaskType::kGenerationWithAnswers) {
    for (int64_t k = 0; k < most; k++) {
      if (k >= static_cast<int64_t>(mine.size())) {
        generate(model, job, questions[0].rows[0], true);  // discarded
        continue;
      }
      const IclQuestion& q = questions[mine[k]];
      right += icl_generation_correct(job.spec, generate(model, job, q.rows[0], share.lockstep), q.answers);
      tick();
    }
    return right;
  }
  if (job.spec.type == IclTaskType::kLanguageModeling) {
    // A question is right when each continuation token is the model's greedy prediction. `batch`
    // questions a pass, padded at the end, the logits formed only where a continuation token is.
    const int batch = std::min(job.batch, max_rows);
    const int32_t pad = tok_.eos_id();
    const size_t V = static_cast<size_t>(vocab_size_);
    std::vector<int32_t> greedy;
    for (int64_t k0 = 0; k0 < most; k0 += batch) {
      std::vector<const IclRow*> rows;
      for (int64_t k = k0; k < std::min<int64_t>(k0 + batch, static_cast<int64_t>(mine.size())); k++)
        rows.push_back(&questions[mine[k]].rows[0]);
      const bool real = !rows.empty();
      if (!real) rows.push_back(&questions[0].rows[0]);  // a pass the other ranks need
      int T = 0;
      for (const IclRow* r : rows) T = std::max(T, static_cast<int>(r->tokens.size()));
      std::vector<int32_t> tokens(rows.size() * static_cast<size_t>(T), pad);
      std::vector<int64_t> wanted;
      for (size_t k = 0; k < rows.size(); k++) {
        std::copy(rows[k]->tokens.begin(), rows[k]->tokens.end(), tokens.begin() + static_cast<int64_t>(k) * T);
        for (size_t t = rows[k]->continuation_begin; t < rows[k]->tokens.size(); t++)
          wanted.push_back(static_cast<int64_t>(k) * T + static_cast<int64_t>(t) - 1);
      }
      greedy.resize(wanted.size());
      model.forward_logits(tokens.data(), static_cast<int>(rows.size()), T, wanted,
                           [&](size_t first, size_t count, const float* logits) {
                             for (size_t i = 0; i < count; i++) greedy[first + i] = first_max(logits + i * V, V);
                           });
      if (!real) continue;
      size_t at = 0;
      for (const IclRow* r : rows) {
        bool all = true;
        for (size_t t = r->continuation_begin; t < r->tokens.size(); t++, at++) all = all && greedy[at] == r->tokens[t];
        right += all;
        tick();
      }
    }
    return right;
  }
  // Each row's mean loss over its continuation. A question's rows begin alike (multiple_choice:
  // the whole context; schema: the prompt and few-shot examples): those tokens run once
  // (Model::keep_prefix), then `batch` rows' rest a pass, which on the CPU gives the bits of the
  // whole rows.
  const int batch = std::min(job.batch, max_rows);
  const auto passes_of = [&](size_t q) {
    return (job.shared[q] > 0) + (static_cast<int64_t>(questions[q].rows.size()) + batch - 1) / batch;
  };
  int64_t passes = 0;
  for (const size_t q : mine) passes += passes_of(q);
  if (share.lockstep)
    for (int rank = 0; rank < share.world; rank++) {
      int64_t theirs = 0;
      for (int64_t q = rank; q < n; q += share.world) theirs += passes_of(static_cast<size_t>(q));
      passes = std::max(passes, theirs);
    }
  const int32_t pad = tok_.eos_id();
  for (const size_t qi : mine) {
    const IclQuestion& q = questions[qi];
    const int P = job.shared[qi];
    if (P > 0) model.keep_prefix(q.rows[0].tokens.data(), P);
    std::vector<double> mean_loss(q.rows.size());
    for (size_t r0 = 0; r0 < q.rows.size(); r0 += batch) {
      const int b = static_cast<int>(std::min<size_t>(batch, q.rows.size() - r0));
      int T = 0;
      for (int k = 0; k < b; k++) T = std::max(T, static_cast<int>(q.rows[r0 + k].tokens.size()) - P);
      std::vector<int32_t> tokens(static_cast<size_t>(b) * T, pad), targets(tokens.size(), kIgnoreIndex);
      for (int k = 0; k < b; k++) {
        const IclRow& r = q.rows[r0 + k];
        std::copy(r.tokens.begin() + P, r.tokens.end(), tokens.begin() + static_cast<size_t>(k) * T);
        for (size_t t = r.continuation_begin; t < r.tokens.size(); t++)
          targets[static_cast<size_t>(k) * T + t - 1 - P] = r.tokens[t];
      }
      if (P > 0) model.forward_after_prefix(tokens.data(), targets.data(), b, T, nullptr);
      else model.forward(tokens.data(), targets.data(), b, T, nullptr);
      const float* losses = model.losses();
      for (int k = 0; k < b; k++) {
        const IclRow& r = q.rows[r0 + k];
        double sum = 0;
        for (size_t t = r.continuation_begin; t < r.tokens.size(); t++)
          sum += losses[static_cast<size_t>(k) * T + t - 1 - P];
        mean_loss[r0 + k] = sum / static_cast<double>(r.tokens.size() - r.continuation_begin);
      }
    }
    passes -= passes_of(qi);
    right += std::min_element(mean_loss.begin(), mean_loss.end()) - mean_loss.begin() == q.gold;
    tick();
  }
  for (; passes > 0; passes--) {  // passes the other ranks need
    const IclRow& r = questions[0].rows[0];
    model.forward(r.tokens.data(), nullptr, 1, static_cast<int>(r.tokens.size()), nullptr);
  }
  return right;
}

std::vector<int64_t> IclSuite::right_answers(Model& model, const IclShare& share, int max_rows, Progress* bar) const {
  ANVIL_CHECK(max_rows > 0, "an ICL forward pass needs room for a row");
  std::vector<int64_t> right;
  int64_t done = 0;
  for (const Job& j : jobs_) right.push_back(score(model, j, share, max_rows, bar, done));
  model.drop_prefix();  // the memory goes back to training
  return right;
}

std::vector<IclScore> IclSuite::scores(const std::vector<int64_t>& right) const {
  ANVIL_CHECK(right.size() == jobs_.size(), "ICL scores: {} counts for {} evaluators", right.size(), jobs_.size());
  std::vector<IclScore> out;
  std::map<std::string, std::pair<double, int>> category_sums;
  std::map<std::string, int64_t> category_questions;
  std::vector<std::string> benchmarks;
  for (size_t i = 0; i < jobs_.size(); i++) {
    const Job& j = jobs_[i];
    const int64_t n = static_cast<int64_t>(j.questions.size());
    out.push_back({j.task, metric_of(j.spec.type), static_cast<double>(right[i]) / static_cast<double>(n), n});
    if (!j.benchmark.empty()) {
      if (!category_sums.count(j.benchmark)) benchmarks.push_back(j.benchmark);
      category_sums[j.benchmark].first += out.back().accuracy;
      category_sums[j.benchmark].second++;
      category_questions[j.benchmark] += n;
    }
  }
  for (const std::string& b : benchmarks) {
    const auto [sum, count] = category_sums[b];
    const auto first = std::find_if(out.begin(), out.end(), [&](const IclScore& s) { return s.task.rfind(b + "/", 0) == 0; });
    out.insert(first, {b, first->metric, sum / count, category_questions[b], true});
  }
  return out;
}

std::vector<IclScore> evaluate_icl(const IclEvalOptions& opt) {
  ANVIL_CHECK(opt.batch > 0, "--batch must be positive");
  ANVIL_CHECK(opt.max_seq_len >= 0, "--max-seq-len must be positive");
  // The task files are read before the model, so that their errors come first.
  const std::vector<IclTaskEntry> tasks = read_icl_tasks(opt.tasks);
  const std::vector<std::vector<IclExample>> examples = read_icl_task_examples(tasks);
  const ModelWeights loaded = load_model_weights(opt.checkpoint);
  const ModelConfig& cfg = loaded.config;
  ANVIL_CHECK(opt.max_seq_len <= cfg.max_seq_len, "--max-seq-len {} is longer than the model's {}", opt.max_seq_len,
              cfg.max_seq_len);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(loaded.tokenizer);
  IclSuiteOptions so;
  so.batch = opt.batch;
  so.max_seq_len = opt.max_seq_len > 0 ? opt.max_seq_len : cfg.max_seq_len;
  so.longest = cfg.max_seq_len;
  const IclSuite suite(tasks, examples, *tok, cfg.vocab_size, so);
  std::unique_ptr<Model> model = make_model(cfg, suite.max_batch(), suite.max_len());
  std::copy(loaded.params.begin(), loaded.params.end(), model->params());
  if (cfg.has_lora()) model->set_base_weights(loaded.base);
  Progress bar("icl eval", suite.questions({}), "questions");
  const std::vector<int64_t> right = suite.right_answers(*model, {}, suite.max_batch(), &bar);
  bar.finish("");
  return suite.scores(right);
}

namespace {

// An eval_gauntlet section; path: the file that holds it, for messages.
GauntletSpec read_gauntlet_section(const YAML::Node& section, const std::string& path) {
  MapReader r(section, "eval_gauntlet", path);
  GauntletSpec g;
  std::string weighting = "EQUAL";
  r.get("weighting", weighting);
  r.get("subtract_random_baseline", g.subtract_random_baseline);
  r.get("rescale_accuracy", g.rescale_accuracy);
  if (weighting == "EQUAL") g.weighting = GauntletSpec::Weighting::kEqual;
  else if (weighting == "SAMPLE_SZ") g.weighting = GauntletSpec::Weighting::kSampleSize;
  else if (weighting == "LOG_SAMPLE_SZ") g.weighting = GauntletSpec::Weighting::kLogSampleSize;
  else ANVIL_FAIL("{}: eval_gauntlet.weighting = {} must be EQUAL, SAMPLE_SZ or LOG_SAMPLE_SZ", path, weighting);
  ANVIL_CHECK(g.subtract_random_baseline || !g.rescale_accuracy, "{}: eval_gauntlet.rescale_accuracy needs "
              "subtract_random_baseline (as in LLM Foundry)", path);
  const YAML::Node categories = r.raw("categories");
  ANVIL_CHECK(categories && categories.IsSequence() && categories.size() > 0, "{}: eval_gauntlet.categories must be "
              "a list of categories", path);
  for (size_t c = 0; c < categories.size(); c++) {
    MapReader cr(categories[c], fmt::format("eval_gauntlet.categories[{}]", c), path);
    GauntletSpec::Category cat;
    cr.get("name", cat.name);
    ANVIL_CHECK(!cat.name.empty(), "{}: eval_gauntlet.categories[{}] has no name", path, c);
    const YAML::Node benchmarks = cr.raw("benchmarks");
    ANVIL_CHECK(benchmarks && benchmarks.IsSequence() && benchmarks.size() > 0, "{}: category {}: benchmarks must be "
                "a list", path, cat.name);
    for (size_t b = 0; b < benchmarks.size(); b++) {
      MapReader br(benchmarks[b], fmt::format("eval_gauntlet.categories[{}].benchmarks[{}]", c, b), path);
      GauntletSpec::Benchmark bench{"", -1, -1};
      br.get("name", bench.name);
      br.get("num_fewshot", bench.num_fewshot);
      br.get("random_baseline", bench.random_baseline);
      br.finish();
      ANVIL_CHECK(!bench.name.empty() && bench.num_fewshot >= 0 && bench.random_baseline >= 0 &&
                      bench.random_baseline < 1,
                  "{}: category {}, benchmark {}: name, num_fewshot (0 or more) and random_baseline (0 to below 1) are "
                  "required", path, cat.name, b);
      cat.benchmarks.push_back(bench);
    }
    cr.finish();
    g.categories.push_back(std::move(cat));
  }
  auto is_category = [&](const std::string& n) {
    return std::any_of(g.categories.begin(), g.categories.end(), [&](const auto& c) { return c.name == n; });
  };
  if (r.has("averages")) {
    const YAML::Node averages = r.raw("averages");
    ANVIL_CHECK(averages.IsMap(), "{}: eval_gauntlet.averages must map names to lists of categories", path);
    for (auto it = averages.begin(); it != averages.end(); ++it) {
      const std::string avg = it->first.as<std::string>();
      ANVIL_CHECK(!is_category(avg), "{}: the average {} has a category's name", path, avg);
      ANVIL_CHECK(it->second.IsSequence(), "{}: eval_gauntlet.averages.{} must be a list of categories", path, avg);
      std::vector<std::string> members;
      for (const YAML::Node& m : it->second) {
        ANVIL_CHECK(is_category(m.Scalar()), "{}: eval_gauntlet.averages.{} names '{}', which is not a category", path,
                    avg, m.Scalar());
        members.push_back(m.Scalar());
      }
      g.averages.emplace_back(avg, std::move(members));
    }
  }
  r.finish();
  return g;
}

}  // namespace

GauntletSpec read_gauntlet(const std::string& path) {
  const YAML::Node root = load_yaml_file(path, "gauntlet");
  ANVIL_CHECK(root.IsMap() && root["eval_gauntlet"], "'{}' has no eval_gauntlet section (LLM Foundry's gauntlet files "
              "hold one at the top level)", path);
  return read_gauntlet_section(root["eval_gauntlet"], path);
}

GauntletSpec read_gauntlet_setting(const std::string& yaml, const std::string& where) {
  const YAML::Node n = YAML::Load(yaml);
  return n.IsScalar() ? read_gauntlet(n.Scalar()) : read_gauntlet_section(n, where);
}

Gauntlet eval_gauntlet(const GauntletSpec& spec, const std::vector<IclScore>& scores) {
  Gauntlet g;
  for (const GauntletSpec::Category& cat : spec.categories) {
    double sum = 0, weights = 0;
    std::string missing;
    for (const GauntletSpec::Benchmark& b : cat.benchmarks) {
      const std::string key = fmt::format("{}/{}-shot", b.name, b.num_fewshot);
      // The benchmark's accuracy: its line (a task with categories: their mean's line).
      const auto it = std::find_if(scores.begin(), scores.end(), [&](const IclScore& s) { return s.task == key; });
      if (it == scores.end()) {
        if (missing.empty()) missing = key;
        continue;
      }
      double score = it->accuracy;
      if (spec.subtract_random_baseline) score -= b.random_baseline;
      if (spec.rescale_accuracy) score /= 1 - b.random_baseline;
      // Weighted by the questions of the benchmark's evaluators (its categories', if it has them).
      int64_t questions = 0;
      for (const IclScore& s : scores)
        if (!s.mean_of_categories && (s.task == key || s.task.rfind(key + "/", 0) == 0)) questions += s.questions;
      const double n = static_cast<double>(questions);
      const double w = spec.weighting == GauntletSpec::Weighting::kEqual        ? 1.0
                       : spec.weighting == GauntletSpec::Weighting::kSampleSize ? std::max(n, 1.0)
                                                                                 : std::max(std::log2(n), 1.0);
      sum += score * w;
      weights += w;
    }
    if (!missing.empty()) g.dropped.push_back(fmt::format("{}: {} was not evaluated", cat.name, missing));
    else g.categories.push_back({cat.name, sum / weights});
  }
  auto average_of = [&](const std::vector<std::string>& members) {
    double sum = 0;
    int count = 0;
    for (const GauntletScore& c : g.categories)
      if (std::find(members.begin(), members.end(), c.name) != members.end()) sum += c.score, count++;
    return count ? sum / count : 0.0;
  };
  if (spec.averages.empty()) {
    std::vector<std::string> all;
    for (const GauntletSpec::Category& c : spec.categories) all.push_back(c.name);
    g.averages.push_back({"default_average", average_of(all)});
  }
  for (const auto& [name, members] : spec.averages) g.averages.push_back({name, average_of(members)});
  return g;
}

}  // namespace anvil
