// Progress lines: updated in place on a terminal, throttled plain lines in a log, silent with MEMGATE_PROGRESS=0.
#include "memgate/base/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace memgate {
namespace {

// What a Progress wrote into a temporary stream.
std::string written(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<char>(c));
  return out;
}

TEST(ProgressTest, ATerminalGetsOneLineRewrittenInPlace) {
  ::unsetenv("MEMGATE_PROGRESS");
  std::FILE* f = std::tmpfile();
  {
    Progress p(f, /*terminal=*/true);
    EXPECT_TRUE(p.enabled());
    p.update("vit bs 8 (1/2)", "measured step: backward");
    p.done("vit bs 8: step peak 1.0 GiB");
  }
  const auto out = written(f);
  EXPECT_EQ(out.rfind("\r\033[K[memgate] vit bs 8 (1/2): measured step: backward (0 s)", 0), 0U) << out;
  EXPECT_NE(out.find("\r\033[K[memgate] vit bs 8: step peak 1.0 GiB\n"), std::string::npos) << out;
  std::fclose(f);
}

TEST(ProgressTest, ALogGetsTheDoneLinesAndNoUpdateWithinTwoSeconds) {
  ::unsetenv("MEMGATE_PROGRESS");
  std::FILE* f = std::tmpfile();
  {
    Progress p(f, /*terminal=*/false);
    for (int i = 0; i < 100; ++i) p.update("gpt bs 1 (1/1)", "eval forward");
    p.done("gpt bs 1: step peak 2 MiB");
  }
  EXPECT_EQ(written(f), "[memgate] gpt bs 1: step peak 2 MiB\n") << "a short item prints only its result";
  std::fclose(f);
}

TEST(ProgressTest, MemgateProgressZeroSilencesIt) {
  ::setenv("MEMGATE_PROGRESS", "0", 1);
  std::FILE* f = std::tmpfile();
  {
    Progress p(f, /*terminal=*/true);
    EXPECT_FALSE(p.enabled());
    p.update("x");
    p.done("y");
  }
  EXPECT_EQ(written(f), "");
  std::fclose(f);
  ::unsetenv("MEMGATE_PROGRESS");
}

}  // namespace
}  // namespace memgate
