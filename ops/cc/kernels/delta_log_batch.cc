// The delta log's side of batched folds (tf_ecrec/step/batched_commit.py): a fold
// round takes the apply entries not folded yet, folds them on every fold
// target (EcRec>ParityFoldBatch, which skips what a target holds already, so
// rounds may overlap or repeat), marks the ones folded everywhere, and
// commits the counted steps whose applies, and every earlier apply of the
// same variables, are folded (docs/settlement.md, "Folds batched over
// steps").

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ops/cc/kernels/delta_log.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {

std::vector<DeltaLog::Entry> DeltaLog::Take(int32_t target) const {
  std::vector<Entry> out;
  mutex_lock lock(mu_);
  for (const Entry& e : entries_) {
    if (e.kind != kApply || e.target != target || e.folded) continue;
    out.push_back(e);  // rows copied, delta shared (never written)
  }
  return out;
}

std::unordered_map<int64_t, std::unordered_set<int64_t>>
DeltaLog::FoldedRowsBySid(int32_t target, int32_t source) const {
  std::unordered_map<int64_t, std::unordered_set<int64_t>> out;
  mutex_lock lock(mu_);
  for (const Entry& e : entries_) {
    if (e.kind == kFold && e.target == target && e.source == source) {
      out[e.sid].insert(e.rows.begin(), e.rows.end());
    }
  }
  return out;
}

void DeltaLog::MarkFolded(const std::vector<int64_t>& seqs) {
  if (seqs.empty()) return;
  const std::unordered_set<int64_t> set(seqs.begin(), seqs.end());
  mutex_lock lock(mu_);
  for (Entry& e : entries_) {
    if (e.kind == kApply && set.count(e.seq) != 0) e.folded = true;
  }
}

std::vector<int64_t> DeltaLog::Ready(
    const std::vector<int64_t>& candidates) const {
  std::unordered_set<int64_t> ready(candidates.begin(), candidates.end());
  mutex_lock lock(mu_);
  for (int64_t sid : candidates) {
    if (fenced_.count(sid) != 0) ready.erase(sid);
  }
  // In seq order, per target: an entry counts as folded only if every earlier
  // apply of its target is folded too (the prefix that parity holds).
  std::map<int32_t, bool> gap;  // target -> an earlier apply is not folded
  for (const Entry& e : entries_) {
    if (e.kind != kApply) continue;
    bool& open = gap.emplace(e.target, false).first->second;
    const bool done = e.folded || e.in_order_committed;
    if (ready.count(e.sid) != 0 && (!done || open)) ready.erase(e.sid);
    if (!done) open = true;
  }
  std::vector<int64_t> out;
  for (int64_t sid : candidates) {
    if (ready.count(sid) != 0) out.push_back(sid);
  }
  return out;
}

std::vector<int64_t> DeltaLog::CommitEach(const std::vector<int64_t>& sids) {
  std::vector<int64_t> out;
  std::vector<std::pair<std::function<void(const Status&)>, Status>> done;
  {
    mutex_lock lock(mu_);
    std::vector<int64_t> now;
    for (int64_t sid : sids) {
      if (committed_set_.count(sid) != 0) {
        out.push_back(sid);
      } else if (fenced_.count(sid) == 0 &&
                 GenerationOf(sid) >= min_generation_) {
        now.push_back(sid);
        out.push_back(sid);
      }
    }
    RemoveSidsLocked(now);
    for (int64_t sid : now) Remember(&committed_, &committed_set_, sid);
    WakeWaitersLocked(&done);
  }
  Finish(&done);
  return out;
}

std::vector<int64_t> DeltaLog::Counted(int32_t target) const {
  std::vector<int64_t> out;
  mutex_lock lock(mu_);
  for (const Entry& e : entries_) {
    if (e.kind == kCounter && e.target == target) out.push_back(e.sid);
  }
  return out;
}

Status DeltaLog::Admits(int64_t id) const {
  mutex_lock lock(mu_);
  if (GenerationOf(id) < min_generation_) {
    return errors::Aborted("fold round ", id, " is of generation ", GenerationOf(id),
                           " but this PS admits ", min_generation_,
                           " and later (the cluster changed); nothing was folded or committed");
  }
  return OkStatus();
}

bool DeltaLog::IsCommitted(int64_t sid) const {
  mutex_lock lock(mu_);
  return committed_set_.count(sid) != 0;
}

}  // namespace ec_rec
}  // namespace tensorflow
