// kiln serve under tensor parallelism (--tp N: one process per rank under mpirun, the pipeline
// sharded over them). Rank 0 takes the requests; each call it runs is sent to the other ranks,
// which run it at the same time on their shards, so the model's collectives meet. The ranks
// agree twice on their own communicator (never the model's):
//  - after the argument and memory checks: a call starts only when every rank's checks passed,
//    else it fails on every rank with the first failing rank's error (the server keeps serving);
//  - after every denoising step: when rank 0's step callback throws (a cancelled job), every rank
//    stops at that step boundary.
// An error on one rank in the middle of the work (no rank to meet its collectives) ends the job
// through the collective timeout, as kiln generate --tp does.
#pragma once
#include <memory>

#include "distributed/process_group.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::server {

class RankCalls {
 public:
  // Collective: every rank of `group` makes one at the same point, with no model work in flight.
  RankCalls(const DiffusionPipeline& pipe, const std::shared_ptr<ProcessGroup>& group);

  // Rank 0: runs `call` on every rank and returns rank 0's output. Its callbacks run on rank 0
  // only; when its on_step throws, every rank stops there and the exception comes back.
  PipelineOutput run(const PipelineCallArgs& call) const;
  // Rank 0: the other ranks' follow() returns.
  void stop() const;
  // Other ranks: runs each call rank 0 sends (its output dropped), until rank 0 stops; an error
  // in a call is printed and the next call awaited.
  void follow() const;

 private:
  // Every rank: `call` (the values rank 0 sent) with the agreements hooked in. `on_step` is rank
  // 0's callback (null elsewhere).
  PipelineOutput run_here(PipelineCallArgs call) const;
  // The checks' agreement: every rank says whether its checks passed (and if not, why); throws
  // the first failing rank's error on the ranks whose own checks passed.
  void agree_checks(bool passed, const std::string& error) const;

  const DiffusionPipeline& pipe_;
  std::shared_ptr<ProcessGroup> group_;  // a duplicate: its collectives never meet the model's
};

}  // namespace kiln::server
