// The Jinja interpreter in-process (the byte-for-byte comparison with Jinja2 is
// tests/data/test_chat_template.sh): every language case of tests/data/jinja_cases.json renders or
// is refused with an Error (under the sanitizers in CI too), a few renderings whose Jinja2 output
// is known, and syntax errors that name their line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "data/jinja.h"

namespace anvil::jinja {
namespace {
using ojson = nlohmann::ordered_json;

std::string render(const std::string& source, const ojson& variables = ojson::object()) {
  return Template(source, "t").render(variables);
}

std::string error_of(const std::string& source, const ojson& variables = ojson::object()) {
  try {
    render(source, variables);
  } catch (const Error& e) {
    return e.what();
  }
  return "rendered";
}

TEST(Jinja, EveryLanguageCaseRendersOrIsRefusedCleanly) {
  const char* src = std::getenv("ANVIL_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ANVIL_SOURCE_DIR names the source tree (ctest sets it)";
  const ojson cases = ojson::parse(read_file(std::string(src) + "/tests/data/jinja_cases.json", "cases"));
  ASSERT_GE(cases.size(), 30u);
  const Dict globals = {{"strftime_now", Value::function("strftime_now", [](Args&) { return Value("2026"); })},
                        {"raise_exception", Value::function("raise_exception", [](Args& a) -> Value {
                           ANVIL_FAIL("raised: {}", a.positional.at(0).to_string());
                         })}};
  int rendered = 0;
  for (const ojson& c : cases) {
    try {
      Template t(c["template"].get<std::string>(), c["name"].get<std::string>());
      t.render(c["variables"], globals);
      rendered++;
    } catch (const Error&) {
    }
  }
  EXPECT_GE(rendered, static_cast<int>(cases.size()) - 8);
}

// Outputs as Jinja2 3.1 gives them in transformers' environment.
TEST(Jinja, KnownRenderings) {
  EXPECT_EQ(render("{% for x in xs %}\n  {{ x }}\n{% endfor %}\n", {{"xs", {1, 2}}}), "  1\n  2\n");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ -7 // 2 }}"),
            "[1, 'a', None, True]|0.30000000000000004|1e+16|-4");
  EXPECT_EQ(render("{{ {'b': [1, 2.5], 'a': 'é'} | tojson }}|{{ {'a': 'é'} | tojson(ensure_ascii=true) }}"),
            "{\"b\": [1, 2.5], \"a\": \"é\"}|{\"a\": \"\\u00e9\"}");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{{ 'héllo'[1:3] }}{{ 'abc'[::-1] }}{{ '  x '.strip() }}{{ 'a,b,c'.split(',', 1) }}"),
            "élcbax['a', 'b,c']");
  EXPECT_EQ(render("{% macro m(a, b=a) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"), "1112");
  // A namespace holding itself, a recursive macro: cycles the renderer breaks when it ends (the
  // sanitizers' leak check).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{% macro f(n) %}{{ n }}{% if n %}{{ f(n - 1) }}"
                   "{% endif %}{% endmacro %}{{ f(2) }}{{ d._meta }}", {{"d", {{"_meta", 7}}}}),
            "2107");
}

TEST(Jinja, ErrorsNameTheLine) {
  EXPECT_NE(error_of("a\n{% if x %}\nb").find("t line 3: the template ends inside a block: expected {% endif %}"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(error_of("\n{% include 'x' %}").find("t line 2: the statement {% include %} is not supported"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("'+' is not supported between a str and a int"), std::string::npos);
  EXPECT_NE(error_of("{% set l = [] %}{{ l.append(1) }}").find("forbids"), std::string::npos);
}

}  // namespace
}  // namespace anvil::jinja
