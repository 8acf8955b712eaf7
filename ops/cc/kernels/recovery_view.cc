#define EIGEN_USE_THREADS

#include "ops/cc/kernels/recovery_view.h"

#include <algorithm>
#include <cstring>

#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace ec_rec {

bool RecoveryView::Preserved::Covers(int64_t row) const {
  auto it = std::upper_bound(
      ranges.begin(), ranges.end(), row,
      [](int64_t r, const std::pair<int64_t, int64_t>& range) {
        return r < range.first;
      });
  if (it == ranges.begin()) return false;
  --it;
  return row >= it->first && row < it->second;
}

void RecoveryView::Finish(std::vector<std::pair<Done, Status>>* done) {
  for (auto& [callback, status] : *done) callback(status);
  done->clear();
}

// ---- the rebuilt PS ---------------------------------------------------------

void RecoveryView::BeginPending(const std::string& key, int64_t rows) {
  mutex_lock lock(mu_);
  Pending& p = pending_[key];
  p.rows.assign(static_cast<size_t>(std::max<int64_t>(rows, 0)), true);
  p.count = std::max<int64_t>(rows, 0);
  if (p.count == 0) pending_.erase(key);
  any_pending_ = !pending_.empty();
}

void RecoveryView::ForgetPending() {
  std::vector<std::pair<Done, Status>> done;
  std::vector<std::function<void()>> wake;
  {
    mutex_lock lock(mu_);
    pending_.clear();
    any_pending_ = false;
    for (auto& [id, w] : waiters_) {
      done.emplace_back(std::move(w.done),
                        errors::Aborted("the rebuild of ", w.key,
                                        " was started over; its rows are "
                                        "pending under a new variable"));
    }
    waiters_.clear();
    NotifyWantedLocked(&wake);
  }
  for (auto& f : wake) f();
  Finish(&done);
}

int64_t RecoveryView::PendingRows() const {
  mutex_lock lock(mu_);
  int64_t total = 0;
  for (const auto& [key, p] : pending_) total += p.count;
  return total;
}

Status RecoveryView::CheckWritable(const std::string& key, const int64_t* rows,
                                   int64_t n) const {
  if (!any_pending_) return OkStatus();
  mutex_lock lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return OkStatus();
  const std::vector<bool>& bits = it->second.rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    if (row >= 0 && row < static_cast<int64_t>(bits.size()) && bits[row]) {
      return errors::FailedPrecondition(
          "row ", row, " of ", key, " is not rebuilt yet: an update must "
          "follow a lookup of the row, which waits for its rebuild; this "
          "update was not applied");
    }
  }
  return OkStatus();
}

void RecoveryView::NotifyWantedLocked(
    std::vector<std::function<void()>>* wake) {
  for (auto& [id, callback] : wanted_waiters_) wake->push_back(std::move(callback));
  wanted_waiters_.clear();
}

int64_t RecoveryView::Await(const std::string& key, std::vector<int64_t> rows,
                            Done done) {
  std::vector<std::function<void()>> wake;
  int64_t id = -1;
  if (any_pending_) {
    mutex_lock lock(mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      const std::vector<bool>& bits = it->second.rows;
      Waiter w;
      for (int64_t row : rows) {
        if (row >= 0 && row < static_cast<int64_t>(bits.size()) && bits[row]) {
          w.rows.insert(row);
        }
      }
      if (!w.rows.empty()) {
        id = next_waiter_++;
        w.id = id;
        w.key = key;
        w.done = std::move(done);
        waiters_.emplace(id, std::move(w));
        NotifyWantedLocked(&wake);
      }
    }
  }
  for (auto& f : wake) f();
  if (id < 0) done(OkStatus());
  return id;
}

void RecoveryView::Cancel(int64_t id) {
  std::vector<std::pair<Done, Status>> done;
  {
    mutex_lock lock(mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    done.emplace_back(std::move(it->second.done),
                      errors::Cancelled("the wait for rows of ", it->second.key,
                                        " to be rebuilt was cancelled"));
    waiters_.erase(it);
  }
  Finish(&done);
}

std::vector<int64_t> RecoveryView::Wanted(const std::string& key, int64_t lo,
                                          int64_t hi) const {
  std::vector<int64_t> out;
  mutex_lock lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return out;
  std::unordered_set<int64_t> seen;
  for (const auto& [id, w] : waiters_) {
    if (w.key != key) continue;
    for (int64_t row : w.rows) {
      if (row >= lo && row < hi && it->second.rows[row] && seen.insert(row).second) {
        out.push_back(row);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t RecoveryView::WaitWanted(std::function<void()> done) {
  {
    mutex_lock lock(mu_);
    if (waiters_.empty()) {
      const int64_t id = next_wanted_waiter_++;
      wanted_waiters_.emplace_back(id, std::move(done));
      return id;
    }
  }
  done();
  return -1;
}

void RecoveryView::WantedTimeOut(int64_t id) {
  std::function<void()> callback;
  {
    mutex_lock lock(mu_);
    for (auto it = wanted_waiters_.begin(); it != wanted_waiters_.end(); ++it) {
      if (it->first == id) {
        callback = std::move(it->second);
        wanted_waiters_.erase(it);
        break;
      }
    }
  }
  if (callback) callback();
}

void RecoveryView::Claim(const std::string& key,
                         const std::vector<int64_t>& rows,
                         std::vector<bool>* pending) const {
  pending->assign(rows.size(), false);
  mutex_lock lock(mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  const std::vector<bool>& bits = it->second.rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    (*pending)[i] = row >= 0 && row < static_cast<int64_t>(bits.size()) && bits[row];
  }
}

void RecoveryView::Installed(const std::string& key,
                             const std::vector<int64_t>& rows,
                             const std::vector<bool>& pending) {
  std::vector<std::pair<Done, Status>> done;
  {
    mutex_lock lock(mu_);
    auto it = pending_.find(key);
    if (it == pending_.end()) return;
    Pending& p = it->second;
    std::unordered_set<int64_t> now;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t row = rows[i];
      if (pending[i] && p.rows[row]) {
        p.rows[row] = false;
        --p.count;
        now.insert(row);
      }
    }
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      if (w->second.key == key) {
        for (int64_t row : now) w->second.rows.erase(row);
      }
      if (w->second.rows.empty()) {
        done.emplace_back(std::move(w->second.done), OkStatus());
        w = waiters_.erase(w);
      } else {
        ++w;
      }
    }
    if (p.count == 0) pending_.erase(it);
    any_pending_ = !pending_.empty();
  }
  Finish(&done);
}

void RecoveryView::InstallSaved(const std::string& key,
                                const std::vector<int64_t>& rows,
                                const std::vector<bool>& pending,
                                const int32_t* words, int64_t width,
                                bool add) {
  if (!any_preserved_) return;
  mutex_lock lock(mu_);
  auto it = preserved_.find(key);
  if (it == preserved_.end()) return;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!pending[i]) continue;
    auto s = it->second.saved.find(rows[i]);
    if (s == it->second.saved.end()) continue;
    const int32_t* src = words + static_cast<int64_t>(i) * width;
    const int64_t n = std::min<int64_t>(width, s->second.size());
    for (int64_t j = 0; j < n; ++j) {
      s->second[j] = add ? (s->second[j] ^ src[j]) : src[j];
    }
  }
}

// ---- the survivors ----------------------------------------------------------

void RecoveryView::BeginPreserve(
    const std::string& key, std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  mutex_lock lock(mu_);
  auto old = preserved_.find(key);
  if (old != preserved_.end()) {
    saved_rows_ -= static_cast<int64_t>(old->second.saved.size());
    preserved_.erase(old);
  }
  if (!ranges.empty()) preserved_[key].ranges = std::move(ranges);
  any_preserved_ = !preserved_.empty();
}

void RecoveryView::EndPreserve() {
  mutex_lock lock(mu_);
  preserved_.clear();
  saved_rows_ = 0;
  any_preserved_ = false;
}

void RecoveryView::Preserve(const std::string& key,
                            const std::vector<WordTable>& tables,
                            const int64_t* rows, int64_t n) {
  if (!any_preserved_ || n == 0) return;
  mutex_lock lock(mu_);
  auto it = preserved_.find(key);
  if (it == preserved_.end()) return;
  Preserved& p = it->second;
  int64_t width = 0;
  for (const WordTable& t : tables) width += t.words;
  const int64_t num_rows = tables.empty() ? 0 : tables.front().rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= num_rows) continue;  // the writer rejects it
    if (!p.Covers(row) || p.saved.count(row) != 0) continue;
    std::vector<int32_t> words(static_cast<size_t>(width));
    char* dst = reinterpret_cast<char*>(words.data());
    for (const WordTable& t : tables) {
      const int64_t bytes = t.words * static_cast<int64_t>(sizeof(int32_t));
      std::memcpy(dst, t.base + row * bytes, bytes);
      dst += bytes;
    }
    p.saved.emplace(row, std::move(words));
    ++saved_rows_;
  }
}

Status RecoveryView::Substitute(const std::string& key, const int64_t* rows,
                                int64_t n, int64_t width,
                                int32_t* words) const {
  if (!any_preserved_) return OkStatus();
  mutex_lock lock(mu_);
  auto it = preserved_.find(key);
  if (it == preserved_.end()) return OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    auto s = it->second.saved.find(rows[i]);
    if (s == it->second.saved.end()) continue;
    if (static_cast<int64_t>(s->second.size()) != width) {
      return errors::InvalidArgument(
          "row ", rows[i], " of ", key, " was preserved with ", s->second.size(),
          " words but is read with ", width);
    }
    std::memcpy(words + i * width, s->second.data(), width * sizeof(int32_t));
  }
  return OkStatus();
}

int64_t RecoveryView::SavedRows() const {
  mutex_lock lock(mu_);
  return saved_rows_;
}

int64_t RecoveryView::PreservedGroups() const {
  mutex_lock lock(mu_);
  return static_cast<int64_t>(preserved_.size());
}

Status VariableKey(OpKernelContext* ctx, int input, std::string* key) {
  const Tensor& t = ctx->input(input);
  if (t.dtype() != DT_RESOURCE || t.NumElements() != 1) {
    return errors::InvalidArgument("input ", input, " must be a resource "
                                   "variable handle");
  }
  *key = t.flat<ResourceHandle>()(0).name();
  return OkStatus();
}

}  // namespace ec_rec
}  // namespace tensorflow
