// EcRecDeltaLog, the resource: appends, fences, commits, generations and
// undo (see delta_log.h). Reading it out (Materialize, Pending, Read) is in
// delta_log_snapshot.cc; the op-input helpers are in delta_log_inputs.cc.

#include "ops/cc/kernels/delta_log.h"

#include <algorithm>
#include <utility>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/platform/env.h"

namespace tensorflow {
namespace ec_rec {
namespace {

int64_t EntryBytes(const DeltaLog::Entry& entry) {
  return static_cast<int64_t>(sizeof(DeltaLog::Entry) +
                              entry.rows.size() * sizeof(int64_t)) +
         static_cast<int64_t>(entry.delta.TotalBytes());
}

}  // namespace

std::string DeltaLog::DebugString() const {
  mutex_lock lock(mu_);
  return strings::StrCat("EcRecDeltaLog(", entries_.size(), " entries, ",
                         bytes_, " bytes, ", committed_.size(),
                         " committed sids, next seq ", next_seq_, ")");
}

int64_t DeltaLog::MemoryUsed() const {
  mutex_lock lock(mu_);
  return bytes_;
}

DeltaLog::DeltaLog()
    : next_seq_(static_cast<int64_t>(Env::Default()->NowMicros()) << 10) {}

DeltaLog::~DeltaLog() {
  // Nothing can wait here: a waiter's timeout holds a reference.
}

int64_t DeltaLog::Append(Entry entry) {
  entry.micros = static_cast<int64_t>(Env::Default()->NowMicros());
  mutex_lock lock(mu_);
  entry.seq = next_seq_++;
  bytes_ += EntryBytes(entry);
  entries_.push_back(std::move(entry));
  return entries_.back().seq;
}

Status DeltaLog::BeginWrite(int64_t sid, bool bypass) {
  mutex_lock lock(mu_);
  if (!bypass) {
    if (GenerationOf(sid) < min_generation_) {
      return errors::Aborted("step ", sid, " is of generation ",
                             GenerationOf(sid), " but this PS admits ",
                             min_generation_, " and later (the cluster "
                             "changed); this update was not applied");
    }
    if (fenced_.count(sid) != 0) {
      return errors::Aborted("step ", sid, " is fenced by recovery; this "
                             "update was not applied");
    }
    if (committed_set_.count(sid) != 0) {
      return errors::Aborted("step ", sid, " is already committed; this "
                             "update was not applied");
    }
  }
  ++in_flight_[sid];
  return OkStatus();
}

void DeltaLog::EndWrite(int64_t sid) {
  mutex_lock lock(mu_);
  auto it = in_flight_.find(sid);
  if (it != in_flight_.end() && --it->second == 0) {
    in_flight_.erase(it);
    writes_done_.notify_all();
  }
}

void DeltaLog::Fence(const std::vector<int64_t>& sids) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    fenced_.insert(sids.begin(), sids.end());
    WakeWaitersLocked(&done);
  }
  Finish(&done);
  mutex_lock lock(mu_);
  auto busy = [&]() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int64_t sid : sids) {
      if (in_flight_.count(sid) != 0) return true;
    }
    return false;
  };
  while (busy()) writes_done_.wait(lock);
}

void DeltaLog::RemoveSettledLocked(
    const std::function<bool(const Entry&)>& settles) {
  auto keep = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (settles(*it)) {
      int64_t& settled = settled_.emplace(it->target, int64_t{-1}).first->second;
      settled = std::max(settled, it->seq);
      if (it->kind == kFold && it->source >= 0) {
        int64_t& source =
            settled_source_.emplace(it->source, int64_t{-1}).first->second;
        source = std::max(source, it->source_seq);
      }
      bytes_ -= EntryBytes(*it);
      continue;
    }
    if (keep != it) *keep = std::move(*it);
    ++keep;
  }
  entries_.erase(keep, entries_.end());
}

void DeltaLog::RemoveSidsLocked(const std::vector<int64_t>& sids) {
  if (sids.empty()) return;
  const std::unordered_set<int64_t> set(sids.begin(), sids.end());
  RemoveSettledLocked([&](const Entry& e) { return set.count(e.sid) != 0; });
}

void DeltaLog::Remember(std::deque<int64_t>* ring,
                        std::unordered_set<int64_t>* set, int64_t sid) {
  if (!set->insert(sid).second) return;
  ring->push_back(sid);
  if (static_cast<int64_t>(ring->size()) > kCommittedCapacity) {
    set->erase(ring->front());
    ring->pop_front();
  }
}

Status DeltaLog::RefusedLocked(const std::vector<int64_t>& sids) const {
  for (int64_t sid : sids) {
    if (fenced_.count(sid) != 0) {
      return errors::Aborted("step ", sid, " was fenced by recovery before "
                             "it committed; recovery settles it and the step "
                             "counts as failed");
    }
    if (GenerationOf(sid) < min_generation_) {
      return errors::Aborted("step ", sid, " is of generation ",
                             GenerationOf(sid), " but this PS admits ",
                             min_generation_, " and later; it cannot commit");
    }
  }
  return OkStatus();
}

Status DeltaLog::Commit(const std::vector<int64_t>& sids, bool bypass) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    if (!bypass) TF_RETURN_IF_ERROR(RefusedLocked(sids));
    RemoveSidsLocked(sids);
    // A fence stays: a step settled by recovery is reported failed to its
    // trainer (its worker's commit is refused) even when it was kept.
    for (int64_t sid : sids) Remember(&committed_, &committed_set_, sid);
    WakeWaitersLocked(&done);
  }
  Finish(&done);
  return OkStatus();
}

void DeltaLog::Drop(const std::vector<int64_t>& sids) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    RemoveSidsLocked(sids);
    WakeWaitersLocked(&done);
  }
  Finish(&done);
}

Status DeltaLog::TryInOrderLocked(const Waiter& w, bool* ready,
                                  bool* progress) {
  *ready = false;
  *progress = false;
  if (!w.bypass) TF_RETURN_IF_ERROR(RefusedLocked(w.sids));
  const std::unordered_set<int64_t> mine(w.sids.begin(), w.sids.end());
  // Per target, independently: an apply entry of `mine` is committed now if no other step's apply
  // not round-1 committed precedes it. Per entry, not per target: with several steps in `mine` (a
  // settlement's), a later one must not pass another step's entry that lies between them (the
  // committed entries of a target stay a prefix, F1). Waiting per target (not per PS) keeps two
  // steps that applied two variables of this PS in opposite orders from waiting on each other.
  std::map<int32_t, int64_t> first_other;  // target -> lowest seq of others
  for (const Entry& e : entries_) {
    if (e.kind != kApply || e.in_order_committed || mine.count(e.sid) != 0) continue;
    first_other.emplace(e.target, e.seq);
  }
  bool blocked = false;
  for (Entry& e : entries_) {
    if (e.kind != kApply || e.in_order_committed || mine.count(e.sid) == 0) continue;
    auto other = first_other.find(e.target);
    if (other == first_other.end() || other->second > e.seq) {
      e.in_order_committed = true;
      *progress = true;
    } else {
      blocked = true;
    }
  }
  // Round 1 runs after all of a step's updates: mark it at the first commit.
  if (*progress || !blocked) {
    for (int64_t sid : w.sids) {
      Remember(&data_committed_, &data_committed_set_, sid);
    }
  }
  *ready = !blocked;
  return OkStatus();
}

void DeltaLog::WakeWaitersLocked(
    std::vector<std::pair<std::function<void(const Status&)>, Status>>* done) {
  // A commit can unblock another: repeat until nothing changes.
  bool progress = true;
  while (progress) {
    progress = false;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      bool ready = false;
      bool moved = false;
      Status s = TryInOrderLocked(*it, &ready, &moved);
      progress = progress || moved;
      if (ready || !s.ok()) {
        done->emplace_back(std::move(it->done), s);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void DeltaLog::Finish(
    std::vector<std::pair<std::function<void(const Status&)>, Status>>* done) {
  for (auto& [callback, status] : *done) callback(status);
  done->clear();
}

int64_t DeltaLog::CommitInOrder(std::vector<int64_t> sids, bool bypass,
                                int64_t timeout_ms,
                                std::function<void(const Status&)> done) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> finished;
  int64_t id = -1;
  {
    mutex_lock lock(mu_);
    Waiter w;
    w.sids = std::move(sids);
    w.bypass = bypass;
    bool ready = false;
    bool moved = false;
    Status s = TryInOrderLocked(w, &ready, &moved);
    if (moved) WakeWaitersLocked(&finished);
    if (!ready && s.ok() && timeout_ms <= 0) {
      s = errors::Aborted("step ", w.sids.empty() ? 0 : w.sids[0],
                          " cannot commit yet: an earlier step's update of "
                          "the same variable is not committed");
    }
    if (ready || !s.ok()) {
      finished.emplace_back(std::move(done), s);
    } else {
      id = next_waiter_++;
      w.id = id;
      w.done = std::move(done);
      waiters_.push_back(std::move(w));
    }
  }
  if (id >= 0) {
    Ref();  // released by the timeout
    Env::Default()->SchedClosureAfter(timeout_ms * 1000, [this, id]() {
      TimeOut(id);
      Unref();
    });
  }
  Finish(&finished);
  return id;
}

void DeltaLog::TimeOut(int64_t waiter_id) {
  int64_t sid = 0;
  {
    mutex_lock lock(mu_);
    for (const Waiter& w : waiters_) {
      if (w.id == waiter_id) sid = w.sids.empty() ? 0 : w.sids[0];
    }
  }
  Withdraw(waiter_id,
           errors::Aborted("step ", sid,
                           " waited too long for an earlier step's update of "
                           "the same variable to commit (a dead task's step "
                           "not yet settled by the chief)"));
}

void DeltaLog::Withdraw(int64_t id, const Status& status) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->id != id) continue;
      done.emplace_back(std::move(it->done), status);
      waiters_.erase(it);
      break;
    }
  }
  Finish(&done);
}

void DeltaLog::SetGeneration(int64_t generation) {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    min_generation_ = std::max(min_generation_, generation);
    WakeWaitersLocked(&done);
  }
  Finish(&done);
}

void DeltaLog::FoldedRows(int64_t sid, int32_t target, int32_t source,
                          std::unordered_set<int64_t>* rows,
                          bool* settled) const {
  mutex_lock lock(mu_);
  *settled = committed_set_.count(sid) != 0;
  for (const Entry& e : entries_) {
    if (e.sid == sid && e.target == target && e.source == source) {
      rows->insert(e.rows.begin(), e.rows.end());
    }
  }
}

bool DeltaLog::HasEntryOrCommitted(int64_t sid, int32_t target) const {
  mutex_lock lock(mu_);
  if (committed_set_.count(sid) != 0 || data_committed_set_.count(sid) != 0) {
    return true;
  }
  for (const Entry& e : entries_) {
    if (e.sid == sid && e.target == target) return true;
  }
  return false;
}

int64_t DeltaLog::SeqOf(int64_t sid, int32_t target) const {
  mutex_lock lock(mu_);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->sid == sid && it->target == target) return it->seq;
  }
  return -1;
}

Status DeltaLog::Undo(int64_t seq, int32_t target, bool ordered,
                      const std::function<Status(const Words&)>& apply,
                      bool* found) {
  mutex_lock lock(mu_);
  auto it = std::lower_bound(
      entries_.begin(), entries_.end(), seq,
      [](const Entry& entry, int64_t value) { return entry.seq < value; });
  *found = it != entries_.end() && it->seq == seq;
  if (!*found) return OkStatus();
  if (it->target != target) {
    *found = false;
    return errors::InvalidArgument("entry ", seq, " of the delta log updated "
                                   "target ", it->target, ", not ", target);
  }
  if (ordered) {
    for (auto later = it + 1; later != entries_.end(); ++later) {
      if (later->target == target) {
        *found = false;
        return errors::FailedPrecondition(
            "entry ", seq, " of target ", target, " cannot be undone before "
            "the later entry ", later->seq, " of the same target");
      }
    }
    auto settled = settled_.find(target);
    if (settled != settled_.end() && settled->second > seq) {
      *found = false;
      return errors::FailedPrecondition(
          "entry ", seq, " of target ", target, " cannot be undone: the "
          "later update ", settled->second, " of that target was committed "
          "or dropped and is still in effect");
    }
  }
  Status applied = apply(Materialize(*it));
  if (!applied.ok()) {
    *found = false;
    return applied;
  }
  bytes_ -= EntryBytes(*it);
  entries_.erase(it);
  return OkStatus();
}

void DeltaLog::WakeAfterUndo() {
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    WakeWaitersLocked(&done);
  }
  Finish(&done);
}


}  // namespace ec_rec
}  // namespace tensorflow
