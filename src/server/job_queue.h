// The server's jobs (`kiln serve`): a bounded FIFO queue and one worker thread that runs the
// jobs one at a time on the loaded pipeline, with the state a client can ask for (queued,
// running at step i of N, done, failed, cancelled), the events of each job in order (one per
// step, then the outcome), its PNG images, and cancellation: a queued job leaves the queue, a
// running one stops at the next step boundary. The queue knows nothing of HTTP.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation_request.h"

namespace kiln::server {

enum class JobState { kQueued, kRunning, kDone, kFailed, kCancelled };
const char* job_state_name(JobState state);

// One server-sent event of a job: "step" (data: image, step, steps, seconds), then one of
// "done", "failed" (data: error), "cancelled".
struct JobEvent {
  std::string type;
  nlohmann::json data;
};

// Thrown through the pipeline by a job's step callback when the job has been cancelled.
struct JobCancelled {};

// Makes one image: the PNG bytes of `call` (its seed already the image's), calling `on_step(i,
// n, seconds)` after every denoising step; `on_step` throws JobCancelled to stop.
using ImageRunner =
    std::function<std::string(const PipelineCallArgs& call, const std::function<void(int64_t, int64_t, double)>& on_step)>;

// A job that ran, as the server's log line says it: id, size, steps, images, seconds, outcome.
struct FinishedJob {
  std::string id;
  int64_t height = 0, width = 0, steps = 0, images = 0;  // height/width 0: the pipeline's default
  double seconds = 0;                                    // from its start to its end
  JobState state = JobState::kDone;
  std::string error;
};

struct QueueStats {
  size_t queued = 0, running = 0;
  uint64_t submitted = 0, done = 0, failed = 0, cancelled = 0, rejected = 0;
  uint64_t steps = 0;
  double step_seconds = 0;  // summed over every step run
};

class JobQueue {
 public:
  // At most `max_queued` jobs wait (the running one not counted); the `keep_finished` most
  // recently finished jobs stay readable (their images included), older ones are forgotten.
  JobQueue(size_t max_queued, ImageRunner runner, size_t keep_finished = 64);
  ~JobQueue();
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // The new job's id; "" when the queue is full or shutting down (counted as rejected).
  std::string submit(GenerationRequest request);
  bool exists(const std::string& id) const;
  // Cancels a job: false when no such job. A finished job stays as it ended.
  bool cancel(const std::string& id);
  // {"id", "state", "image", "images", "step", "steps", "seconds_per_step", "eta_seconds", "error"}.
  nlohmann::json status(const std::string& id) const;
  // The job's events from index `seen` on, waiting up to `timeout` for one when there is none
  // yet; empty when there is none (yet) or no such job.
  std::vector<JobEvent> events(const std::string& id, size_t seen, std::chrono::milliseconds timeout) const;
  // Waits until the job has finished; its state then (kCancelled for an unknown id).
  JobState wait(const std::string& id) const;
  // The job's images (PNG bytes), once it is done.
  std::vector<std::string> images(const std::string& id) const;
  std::string error(const std::string& id) const;
  // Seconds a new job would wait before it starts, from the mean step time so far (0 when idle).
  double estimated_wait_seconds() const;
  QueueStats stats() const;
  // `listener` is called (with the queue's lock held: it must only signal, e.g. wake an event
  // loop) whenever a job is queued, starts, steps or ends — what waiting clients poll for.
  void on_change(std::function<void()> listener);
  // `listener` is called by the worker after each job it ran has ended (without the lock: it may
  // write a log line); set it before the first job.
  void on_finished(std::function<void(const FinishedJob&)> listener);
  // Stops taking jobs: every queued job is cancelled; the running one is cancelled at its next
  // step when `cancel_running`, else it finishes. Returns when the worker has stopped.
  void shutdown(bool cancel_running);

 private:
  struct Job;
  void work();
  void changed();  // with mu_ held: wakes waiters and the listener
  void finish(Job& job, JobState state, const std::string& error);  // with mu_ held
  double mean_step_seconds() const;                                  // with mu_ held
  // Steps still to run before `job` starts (nullptr: before a new job): the queue ahead of it and
  // the rest of the running job. With mu_ held.
  double steps_ahead_of(const Job* job) const;
  std::shared_ptr<Job> find(const std::string& id) const;            // with mu_ held

  const size_t max_queued_, keep_finished_;
  const ImageRunner runner_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<std::string> finished_;  // ids, oldest first
  std::shared_ptr<Job> running_;
  std::function<void()> listener_;
  std::function<void(const FinishedJob&)> finished_listener_;
  bool stopping_ = false, cancel_running_on_stop_ = false;
  QueueStats stats_;
  std::thread worker_;
};

}  // namespace kiln::server
