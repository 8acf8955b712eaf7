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

int64_t DeltaLog::Append(Entry entry) {
  mutex_lock lock(mu_);
  entry.seq = next_seq_++;
  bytes_ += EntryBytes(entry);
  entries_.push_back(std::move(entry));
  return entries_.back().seq;
}

Status DeltaLog::BeginWrite(int64_t sid, bool bypass) {
  mutex_lock lock(mu_);
  if (!bypass) {
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
  mutex_lock lock(mu_);
  fenced_.insert(sids.begin(), sids.end());
  auto busy = [&]() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int64_t sid : sids) {
      if (in_flight_.count(sid) != 0) return true;
    }
    return false;
  };
  while (busy()) writes_done_.wait(lock);
}

void DeltaLog::RemoveSettledLocked(const std::unordered_set<int64_t>& sids) {
  if (sids.empty()) return;
  auto keep = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (sids.count(it->sid) != 0) {
      int64_t& settled = settled_.emplace(it->target, int64_t{-1}).first->second;
      settled = std::max(settled, it->seq);
      bytes_ -= EntryBytes(*it);
      continue;
    }
    if (keep != it) *keep = std::move(*it);
    ++keep;
  }
  entries_.erase(keep, entries_.end());
}

void DeltaLog::Commit(const std::vector<int64_t>& sids) {
  mutex_lock lock(mu_);
  RemoveSettledLocked(std::unordered_set<int64_t>(sids.begin(), sids.end()));
  for (int64_t sid : sids) {
    fenced_.erase(sid);
    if (!committed_set_.insert(sid).second) continue;
    committed_.push_back(sid);
    if (static_cast<int64_t>(committed_.size()) > kCommittedCapacity) {
      committed_set_.erase(committed_.front());
      committed_.pop_front();
    }
  }
}

void DeltaLog::Drop(const std::vector<int64_t>& sids) {
  mutex_lock lock(mu_);
  RemoveSettledLocked(std::unordered_set<int64_t>(sids.begin(), sids.end()));
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
                     core::RefCountPtr<DeltaLog>* log, DeltaLog::Tag* tag) {
  const char* names[] = {"sid", "target", "source"};
  const int count = with_source ? 3 : 2;
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
