// Loss curves: `anvil plot` and the loss.png a run directory gets at the end of training, drawn
// with PLplot (Debian's libplplot and its cairo driver; optional at build time, as SentencePiece
// is, so that a machine without it still builds: the build then says it cannot plot).
#pragma once
#include <string>
#include <vector>

namespace anvil {

// One run's training loss, and eval loss where measured, against tokens seen.
struct LossCurve {
  std::string label;
  std::vector<double> tokens, loss;
  std::vector<double> eval_tokens, eval_loss;
};

// Reads RUN_DIR/metrics.jsonl (the label is the directory's name).
LossCurve read_loss_curve(const std::string& run_dir);

// Whether this build can draw: "" when it can, else why not.
std::string loss_plot_unavailable();

// Draws the runs on one figure (one colour each: loss solid, eval loss dashed with points) into
// a PNG of width x height pixels, written under a temporary name and renamed.
void plot_loss_curves(const std::vector<LossCurve>& runs, const std::string& png_path, int width = 1000,
                      int height = 600);

}  // namespace anvil
