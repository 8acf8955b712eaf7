// EcRecDeltaLog read out: an entry's net words (Materialize) and the
// outputs of EcRec>DeltaLogPending and EcRec>DeltaLogRead (see delta_log.h).
// tf_ecrec/ops/log_snapshot.py parses the Read outputs on the Python side.

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/galois.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/word_loops.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/env.h"

namespace tensorflow {
namespace ec_rec {

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
  TF_RETURN_IF_ERROR(
      AllocateVectors(ctx, {{0, n, &sids}, {1, n, &ages}, {2, n, &waits}}));
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
  Tensor* source_seq = nullptr;
  Tensor* kinds = nullptr;
  Tensor* settled_sources = nullptr;
  Tensor* settled_source_seq = nullptr;
  Tensor* data_committed = nullptr;
  Tensor* generation = nullptr;
  const int64_t c = static_cast<int64_t>(committed_.size());
  const int64_t t = static_cast<int64_t>(settled_.size());
  const int64_t ss = static_cast<int64_t>(settled_source_.size());
  const int64_t f = static_cast<int64_t>(fenced_.size());
  const int64_t d = static_cast<int64_t>(data_committed_.size());
  TF_RETURN_IF_ERROR(AllocateVectors(
      ctx, {{0, m, &seq}, {1, m, &sid}, {2, m, &target}, {3, m, &source},
            {4, m + 1, &row_splits}, {5, total_rows, &rows}, {6, m, &widths},
            {7, total_words, &deltas}, {8, c, &committed},
            {9, t, &settled_targets}, {10, t, &settled_seq}, {11, f, &fenced},
            {12, m, &source_seq}, {13, m, &kinds}, {14, ss, &settled_sources},
            {15, ss, &settled_source_seq}, {16, d, &data_committed}}));
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

}  // namespace ec_rec
}  // namespace tensorflow
