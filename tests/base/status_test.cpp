// The gate's switches from the environment (base/status.h): which words of CI turn CI on, and when a missing baseline
// fails (strict, or under CI unless MEMGATE_STRICT=0 says otherwise).
#include "memgate/base/error.h"
#include "memgate/base/status.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace memgate {
namespace {

// Sets an environment variable for one test (nullptr: unsets it), and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) {
    if (value != nullptr) ::setenv(name_, value, 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// CI as GitHub Actions, GitLab CI, Buildkite, CircleCI and Travis set it, in any case; any other word is not CI.
TEST(StatusTest, CiIsTheWordsCiSystemsSetInAnyCase) {
  ScopedEnv ci("CI", nullptr);
  EXPECT_FALSE(ci_environment()) << "unset";
  for (const char* on : {"true", "1", "TRUE", "yes", "On"}) {
    ci.set(on);
    EXPECT_TRUE(ci_environment()) << "CI=" << on;
  }
  for (const char* off : {"false", "0", "", "woodpecker"}) {
    ci.set(off);
    EXPECT_FALSE(ci_environment()) << "CI=" << off;
  }
}

// A missing baseline passes on a desk, fails in strict mode and under CI (a gate that compared nothing is not a pass
// there), and MEMGATE_STRICT=0 lets it pass under CI; a stale one fails in strict mode only.
TEST(StatusTest, AMissingBaselineFailsStrictOrUnderCiUnlessStrictIsOff) {
  ScopedEnv ci("CI", nullptr), strict("MEMGATE_STRICT", nullptr);
  EXPECT_FALSE(fails(Status::kMissing, false));
  EXPECT_TRUE(fails(Status::kMissing, true));
  for (const char* on : {"true", "1", "TRUE", "yes"}) {
    ci.set(on);
    EXPECT_TRUE(missing_fails(false)) << "CI=" << on;
    EXPECT_TRUE(fails(Status::kMissing, false)) << "CI=" << on;
  }
  ci.set("false");
  EXPECT_FALSE(fails(Status::kMissing, false));
  ci.set("true");
  strict.set("0");
  EXPECT_FALSE(fails(Status::kMissing, false)) << "MEMGATE_STRICT=0 lets it pass under CI";
  EXPECT_FALSE(strict_mode());
  strict.set("1");
  EXPECT_TRUE(strict_mode());
  ci.set(nullptr);
  EXPECT_TRUE(fails(Status::kMissing, false)) << "MEMGATE_STRICT=1 alone";
  EXPECT_FALSE(fails(Status::kStale, false));
  EXPECT_TRUE(fails(Status::kStale, true));
  strict.set("maybe");
  EXPECT_THROW((void)strict_mode(), Error) << "a word that is neither on nor off";
}

}  // namespace
}  // namespace memgate
