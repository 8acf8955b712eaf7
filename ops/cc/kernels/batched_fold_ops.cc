// Kernels of the batched-fold ops (ops/cc/ops/batched_fold_ops.cc): a fold
// round of tf_ecrec.step.batched_commit takes a data variable's unfolded apply
// entries, folds them into each fold target in one op per target, marks what
// every target holds, and commits the counted steps that are folded through.

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/delta_log_inputs.h"
#include "ops/cc/kernels/galois.h"
#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/recovery_view.h"
#include "ops/cc/kernels/word_loops.h"
#include "ops/cc/kernels/word_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

std::vector<int64_t> VectorOf(const Tensor& t) {
  const auto flat = t.flat<int64_t>();
  return std::vector<int64_t>(flat.data(), flat.data() + flat.size());
}

Status OutputVector(OpKernelContext* ctx, int index,
                    const std::vector<int64_t>& values) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      index, TensorShape({static_cast<int64_t>(values.size())}), &out));
  if (!values.empty()) {
    std::memcpy(out->flat<int64_t>().data(), values.data(),
                values.size() * sizeof(int64_t));
  }
  return OkStatus();
}

// The sids in every vector of the input list `name` (in the first's order).
Status Intersection(OpKernelContext* ctx, const char* name,
                    std::vector<int64_t>* out) {
  OpInputList lists;
  TF_RETURN_IF_ERROR(ctx->input_list(name, &lists));
  out->clear();
  if (lists.size() == 0) return OkStatus();
  *out = VectorOf(lists[0]);
  for (int k = 1; k < lists.size(); ++k) {
    const std::vector<int64_t> other = VectorOf(lists[k]);
    const std::unordered_set<int64_t> set(other.begin(), other.end());
    std::vector<int64_t> kept;
    for (int64_t sid : *out) {
      if (set.count(sid) != 0) kept.push_back(sid);
    }
    out->swap(kept);
  }
  return OkStatus();
}

// The round's id at `input`, a scalar, admitted by `log` (its generation not older than the log's).
Status AdmitRound(OpKernelContext* ctx, int input, const DeltaLog& log) {
  if (!TensorShapeUtils::IsScalar(ctx->input(input).shape())) {
    return errors::InvalidArgument("`round_id` must be a scalar");
  }
  return log.Admits(ctx->input(input).scalar<int64_t>()());
}

// Outputs (rows, delta, entry, sids, seqs) of the apply entries of `target`
// not marked folded: entry i's distinct rows and words, rows tagged with i.
class DeltaLogTakeOp : public OpKernel {
 public:
  explicit DeltaLogTakeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("target", &target_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("width", &width_));
  }
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    const std::vector<DeltaLog::Entry> entries = log->Take(target_);
    // An apply entry holds coef-1 words per row as written (rows unique after the optimizer's
    // dedup; a repeated row would only fold twice, which XOR makes the same): copied as they are,
    // not materialized (no sort, no merge).
    int64_t n = 0;
    std::vector<int64_t> sids, seqs;
    for (const DeltaLog::Entry& e : entries) {
      OP_REQUIRES(ctx, e.rows.empty() || (e.delta.dims() == 2 && e.width() == width_ && e.coef == 1),
                  errors::InvalidArgument("the apply entry ", e.seq, " of target ", target_, " has ",
                                          e.delta.dims() == 2 ? e.width() : -1, " words per row, not ", width_));
      n += static_cast<int64_t>(e.rows.size());
      sids.push_back(e.sid);
      seqs.push_back(e.seq);
    }
    Tensor* rows = nullptr;
    Tensor* delta = nullptr;
    Tensor* entry = nullptr;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &rows));
    EC_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, width_}), &delta));
    EC_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &entry));
    int64_t at = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const DeltaLog::Entry& e = entries[i];
      const int64_t k = static_cast<int64_t>(e.rows.size());
      if (k == 0) continue;
      std::memcpy(rows->flat<int64_t>().data() + at, e.rows.data(), k * sizeof(int64_t));
      std::memcpy(delta->flat<int32>().data() + at * width_, e.delta.flat<int32>().data(),
                  k * width_ * sizeof(int32_t));
      std::fill_n(entry->flat<int32>().data() + at, k, static_cast<int32>(i));
      at += k;
    }
    EC_REQUIRES_OK(ctx, OutputVector(ctx, 3, sids));
    EC_REQUIRES_OK(ctx, OutputVector(ctx, 4, seqs));
  }

 private:
  int target_ = 0;
  int64_t width_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogTake").Device(DEVICE_CPU), DeltaLogTakeOp);

// Folds every taken entry into the target and logs it, as ParityUpdateLogged
// would one by one, under one lock; skips the rows of an entry the target's
// log holds already, and an entry its log refuses (fenced, committed, of an
// older generation: settlement's).  present[i]: entry i's fold is in the
// target now.  An entry with no rows for this target logs nothing.
class ParityFoldBatchOp : public OpKernel {
 public:
  explicit ParityFoldBatchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("field_bits", &field_bits_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("target", &target_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("source", &source_));
    OP_REQUIRES(ctx, field_bits_ == 8 || field_bits_ == 16,
                errors::InvalidArgument("`field_bits` must be 8 or 16, got ", field_bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& delta = ctx->input(2);
    const Tensor& entry = ctx->input(3);
    const std::vector<int64_t> sids = VectorOf(ctx->input(4));
    const std::vector<int64_t> seqs = VectorOf(ctx->input(5));
    EC_REQUIRES_OK(ctx, RowsAndDelta(rows, delta));
    OP_REQUIRES(ctx, entry.NumElements() == rows.NumElements() && sids.size() == seqs.size(),
                errors::InvalidArgument("`entry` needs one index per row and `sids` one seq each"));
    int32 coef = 0;
    EC_REQUIRES_OK(ctx, ScalarInput(ctx, 6, "coef", &coef));
    OP_REQUIRES(ctx, coef >= 1 && coef < (1 << field_bits_),
                errors::InvalidArgument("`coef` must be a non-zero element of GF(2^", field_bits_, "), got ", coef));
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 7, &log));
    EC_REQUIRES_OK(ctx, AdmitRound(ctx, 8, *log));
    const int64_t m = static_cast<int64_t>(sids.size());
    std::vector<int64_t> ids;
    EC_REQUIRES_OK(ctx, RowIds(rows, "rows", &ids));
    std::vector<std::vector<int64_t>> positions(m);
    const auto which = entry.flat<int32>();
    for (size_t i = 0; i < ids.size(); ++i) {
      OP_REQUIRES(ctx, which(i) >= 0 && which(i) < m,
                  errors::InvalidArgument("entry ", which(i), " of row ", i, " is outside the ", m, " entries"));
      positions[which(i)].push_back(static_cast<int64_t>(i));
    }
    Tensor* present = nullptr;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &present));

    LockedVariables vars;
    EC_REQUIRES_OK(ctx, vars.Acquire<int32>(ctx, {0}, {"parity"}));
    Tensor* parity = vars.tensor(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(parity->shape()) && parity->dim_size(1) == delta.dim_size(1),
                errors::InvalidArgument("`parity` ", parity->shape().DebugString(), " and `delta` ",
                                        delta.shape().DebugString(), " must be matrices of equal width"));
    EC_REQUIRES_OK(ctx, RowsInRange(ids, parity->dim_size(0)));
    const int64_t width = parity->dim_size(1);
    Tensor shared;  // what the log entries hold: slices of the input where they can
    EC_REQUIRES_OK(ctx, ShareOrCopy(ctx, delta, &shared));
    std::string key;
    if (log->view().active()) EC_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
    // What the target holds of each entry already (a round that overlapped
    // this one, or an earlier route of the same parity variable: routes fold
    // disjoint rows, so the check is per row, as the settlement's dedupe).
    const auto held = log->FoldedRowsBySid(target_, source_);
    const int32_t* src = delta.matrix<int32>().data();
    int32_t* dst = parity->matrix<int32>().data();
    const galois::WordScaler scale(field_bits_, static_cast<uint32_t>(coef));
    auto flags = present->flat<bool>();
    for (int64_t e = 0; e < m; ++e) {
      std::vector<int64_t> at;
      const auto found = held.find(sids[e]);
      for (int64_t i : positions[e]) {
        if (found == held.end() || found->second.count(ids[i]) == 0) at.push_back(i);
      }
      flags(e) = at.empty();  // nothing of it left to fold here
      if (at.empty()) continue;
      LogWrite write;
      if (!write.Begin(log.get(), sids[e], /*bypass=*/false).ok()) continue;  // settlement's now
      DeltaLog::Entry logged;
      logged.sid = sids[e];
      logged.target = target_;
      logged.source = source_;
      logged.source_seq = seqs[e];
      logged.kind = DeltaLog::kFold;
      const int64_t k = static_cast<int64_t>(at.size());
      // An entry's rows are contiguous in the routed batch (routing keeps the take's order): its
      // log entry shares them, where the slice stays aligned for Eigen; else it gets a copy.
      const bool slice = at.back() - at.front() + 1 == k &&
                         (at.front() * width * static_cast<int64_t>(sizeof(int32_t))) % EIGEN_MAX_ALIGN_BYTES == 0;
      if (slice) {
        logged.delta = shared.Slice(at.front(), at.front() + k);
      } else {
        EC_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({k, width}), &logged.delta));
        int32_t* copy = logged.delta.matrix<int32>().data();
        for (int64_t j = 0; j < k; ++j) {
          std::memcpy(copy + j * width, src + at[j] * width, width * sizeof(int32_t));
        }
      }
      for (int64_t i : at) logged.rows.push_back(ids[i]);
      if (log->view().active()) {
        log->view().Preserve(key, {WordsOf(parity)}, logged.rows.data(), static_cast<int64_t>(logged.rows.size()));
      }
      for (int64_t i : at) {
        if (coef == 1) {
          XorWords(src + i * width, dst + ids[i] * width, width);
        } else {
          scale.XorScaled(src + i * width, dst + ids[i] * width, width);
        }
      }
      logged.coef = static_cast<uint32_t>(coef);
      logged.field_bits = field_bits_;
      log->Append(std::move(logged));
      flags(e) = true;
    }
  }

 private:
  int field_bits_ = 16;
  int target_ = 0;
  int source_ = -1;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>ParityFoldBatch").Device(DEVICE_CPU), ParityFoldBatchOp);

Status MarkFolded(OpKernelContext* ctx, DeltaLog* log) {
  const std::vector<int64_t> seqs = VectorOf(ctx->input(1));
  OpInputList present;
  TF_RETURN_IF_ERROR(ctx->input_list("present", &present));
  for (int k = 0; k < present.size(); ++k) {
    if (present[k].NumElements() != static_cast<int64_t>(seqs.size())) {
      return errors::InvalidArgument("`present` ", k, " has ", present[k].NumElements(), " flags for ",
                                     seqs.size(), " entries");
    }
  }
  std::vector<int64_t> folded;
  for (size_t i = 0; i < seqs.size(); ++i) {
    bool everywhere = true;
    for (int k = 0; k < present.size(); ++k) everywhere = everywhere && present[k].flat<bool>()(i);
    if (everywhere) folded.push_back(seqs[i]);
  }
  log->MarkFolded(folded);
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogMarkFolded").Device(DEVICE_CPU), DeltaLogOp<MarkFolded>);

Status Ready(OpKernelContext* ctx, DeltaLog* log) {
  std::vector<int64_t> candidates;
  TF_RETURN_IF_ERROR(Intersection(ctx, "counted", &candidates));
  return OutputVector(ctx, 0, log->Ready(candidates));
}
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogReady").Device(DEVICE_CPU), DeltaLogOp<Ready>);

Status CommitEach(OpKernelContext* ctx, DeltaLog* log) {
  TF_RETURN_IF_ERROR(AdmitRound(ctx, 1, *log));
  std::vector<int64_t> ready;
  TF_RETURN_IF_ERROR(Intersection(ctx, "ready", &ready));
  return OutputVector(ctx, 0, log->CommitEach(ready));
}
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogCommitEach").Device(DEVICE_CPU), DeltaLogOp<CommitEach>);

class DeltaLogCountedOp : public OpKernel {
 public:
  explicit DeltaLogCountedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("target", &target_));
  }
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    EC_REQUIRES_OK(ctx, OutputVector(ctx, 0, log->Counted(target_)));
  }

 private:
  int target_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogCounted").Device(DEVICE_CPU), DeltaLogCountedOp);

Status IsCommitted(OpKernelContext* ctx, DeltaLog* log) {
  const std::vector<int64_t> sids = VectorOf(ctx->input(1));
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({static_cast<int64_t>(sids.size())}), &out));
  for (size_t i = 0; i < sids.size(); ++i) out->flat<bool>()(i) = log->IsCommitted(sids[i]);
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogIsCommitted").Device(DEVICE_CPU), DeltaLogOp<IsCommitted>);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
