// EcRecDeltaLog (see delta_log.h).

#include "ops/cc/kernels/delta_log.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "ops/cc/kernels/galois.h"
#include "ops/cc/kernels/word_loops.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
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

DeltaLog::Words DeltaLog::Materialize(const Entry& entry) {
  Words out;
  out.width = entry.width();
  const int64_t n = static_cast<int64_t>(entry.rows.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return entry.rows[a] < entry.rows[b];
  });
  const int32_t* src = n > 0 ? entry.delta.matrix<int32>().data() : nullptr;
  const galois::WordScaler scale(entry.field_bits, entry.coef);
  const int64_t w = out.width;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t p = order[k];
    if (k == 0 || entry.rows[p] != out.rows.back()) {
      out.rows.push_back(entry.rows[p]);
      out.words.resize(out.words.size() + w, 0);
    }
    int32_t* dst = out.words.data() + out.words.size() - w;
    const int32_t* row = src + p * w;
    if (entry.coef == 1) {
      XorWords(row, dst, w);
    } else {
      scale.XorScaled(row, dst, w);
    }
  }
  return out;
}

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
  // Per target, independently: the apply entries of `mine` on a target that
  // no other step's apply precedes are committed now. Waiting per target
  // (not per PS) keeps two steps that applied two variables of this PS in
  // opposite orders from waiting on each other.
  std::map<int32_t, int64_t> first_other;  // target -> lowest seq of others
  std::map<int32_t, int64_t> first_mine;   // target -> lowest seq of mine
  for (const Entry& e : entries_) {
    if (e.kind != kApply || e.in_order_committed) continue;
    auto& first = mine.count(e.sid) != 0 ? first_mine : first_other;
    first.emplace(e.target, e.seq);
  }
  std::unordered_set<int32_t> free_targets;
  for (const auto& [target, seq] : first_mine) {
    auto other = first_other.find(target);
    if (other == first_other.end() || other->second > seq) {
      free_targets.insert(target);
    }
  }
  if (!free_targets.empty()) {
    // Round 1 runs after all of a step's updates: mark it at the first commit.
    for (int64_t sid : w.sids) {
      Remember(&data_committed_, &data_committed_set_, sid);
    }
    for (Entry& e : entries_) {
      if (e.kind == kApply && mine.count(e.sid) != 0 &&
          free_targets.count(e.target) != 0) {
        e.in_order_committed = true;
      }
    }
    *progress = true;
  }
  *ready = free_targets.size() == first_mine.size();
  if (*ready) {
    for (int64_t sid : w.sids) {
      Remember(&data_committed_, &data_committed_set_, sid);
    }
  }
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

Status DeltaLog::Pending(OpKernelContext* ctx) const {
  mutex_lock lock(mu_);
  const int64_t now = static_cast<int64_t>(Env::Default()->NowMicros());
  std::map<int64_t, int64_t> oldest;  // sid -> micros of its first entry
  for (const Entry& e : entries_) oldest.emplace(e.sid, e.micros);
  std::unordered_set<int64_t> waiting;
  for (const Waiter& w : waiters_) waiting.insert(w.sids.begin(), w.sids.end());
  const int64_t n = static_cast<int64_t>(oldest.size());
  Tensor* sids = nullptr;
  Tensor* ages = nullptr;
  Tensor* waits = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({n}), &sids));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &ages));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({n}), &waits));
  int64_t i = 0;
  for (const auto& [sid, micros] : oldest) {
    sids->vec<int64_t>()(i) = sid;
    ages->vec<float>()(i) = static_cast<float>(now - micros) * 1e-6f;
    waits->vec<bool>()(i) = waiting.count(sid) != 0;
    ++i;
  }
  return OkStatus();
}

Status DeltaLog::Read(OpKernelContext* ctx) {
  mutex_lock lock(mu_);
  const int64_t m = static_cast<int64_t>(entries_.size());
  std::vector<Words> words;
  words.reserve(m);
  int64_t total_rows = 0;
  int64_t total_words = 0;
  for (const Entry& entry : entries_) {
    words.push_back(Materialize(entry));
    total_rows += static_cast<int64_t>(words.back().rows.size());
    total_words += static_cast<int64_t>(words.back().words.size());
  }
  Tensor* seq = nullptr;
  Tensor* sid = nullptr;
  Tensor* target = nullptr;
  Tensor* source = nullptr;
  Tensor* row_splits = nullptr;
  Tensor* rows = nullptr;
  Tensor* widths = nullptr;
  Tensor* deltas = nullptr;
  Tensor* committed = nullptr;
  Tensor* settled_targets = nullptr;
  Tensor* settled_seq = nullptr;
  Tensor* fenced = nullptr;
  const int64_t c = static_cast<int64_t>(committed_.size());
  const int64_t t = static_cast<int64_t>(settled_.size());
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({m}), &seq));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({m}), &sid));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({m}), &target));
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({m}), &source));
  TF_RETURN_IF_ERROR(ctx->allocate_output(4, TensorShape({m + 1}), &row_splits));
  TF_RETURN_IF_ERROR(ctx->allocate_output(5, TensorShape({total_rows}), &rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(6, TensorShape({m}), &widths));
  TF_RETURN_IF_ERROR(ctx->allocate_output(7, TensorShape({total_words}), &deltas));
  TF_RETURN_IF_ERROR(ctx->allocate_output(8, TensorShape({c}), &committed));
  TF_RETURN_IF_ERROR(ctx->allocate_output(9, TensorShape({t}), &settled_targets));
  TF_RETURN_IF_ERROR(ctx->allocate_output(10, TensorShape({t}), &settled_seq));
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      11, TensorShape({static_cast<int64_t>(fenced_.size())}), &fenced));
  Tensor* source_seq = nullptr;
  Tensor* kinds = nullptr;
  Tensor* settled_sources = nullptr;
  Tensor* settled_source_seq = nullptr;
  Tensor* data_committed = nullptr;
  Tensor* generation = nullptr;
  const int64_t ss = static_cast<int64_t>(settled_source_.size());
  TF_RETURN_IF_ERROR(ctx->allocate_output(12, TensorShape({m}), &source_seq));
  TF_RETURN_IF_ERROR(ctx->allocate_output(13, TensorShape({m}), &kinds));
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(14, TensorShape({ss}), &settled_sources));
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(15, TensorShape({ss}), &settled_source_seq));
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      16, TensorShape({static_cast<int64_t>(data_committed_.size())}),
      &data_committed));
  TF_RETURN_IF_ERROR(ctx->allocate_output(17, TensorShape({}), &generation));
  {
    int64_t j = 0;
    for (const Entry& entry : entries_) {
      source_seq->vec<int64_t>()(j) = entry.source_seq;
      kinds->vec<int32>()(j) = static_cast<int32>(entry.kind);
      ++j;
    }
    j = 0;
    for (const auto& [source_target, seq_value] : settled_source_) {
      settled_sources->vec<int32>()(j) = source_target;
      settled_source_seq->vec<int64_t>()(j) = seq_value;
      ++j;
    }
    j = 0;
    for (int64_t d : data_committed_) data_committed->vec<int64_t>()(j++) = d;
    generation->scalar<int64_t>()() = min_generation_;
  }
  auto seq_v = seq->vec<int64_t>();
  auto sid_v = sid->vec<int64_t>();
  auto target_v = target->vec<int32>();
  auto source_v = source->vec<int32>();
  auto splits_v = row_splits->vec<int64_t>();
  auto widths_v = widths->vec<int64_t>();
  int64_t* rows_out = rows->vec<int64_t>().data();
  int32_t* deltas_out = deltas->vec<int32>().data();
  int64_t i = 0;
  int64_t row_offset = 0;
  int64_t word_offset = 0;
  splits_v(0) = 0;
  for (const Entry& entry : entries_) {
    const Words& net = words[i];
    seq_v(i) = entry.seq;
    sid_v(i) = entry.sid;
    target_v(i) = entry.target;
    source_v(i) = entry.source;
    widths_v(i) = net.width;
    if (!net.rows.empty()) {
      std::memcpy(rows_out + row_offset, net.rows.data(),
                  net.rows.size() * sizeof(int64_t));
    }
    if (!net.words.empty()) {
      std::memcpy(deltas_out + word_offset, net.words.data(),
                  net.words.size() * sizeof(int32_t));
    }
    row_offset += static_cast<int64_t>(net.rows.size());
    word_offset += static_cast<int64_t>(net.words.size());
    splits_v(++i) = row_offset;
  }
  auto committed_v = committed->vec<int64_t>();
  for (int64_t k = 0; k < c; ++k) committed_v(k) = committed_[k];
  auto settled_targets_v = settled_targets->vec<int32>();
  auto settled_seq_v = settled_seq->vec<int64_t>();
  int64_t k = 0;
  for (const auto& [settled_target, settled] : settled_) {
    settled_targets_v(k) = settled_target;
    settled_seq_v(k) = settled;
    ++k;
  }
  std::vector<int64_t> fenced_sorted(fenced_.begin(), fenced_.end());
  std::sort(fenced_sorted.begin(), fenced_sorted.end());
  auto fenced_v = fenced->vec<int64_t>();
  for (size_t f = 0; f < fenced_sorted.size(); ++f) fenced_v(f) = fenced_sorted[f];
  return OkStatus();
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

Status ShareOrCopy(OpKernelContext* ctx, const Tensor& t, Tensor* out) {
  const TensorBuffer* buffer = DMAHelper::buffer(&t);
  if (t.NumElements() == 0 || buffer == nullptr || buffer->OwnsMemory()) {
    *out = t;
    return OkStatus();
  }
  TF_RETURN_IF_ERROR(ctx->allocate_temp(t.dtype(), t.shape(), out));
  std::memcpy(const_cast<char*>(out->tensor_data().data()),
              t.tensor_data().data(), t.TotalBytes());
  return OkStatus();
}

Status LookupOrCreateDeltaLog(OpKernelContext* ctx, int input,
                              core::RefCountPtr<DeltaLog>* log) {
  return LookupOrCreateResource<DeltaLog>(
      ctx, HandleFromInput(ctx, input), log, [](DeltaLog** created) {
        *created = new DeltaLog();
        return OkStatus();
      });
}

Status ReadLogInputs(OpKernelContext* ctx, int first, bool with_source,
                     core::RefCountPtr<DeltaLog>* log, DeltaLog::Tag* tag,
                     bool with_source_seq) {
  const char* names[] = {"sid", "target", "source", "source_seq"};
  const int count = with_source ? (with_source_seq ? 4 : 3) : 2;
  for (int k = 0; k < count; ++k) {
    const Tensor& t = ctx->input(first + 1 + k);
    if (!TensorShapeUtils::IsScalar(t.shape())) {
      return errors::InvalidArgument("`", names[k], "` must be a scalar, got "
                                     "shape ",
                                     t.shape().DebugString());
    }
  }
  tag->sid = ctx->input(first + 1).scalar<int64_t>()();
  tag->target = ctx->input(first + 2).scalar<int32>()();
  tag->source = with_source ? ctx->input(first + 3).scalar<int32>()() : -1;
  tag->source_seq =
      with_source_seq ? ctx->input(first + 4).scalar<int64_t>()() : -1;
  if (tag->target < 0) {
    return errors::InvalidArgument("`target` must be >= 0, got ", tag->target);
  }
  if (tag->source < -1) {
    return errors::InvalidArgument("`source` must be >= -1, got ",
                                   tag->source);
  }
  return LookupOrCreateDeltaLog(ctx, first, log);
}

}  // namespace ec_rec
}  // namespace tensorflow
