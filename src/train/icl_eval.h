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

struct IclEvalOptions {
  std::string checkpoint;  // a checkpoint or run directory, or a transformers directory
  std::string tasks;       // the YAML file of icl_tasks
  int batch = 8;           // rows per forward pass (does not change a score)
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
