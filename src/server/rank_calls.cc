#include "server/rank_calls.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "core/error.h"
#include "pipelines/call_arguments.h"

namespace kiln::server {

namespace {

// Thrown through a follower's pipeline when rank 0 stopped the call at a step boundary.
struct StoppedByRankZero {};

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown error";
  }
}

// One rank's answer to "did your checks pass?", fixed size for the all_gather.
struct CheckResult {
  int32_t passed = 0;
  char error[4092] = {};
};

}  // namespace

RankCalls::RankCalls(const DiffusionPipeline& pipe, const std::shared_ptr<ProcessGroup>& group)
    : pipe_(pipe), group_(group->duplicate()) {}

PipelineOutput RankCalls::run(const PipelineCallArgs& call) const {
  KILN_CHECK(group_->rank() == 0, "serve", group_->describe(), ": only rank 0 sends calls");
  const nlohmann::json values = call_args_to_json(call);
  std::string text = values.dump();
  uint64_t bytes = text.size();
  group_->broadcast(&bytes, sizeof bytes, 0);
  group_->broadcast(text.data(), text.size(), 0);
  // Rank 0 runs what the others rebuild from the same JSON, with its own callbacks.
  PipelineCallArgs here = call_args_from_json(values);
  here.on_step = call.on_step;
  here.callback_on_step_end = call.callback_on_step_end;
  here.on_warning = call.on_warning;
  here.on_stage = call.on_stage;
  return run_here(std::move(here));
}

void RankCalls::stop() const {
  KILN_CHECK(group_->rank() == 0, "serve", group_->describe(), ": only rank 0 stops the others");
  uint64_t bytes = 0;
  group_->broadcast(&bytes, sizeof bytes, 0);
}

void RankCalls::follow() const {
  KILN_CHECK(group_->rank() != 0, "serve", "rank 0 sends the calls; it does not follow");
  for (;;) {
    uint64_t bytes = 0;
    group_->broadcast_when_ready(&bytes, sizeof bytes, 0);
    if (bytes == 0) return;
    std::string text(bytes, '\0');
    group_->broadcast(text.data(), text.size(), 0);
    try {
      run_here(call_args_from_json(nlohmann::json::parse(text)));
    } catch (const StoppedByRankZero&) {
    } catch (const std::exception& e) {
      // Rank 0 reports the call's error to its client; this rank waits for the next call.
      std::fprintf(stderr, "kiln: %s: call failed: %s\n", group_->describe().c_str(), e.what());
    }
  }
}

PipelineOutput RankCalls::run_here(PipelineCallArgs call) const {
  bool checked = false;
  call.on_checked = [&] {
    checked = true;
    agree_checks(true, "");
  };
  const std::function<void(int64_t, int64_t, double)> on_step = std::move(call.on_step);
  call.on_step = [&](int64_t i, int64_t n, double seconds) {
    std::exception_ptr stop;
    if (on_step) {
      try {
        on_step(i, n, seconds);
      } catch (...) {
        stop = std::current_exception();
      }
    }
    int32_t stopping = stop ? 1 : 0;
    group_->broadcast(&stopping, sizeof stopping, 0);
    if (stop) std::rethrow_exception(stop);
    if (stopping) throw StoppedByRankZero{};
  };
  try {
    return pipe_(call);
  } catch (...) {
    if (!checked) agree_checks(false, message_of(std::current_exception()));
    throw;
  }
}

void RankCalls::agree_checks(bool passed, const std::string& error) const {
  CheckResult mine;
  mine.passed = passed ? 1 : 0;
  std::strncpy(mine.error, error.c_str(), sizeof mine.error - 1);
  std::vector<CheckResult> all(size_t(group_->size()));
  group_->all_gather(&mine, all.data(), sizeof mine);
  if (!passed) return;  // this rank's own error goes on
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].passed)
      fail("distributed", "rank ", r, " of ", all.size(), " could not start this call: ", all[r].error);
}

}  // namespace kiln::server
