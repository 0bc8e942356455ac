// The KILN_* environment (core/env.h): values are checked strictly, unknown names are reported.
#include <algorithm>

#include "core/env.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::ScopedEnv;

TEST(Env, FlagsAreOneOrZero) {
  {
    ScopedEnv e("KILN_LAUNCH_BLOCKING", "1");
    EXPECT_TRUE(env::flag("KILN_LAUNCH_BLOCKING"));
  }
  {
    ScopedEnv e("KILN_LAUNCH_BLOCKING", "0");
    EXPECT_FALSE(env::flag("KILN_LAUNCH_BLOCKING"));
  }
  for (const char* bad : {"yes", "true", "2", " 1"}) {
    ScopedEnv e("KILN_LAUNCH_BLOCKING", bad);
    test::expect_error([] { env::flag("KILN_LAUNCH_BLOCKING"); },
                       {"[env] KILN_LAUNCH_BLOCKING='", bad, "': expected 1 (on) or 0 (off)"});
  }
}

TEST(Env, NumbersAndChoicesAreChecked) {
  {
    ScopedEnv e("KILN_MAX_PENDING", "64");
    EXPECT_EQ(env::positive_int("KILN_MAX_PENDING"), 64u);
  }
  for (const char* bad : {"0", "-3", "abc", "12x", "99999999999999999999999"}) {
    ScopedEnv e("KILN_MAX_PENDING", bad);
    test::expect_error([] { env::positive_int("KILN_MAX_PENDING"); }, {"KILN_MAX_PENDING", "positive whole number"});
  }
  for (const char* bad : {"soon", "0", "nan", "inf"}) {
    ScopedEnv e("KILN_COLLECTIVE_TIMEOUT", bad);
    test::expect_error([] { env::positive_number("KILN_COLLECTIVE_TIMEOUT"); },
                       {"KILN_COLLECTIVE_TIMEOUT", "positive number"});
  }
  {
    ScopedEnv e("KILN_GEMM", "mkl");
    test::expect_error([] { env::choice("KILN_GEMM"); }, {"KILN_GEMM='mkl': expected one of 'onednn', 'openblas'"});
  }
  EXPECT_FALSE(env::positive_int("KILN_DEFER_MAX_NODES").has_value());  // unset
}

TEST(Env, CheckAllValidatesEveryVariableAndNamesUnknownOnes) {
  {
    ScopedEnv typo("KILN_DEFER_AND_FUZE", "1");
    const auto unknown = env::check_all();
    EXPECT_NE(std::find(unknown.begin(), unknown.end(), "KILN_DEFER_AND_FUZE"), unknown.end());
  }
  ScopedEnv bad("KILN_DEFER_LOG", "9");
  test::expect_error([] { env::check_all(); }, {"KILN_DEFER_LOG='9'"});
}

}  // namespace
}  // namespace kiln
