#include "train/loss_plot.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#ifdef ANVIL_HAVE_PLPLOT
#include <plplot.h>
#endif

#include "core/error.h"

namespace anvil {
namespace fs = std::filesystem;

LossCurve read_loss_curve(const std::string& run_dir) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  ANVIL_CHECK(in.good(), "'{}' has no metrics.jsonl: is it a run directory (anvil train's run_dir)?", run_dir);
  LossCurve c;
  c.label = fs::path(run_dir).lexically_normal().filename().string();
  if (c.label.empty()) c.label = fs::path(run_dir).lexically_normal().parent_path().filename().string();
  std::map<int64_t, double> tokens_at{{0, 0.0}};
  std::vector<std::pair<int64_t, double>> evals;
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (line.empty()) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      ANVIL_FAIL("{}:{}: not a JSON object", path, n);
    }
    if (row.contains("loss") && row.contains("tokens") && row["loss"].is_number()) {
      c.tokens.push_back(row["tokens"].get<double>());
      c.loss.push_back(row["loss"].get<double>());
      tokens_at[row.value("step", int64_t{0})] = c.tokens.back();
    } else if (row.contains("eval_loss")) {
      evals.emplace_back(row.value("step", int64_t{0}), row["eval_loss"].get<double>());
    }
  }
  for (const auto& [step, loss] : evals) {
    const auto it = tokens_at.find(step);
    if (it == tokens_at.end()) continue;  // an eval of steps whose rows a resume cut back
    c.eval_tokens.push_back(it->second);
    c.eval_loss.push_back(loss);
  }
  ANVIL_CHECK(!c.loss.empty(), "{} holds no training steps yet", path);
  return c;
}

#ifdef ANVIL_HAVE_PLPLOT

std::string loss_plot_unavailable() {
  // plgDevs fills arrays its caller provides, of the length given in n.
  std::vector<const char*> menu_storage(256), name_storage(256);
  const char** menus = menu_storage.data();
  const char** names = name_storage.data();
  int n = static_cast<int>(name_storage.size());
  plgDevs(&menus, &names, &n);
  for (int i = 0; i < n; i++)
    if (std::string(names[i]) == "pngcairo") return "";
  return "PLplot has no pngcairo device (install plplot-driver-cairo; scripts/setup.sh does)";
}

void plot_loss_curves(const std::vector<LossCurve>& runs, const std::string& png_path, int width, int height) {
  ANVIL_CHECK(!runs.empty(), "nothing to plot");
  const std::string why = loss_plot_unavailable();
  ANVIL_CHECK(why.empty(), "cannot plot: {}", why);
  double x_max = 1, y_min = INFINITY, y_max = -INFINITY;
  for (const LossCurve& r : runs) {
    for (const std::vector<double>* v : {&r.tokens, &r.eval_tokens})
      if (!v->empty()) x_max = std::max(x_max, *std::max_element(v->begin(), v->end()));
    for (const std::vector<double>* v : {&r.loss, &r.eval_loss})
      for (double y : *v)
        if (std::isfinite(y)) y_min = std::min(y_min, y), y_max = std::max(y_max, y);
  }
  ANVIL_CHECK(std::isfinite(y_min), "the runs hold no finite loss to plot");
  const double pad = std::max(0.05 * (y_max - y_min), 0.01);
  const std::string tmp = fmt::format("{}.tmp.{}", png_path, ::getpid());
  { std::ofstream probe(tmp); ANVIL_CHECK(probe.good(), "cannot write '{}'", png_path); }

  // White page, black axes, then one colour per run (a colour-blind-safe palette).
  static constexpr int kPalette[][3] = {{0, 114, 178}, {230, 159, 0}, {0, 158, 115},
                                        {204, 121, 167}, {86, 180, 233}, {213, 94, 0}};
  plsdev("pngcairo");
  plsfnam(tmp.c_str());
  plspage(0, 0, width, height, 0, 0);
  plscolbg(255, 255, 255);
  plscol0(1, 0, 0, 0);
  for (int i = 0; i < 6; i++) plscol0(2 + i, kPalette[i][0], kPalette[i][1], kPalette[i][2]);
  plscol0(8, 220, 220, 220);
  plinit();
  plcol0(1);
  plschr(0, 0.8);
  plenv(0, x_max * 1.02, y_min - pad, y_max + pad, 0, -2);  // -2: the viewport only; axes drawn below
  plcol0(8);
  plbox("g", 0, 0, "g", 0, 0);  // a light grid at the major ticks
  plcol0(1);
  plbox("bcnst", 0, 0, "bcnstv", 0, 0);
  pllab("tokens", "loss", runs.size() == 1 ? runs[0].label.c_str() : "loss against tokens");

  std::vector<std::string> texts;
  std::vector<PLINT> opts, line_colors, line_styles, text_colors, box_colors, box_patterns, symbol_colors,
      symbol_numbers;
  std::vector<PLFLT> line_widths, box_scales, box_widths, symbol_scales;
  std::vector<const char*> symbols;
  for (size_t i = 0; i < runs.size(); i++) {
    const LossCurve& r = runs[i];
    const PLINT colour = 2 + static_cast<PLINT>(i % 6);
    plcol0(colour);
    plwidth(2);
    pllsty(1);
    plline(static_cast<PLINT>(r.tokens.size()), r.tokens.data(), r.loss.data());
    auto entry = [&](const std::string& text, PLINT style, PLINT symbol_count) {
      texts.push_back(text);
      opts.push_back(PL_LEGEND_LINE | (symbol_count > 0 ? PL_LEGEND_SYMBOL : 0));
      line_colors.push_back(colour);
      line_styles.push_back(style);
      line_widths.push_back(2);
      text_colors.push_back(1);
      box_colors.push_back(0);
      box_patterns.push_back(0);
      box_scales.push_back(0);
      box_widths.push_back(0);
      symbol_colors.push_back(colour);
      symbol_scales.push_back(1.0);
      symbol_numbers.push_back(symbol_count);
      symbols.push_back("#(228)");  // an asterisk, in PLplot's Hershey escapes
    };
    entry(runs.size() == 1 ? "loss" : r.label + " loss", 1, 0);
    if (!r.eval_loss.empty()) {
      pllsty(2);
      plline(static_cast<PLINT>(r.eval_tokens.size()), r.eval_tokens.data(), r.eval_loss.data());
      plstring(static_cast<PLINT>(r.eval_tokens.size()), r.eval_tokens.data(), r.eval_loss.data(), "#(228)");
      entry(runs.size() == 1 ? "eval loss" : r.label + " eval loss", 2, 1);
    }
  }
  std::vector<const char*> text_ptrs;
  for (const std::string& t : texts) text_ptrs.push_back(t.c_str());
  PLFLT legend_width = 0, legend_height = 0;
  pllsty(1);
  plwidth(1);
  pllegend(&legend_width, &legend_height, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
           PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE, 0.02, 0.02, 0.08, 0, 1, 1, 0, 0,
           static_cast<PLINT>(texts.size()), opts.data(), 1.0, 0.9, 2.0, 0.0, text_colors.data(), text_ptrs.data(),
           box_colors.data(), box_patterns.data(), box_scales.data(), box_widths.data(), line_colors.data(),
           line_styles.data(), line_widths.data(), symbol_colors.data(), symbol_scales.data(), symbol_numbers.data(),
           symbols.data());
  plend();
  std::error_code ec;
  ANVIL_CHECK(fs::file_size(tmp, ec) > 0 && !ec, "PLplot wrote no image to '{}'", tmp);
  fs::rename(tmp, png_path);
}

#else

std::string loss_plot_unavailable() {
  return "this anvil was built without PLplot (install libplplot-dev and plplot-driver-cairo, as scripts/setup.sh "
         "does, and build again)";
}

void plot_loss_curves(const std::vector<LossCurve>&, const std::string&, int, int) {
  ANVIL_FAIL("cannot plot: {}", loss_plot_unavailable());
}

#endif

}  // namespace anvil
