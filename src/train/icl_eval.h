// `anvil eval MODEL --icl TASKS.yaml`: LLM Foundry's in-context-learning tasks (its task files as
// published: an `icl_tasks:` list of label, dataset_uri, num_fewshot, icl_task_type and the
// prompt keys) scored as Foundry's metrics score them. multiple_choice and schema: a question is
// right when its gold choice's continuation has the lowest mean negative log-probability per
// token (the first such choice on ties); language_modeling: when every continuation token is
// the model's greedy prediction; generation_task_with_answers: when the greedy generation, cut
// as Foundry cuts it, starts with one of the answers. docs/eval.md says where each rule comes
// from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/icl.h"

namespace anvil {

// One entry of icl_tasks.
struct IclTaskEntry {
  std::string label, dataset_uri;
  std::vector<int> num_fewshot;
  IclTaskSpec spec;  // num_fewshot set per evaluation
  bool has_categories = false;
  int batch_size = 0;   // rows per forward pass; 0: the command's
  int max_seq_len = 0;  // 0: the command's, else the model's
};

// The icl_tasks of a YAML file (Foundry's task files: a top-level `icl_tasks:` list). A key
// Foundry does not know, or one anvil does not honour yet, is an error naming it.
std::vector<IclTaskEntry> read_icl_tasks(const std::string& path);
// A training config's icl_tasks (config/train_config.h: YAML text, a task file's path or the list
// itself, as Foundry's train.py takes either); `where` names the setting in errors.
std::vector<IclTaskEntry> read_icl_tasks_setting(const std::string& yaml, const std::string& where);

struct IclEvalOptions {
  std::string checkpoint;  // a checkpoint or run directory, or a transformers directory
  std::string tasks;       // the YAML file of icl_tasks
  int batch = 8;           // rows per forward pass (on the CPU it does not change a score)
  int max_seq_len = 0;     // 0: the model's
};

// One evaluator's result: "label/N-shot" (and "/category" for a category of a task that has
// them), Foundry's metric name, the accuracy and the questions it is over. A task with categories
// also gets a "label/N-shot" line: the mean of its categories' accuracies, as Foundry's eval.py
// and gauntlet take it.
struct IclScore {
  std::string task, metric;
  double accuracy = 0;
  int64_t questions = 0;
  bool mean_of_categories = false;  // the line of a task with categories
};

// Which questions one rank scores: question i of each evaluator where i % world == rank, so that
// the right answers summed over ranks are the same for any world size (a question's score does
// not depend on the rows it shares a forward pass with). lockstep: every rank runs the same
// forward passes, in number (ZeRO-3 gathers each pass's parameters with every rank): a rank with
// fewer rows repeats one and discards it, and a generation runs its whole length.
struct IclShare {
  int rank = 0, world = 1;
  bool lockstep = false;
};

class Model;
class Progress;

struct IclSuiteOptions {
  int batch = 8;           // a task's batch_size where it gives none (Foundry's device_eval_batch_size)
  int max_seq_len = 0;     // a task's max_seq_len where it gives none (Foundry's icl_seq_len)
  int longest = 0;         // the most tokens a row may take: the model's context
  int subset_batches = 0;  // > 0: Foundry's icl_subset_num_batches
};

// Each task's examples (read_icl_examples), in the tasks' order.
std::vector<std::vector<IclExample>> read_icl_task_examples(const std::vector<IclTaskEntry>& tasks);

// Every evaluator of a list of tasks (each task at each shot count, each category apart), its
// questions tokenized as Foundry tokenizes them, ready for any model of the vocabulary. A task's
// batch_size and max_seq_len where it gives them, else the options'; subset_batches: a task
// without categories takes its first subset_batches × batch questions (counted over all ranks).
// The tokenizer must outlive the suite.
class IclSuite {
 public:
  IclSuite(const std::vector<IclTaskEntry>& tasks, const std::vector<std::vector<IclExample>>& examples,
           Tokenizer& tok, int vocab_size, const IclSuiteOptions& opt);
  ~IclSuite();
  // The longest row a forward pass takes (a generation's whole length), and the most rows.
  int max_len() const { return max_len_; }
  int max_batch() const { return max_batch_; }
  int64_t questions(const IclShare& share) const;
  // This rank's right answers, per evaluator; max_rows caps the rows of a forward pass (the
  // model's batch). bar (may be null) counts this rank's questions.
  std::vector<int64_t> right_answers(Model& model, const IclShare& share, int max_rows, Progress* bar) const;
  // The scores of right answers summed over the ranks.
  std::vector<IclScore> scores(const std::vector<int64_t>& right) const;

 private:
  struct Job;
  // Greedy generation after a prompt, as transformers' generate runs it for one question under
  // Foundry's stopping criteria: to the tokenizer's EOS, max_new_tokens, or the step where a stop
  // string shows in the decoded text of the sequence's last tokens (as many as the stop string's
  // tokens that decode to something, and one more: the prompt's end too, at the first steps).
  // The prompt but its last token runs once (Model::keep_prefix), each step the tokens after it.
  // lockstep: every pass of max_new_tokens run, those after the stop discarded.
  std::string generate(Model& model, const Job& job, const IclRow& prompt, bool lockstep) const;
  // How many of the job's questions in this rank's share the model gets right.
  int64_t score(Model& model, const Job& job, const IclShare& share, int max_rows, Progress* bar,
                int64_t& done) const;

  std::vector<Job> jobs_;
  Tokenizer& tok_;
  int vocab_size_ = 0;
  bool prefix_space_ = false;
  int max_len_ = 1, max_batch_ = 1;
};

std::vector<IclScore> evaluate_icl(const IclEvalOptions& opt);

// LLM Foundry's eval gauntlet (its eval_gauntlet YAML files as published: weighting,
// subtract_random_baseline, rescale_accuracy, averages, categories of benchmarks with
// num_fewshot and random_baseline) over the scores of evaluate_icl, computed as Foundry's
// EvalGauntlet callback computes it: each benchmark's accuracy (a task with categories: their
// mean) less its random baseline and over (1 - baseline), weighted within its category; a
// category missing any benchmark is left out (and named in `dropped`); each average is the mean
// of its categories that are present (without `averages`, one `default_average` of them all).
struct GauntletSpec {
  enum class Weighting { kEqual, kSampleSize, kLogSampleSize } weighting = Weighting::kEqual;
  bool subtract_random_baseline = true, rescale_accuracy = true;
  struct Benchmark {
    std::string name;
    int num_fewshot = 0;
    double random_baseline = 0;
  };
  struct Category {
    std::string name;
    std::vector<Benchmark> benchmarks;
  };
  std::vector<Category> categories;
  std::vector<std::pair<std::string, std::vector<std::string>>> averages;  // empty: default_average
};
GauntletSpec read_gauntlet(const std::string& path);
// A training config's eval_gauntlet (YAML text: a gauntlet file's path, or the section itself).
GauntletSpec read_gauntlet_setting(const std::string& yaml, const std::string& where);

struct GauntletScore {
  std::string name;  // a category or an average
  double score = 0;
};
struct Gauntlet {
  std::vector<GauntletScore> categories, averages;
  std::vector<std::string> dropped;  // "category: benchmark/N-shot was not evaluated"
};
Gauntlet eval_gauntlet(const GauntletSpec& spec, const std::vector<IclScore>& scores);

}  // namespace anvil
