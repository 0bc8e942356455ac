#include "server/job_queue.h"

#include <cstdio>
#include <random>

namespace kiln::server {

namespace {

using Clock = std::chrono::steady_clock;

// 16 hex digits from the system's random source: ids are not guessable from one another.
std::string new_job_id() {
  static std::mutex mu;
  static std::random_device device;
  static std::mt19937_64 rng((uint64_t(device()) << 32) ^ device());
  std::lock_guard<std::mutex> lock(mu);
  char id[17];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(rng()));
  return id;
}

}  // namespace

const char* job_state_name(JobState state) {
  switch (state) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kDone: return "done";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "unknown";
}

struct JobQueue::Job {
  std::string id;
  GenerationRequest request;
  JobState state = JobState::kQueued;
  int64_t image = 0;  // the image being made, from 0
  int64_t step = 0;   // steps done of that image
  int64_t steps_done = 0;
  double step_seconds = 0;  // summed over this job's steps
  bool cancel_requested = false;
  std::string error;
  std::vector<std::string> pngs;
  std::vector<JobEvent> events;
  bool finished() const { return state == JobState::kDone || state == JobState::kFailed || state == JobState::kCancelled; }
};

JobQueue::JobQueue(size_t max_queued, ImageRunner runner, size_t keep_finished)
    : max_queued_(max_queued), keep_finished_(keep_finished), runner_(std::move(runner)) {
  worker_ = std::thread([this] { work(); });
}

JobQueue::~JobQueue() { shutdown(true); }

std::string JobQueue::submit(GenerationRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || queue_.size() >= max_queued_) {
    ++stats_.rejected;
    return "";
  }
  auto job = std::make_shared<Job>();
  job->id = new_job_id();
  while (jobs_.count(job->id)) job->id = new_job_id();
  job->request = std::move(request);
  jobs_[job->id] = job;
  queue_.push_back(job);
  ++stats_.submitted;
  changed();
  return job->id;
}

std::shared_ptr<JobQueue::Job> JobQueue::find(const std::string& id) const {
  const auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

bool JobQueue::exists(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return find(id) != nullptr;
}

bool JobQueue::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  if (!job) return false;
  if (job->state == JobState::kQueued) {
    std::erase(queue_, job);
    finish(*job, JobState::kCancelled, "");
  } else if (job->state == JobState::kRunning) {
    job->cancel_requested = true;  // seen by its next step callback
  }
  return true;
}

double JobQueue::mean_step_seconds() const { return stats_.steps ? stats_.step_seconds / double(stats_.steps) : 0; }

double JobQueue::steps_ahead_of(const Job* job) const {
  double steps = 0;
  for (const auto& q : queue_) {
    if (q.get() == job) break;
    steps += double(q->request.call.num_inference_steps * q->request.n);
  }
  if (running_) steps += double(running_->request.call.num_inference_steps * running_->request.n - running_->steps_done);
  return steps;
}

nlohmann::json JobQueue::status(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  if (!job) return nullptr;
  const int64_t steps = job->request.call.num_inference_steps, total = steps * job->request.n;
  const double per_step = job->steps_done ? job->step_seconds / double(job->steps_done) : mean_step_seconds();
  nlohmann::json s{{"id", job->id},
                   {"state", job_state_name(job->state)},
                   {"image", job->image},
                   {"images", job->request.n},
                   {"step", job->step},
                   {"steps", steps},
                   {"seconds_per_step", per_step}};
  if (!job->finished()) {
    // Steps left in this job, plus the jobs ahead of it when it still waits.
    const double ahead = job->state == JobState::kQueued ? steps_ahead_of(job.get()) : 0;
    s["eta_seconds"] = per_step * (ahead + double(total - job->steps_done));
  }
  if (!job->error.empty()) s["error"] = job->error;
  return s;
}

std::vector<JobEvent> JobQueue::events(const std::string& id, size_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  if (!job) return {};
  changed_.wait_for(lock, timeout, [&] { return job->events.size() > seen; });
  if (job->events.size() <= seen) return {};
  return {job->events.begin() + std::ptrdiff_t(seen), job->events.end()};
}

JobState JobQueue::wait(const std::string& id) const {
  std::unique_lock<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  if (!job) return JobState::kCancelled;
  changed_.wait(lock, [&] { return job->finished(); });
  return job->state;
}

std::vector<std::string> JobQueue::images(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  return job && job->state == JobState::kDone ? job->pngs : std::vector<std::string>{};
}

std::string JobQueue::error(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::shared_ptr<Job> job = find(id);
  return job ? job->error : "";
}

double JobQueue::estimated_wait_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_ahead_of(nullptr) * mean_step_seconds();
}

QueueStats JobQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  QueueStats s = stats_;
  s.queued = queue_.size();
  s.running = running_ ? 1 : 0;
  return s;
}

void JobQueue::finish(Job& job, JobState state, const std::string& error) {
  job.state = state;
  job.error = error;
  if (state == JobState::kDone) ++stats_.done;
  if (state == JobState::kFailed) ++stats_.failed;
  if (state == JobState::kCancelled) ++stats_.cancelled;
  job.events.push_back({job_state_name(state), error.empty() ? nlohmann::json::object()
                                                             : nlohmann::json{{"error", error}}});
  finished_.push_back(job.id);
  while (finished_.size() > keep_finished_) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
  changed();
}

void JobQueue::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;  // queued jobs were cancelled by shutdown
    const std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    job->state = JobState::kRunning;
    running_ = job;
    changed();
    std::vector<std::string> pngs;
    std::string error;
    JobState outcome = JobState::kDone;
    const GenerationRequest& request = job->request;  // never written after submit
    const auto t0 = std::chrono::steady_clock::now();
    lock.unlock();
    try {
      for (int64_t i = 0; i < request.n; ++i) {
        PipelineCallArgs call = request.call;
        call.seed = request.call.seed + uint64_t(i);
        const auto on_step = [&](int64_t step, int64_t steps, double seconds) {
          std::lock_guard<std::mutex> step_lock(mu_);
          job->image = i;
          job->step = step + 1;
          ++job->steps_done;
          job->step_seconds += seconds;
          ++stats_.steps;
          stats_.step_seconds += seconds;
          job->events.push_back(
              {"step", {{"image", i}, {"step", step + 1}, {"steps", steps}, {"seconds", seconds}}});
          changed();
          if (job->cancel_requested) throw JobCancelled{};
        };
        {
          std::lock_guard<std::mutex> image_lock(mu_);
          job->image = i;
          job->step = 0;
          if (job->cancel_requested) throw JobCancelled{};
        }
        pngs.push_back(runner_(call, on_step));
      }
    } catch (const JobCancelled&) {
      outcome = JobState::kCancelled;
    } catch (const std::exception& e) {
      outcome = JobState::kFailed;
      error = e.what();
    }
    if (finished_listener_)
      finished_listener_({job->id, request.call.height.value_or(0), request.call.width.value_or(0),
                          request.call.num_inference_steps, request.n,
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), outcome,
                          error});
    lock.lock();
    running_.reset();
    if (outcome == JobState::kDone) job->pngs = std::move(pngs);
    finish(*job, outcome, error);
  }
}

void JobQueue::on_finished(std::function<void(const FinishedJob&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_listener_ = std::move(listener);
}

void JobQueue::on_change(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void JobQueue::changed() {
  changed_.notify_all();
  if (listener_) listener_();
}

void JobQueue::shutdown(bool cancel_running) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      for (const auto& job : queue_) finish(*job, JobState::kCancelled, "the server is shutting down");
      queue_.clear();
      if (running_ && cancel_running) running_->cancel_requested = true;
      changed();
    }
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace kiln::server
