// In this suite a skipped test is a failed test. GoogleTest exits 0 when a test skips, and
// gtest_discover_tests marks the "[  SKIPPED ]" line as a CTest skip, which CTest reports but
// never fails on (no test property can outrank that mark): a test that skips checks nothing
// while the run stays green. A test that cannot check its feature on some machine must check
// what that machine does instead (the prepack tests check that nothing is packed), or not run
// there (TwoRanks.* run only under mpirun, tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>

namespace {

class SkippedTestsFail : public testing::EmptyTestEventListener {
  // GoogleTest calls OnTestEnd on the last-appended listener first, so this runs before the
  // default printer reports the test, while the test is still current: the failure added here
  // is recorded against it, and it is reported FAILED instead of SKIPPED.
  void OnTestEnd(const testing::TestInfo& info) override {
    if (!info.result()->Skipped()) return;
    std::string why;
    for (int i = 0; i < info.result()->total_part_count(); ++i) {
      const testing::TestPartResult& part = info.result()->GetTestPartResult(i);
      if (part.skipped()) why = part.message();
    }
    ADD_FAILURE() << "the test skipped (" << why << "); a skip must not pass";
  }
};

[[maybe_unused]] const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new SkippedTestsFail);
  return true;
}();

}  // namespace
