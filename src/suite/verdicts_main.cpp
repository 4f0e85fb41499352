// The memory suites' component tests: one GoogleTest per fixture x batch size x component (and per budget), each
// reporting the verdict its fixture's measuring test left (memory_suite.cpp). No LibTorch: a test costs a few
// milliseconds. Installed as memgate-verdicts, shared by every memory-suite executable. CTest runs it as
//   memgate-verdicts --memgate_verdicts=<file> --memgate_test=<Suite.Name> --memgate_batch=<N>
//       (--memgate_component=<component> | --memgate_budget=<gpu>)
// and it registers exactly that one test, so a missing or unreadable verdict fails instead of running nothing.
#include "memgate/base/error.h"
#include "memgate/base/status.h"
#include "memgate/base/verdict_file.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

namespace memgate {
namespace {

struct Case {
  std::string verdicts;   ///< the measuring test's file
  std::string suite;      ///< the GoogleTest suite name: Cpu/ComponentTest
  std::string name;       ///< the test name: StaysWithinBaseline/vit_tiny_lora_bs8_params
  std::int64_t batch_size = 0;
  std::string component;  ///< a component, or the GPU of a budget
  bool budget = false;
  [[nodiscard]] std::string full_name() const { return suite + "." + name; }
};

// One line per test into $MEMGATE_RESULTS (JSON lines), for `memgate summary`.
void record_result(const nlohmann::json& row) {
  const char* path = std::getenv("MEMGATE_RESULTS");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::app);
  out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

class VerdictTest : public ::testing::Test {
 public:
  explicit VerdictTest(Case c) : c_(std::move(c)) {}

  void TestBody() override {
    if (update_mode()) GTEST_SKIP() << "update mode: the measuring test records the baselines, there is nothing to judge";
    VerdictFile file;
    try {
      file = read_verdict_file(c_.verdicts);
    } catch (const Error& e) {
      FAIL() << e.what() << "\n  its measuring test writes it: run this test through ctest, which runs that first";
    }
    if (file.error) FAIL() << file.fixture << " could not be judged: " << *file.error;
    if (file.skipped) GTEST_SKIP() << *file.skipped;
    const auto* v = c_.budget ? file.find_budget(c_.batch_size, c_.component) : file.find(c_.batch_size, c_.component);
    ASSERT_NE(v, nullptr) << c_.verdicts << " has no verdict for " << (c_.budget ? "the budget on " : "")
                          << c_.component << " at batch " << c_.batch_size
                          << ": the suite changed since it was listed; run ctest again";
    if (!c_.budget) {
      nlohmann::json row = {{"test", c_.full_name()}, {"fixture", file.fixture}, {"batch_size", c_.batch_size},
                            {"component", c_.component}, {"device", file.device},
                            {"status", name_of(kStatusNames, v->status)}};
      if (v->baseline) row["baseline"] = *v->baseline;
      if (v->measured) row["measured"] = *v->measured;
      if (v->allowed) row["allowed"] = *v->allowed;
      record_result(row);
    }
    if (v->baseline) RecordProperty("baseline_bytes", std::to_string(*v->baseline));
    if (v->measured) RecordProperty("measured_bytes", std::to_string(*v->measured));
    const bool strict = strict_mode();
    switch (v->status) {
      case Status::kOk:
        if (c_.budget) std::cout << v->message << "\n";
        break;
      case Status::kMissing:
        if (missing_fails(strict)) {
          FAIL() << v->message << (strict ? " (strict mode)" : " (under CI, CI=true: a gate that compared nothing is "
                                                              "not a pass; MEMGATE_STRICT=0 lets it skip)");
        }
        GTEST_SKIP() << v->message;
      case Status::kStale:
        if (strict) ADD_FAILURE() << v->message << "\n  (MEMGATE_STRICT=1 fails stale baselines)";
        else std::cout << "[ NOTICE   ] " << v->message << "\n";
        break;
      default: ADD_FAILURE() << v->message;
    }
  }

 private:
  Case c_;
};

std::optional<Case> parse(int argc, char** argv, std::string& error) {
  Case c;
  std::string test;
  std::string batch;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string_view flag, std::string& into) {
      if (!arg.starts_with(flag)) return false;
      into = std::string(arg.substr(flag.size()));
      return true;
    };
    std::string budget;
    if (value("--memgate_verdicts=", c.verdicts) || value("--memgate_test=", test) ||
        value("--memgate_batch=", batch) || value("--memgate_component=", c.component)) {
      continue;
    }
    if (value("--memgate_budget=", budget)) {
      c.component = budget;
      c.budget = true;
      continue;
    }
    if (arg.starts_with("--memgate_")) {
      error = "unknown flag " + std::string(arg);
      return std::nullopt;
    }
  }
  const auto dot = test.find('.');
  const auto [end, ec] = std::from_chars(batch.data(), batch.data() + batch.size(), c.batch_size);
  if (c.verdicts.empty() || dot == std::string::npos || c.component.empty() || ec != std::errc() ||
      end != batch.data() + batch.size() || c.batch_size < 1) {
    error = "expected --memgate_verdicts=<file> --memgate_test=<Suite.Name> --memgate_batch=<N >= 1> and "
            "--memgate_component=<component> or --memgate_budget=<gpu>";
    return std::nullopt;
  }
  c.suite = test.substr(0, dot);
  c.name = test.substr(dot + 1);
  return c;
}

}  // namespace
}  // namespace memgate

int main(int argc, char** argv) {
  try {
    memgate::check_env_switches();  // MEMGATE_STRICT=maybe: said once, as the program's error, before any test
  } catch (const memgate::Error& e) {
    std::cerr << "memgate: " << e.what() << "\n";
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  std::string error;
  const auto c = memgate::parse(argc, argv, error);
  if (!c) {
    std::cerr << argv[0] << ": " << error << "\n";
    return 2;
  }
  ::testing::RegisterTest(c->suite.c_str(), c->name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [c]() -> ::testing::Test* { return new memgate::VerdictTest(*c); });
  return RUN_ALL_TESTS();
}
