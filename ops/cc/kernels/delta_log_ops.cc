// Kernels of the EcRecDeltaLog ops: the handle, commit / read / drop, undo of
// an entry, XOR of rows into variables, and the logged AssignAdd.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cc/kernels/cancellable_wait.h"
#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/delta_log_inputs.h"
#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/word_tables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ec_rec {
namespace {

// Checks rows and width, then XORs row i of `delta` (split across the tables
// in order) into row rows[i] of each table.
Status XorRowsInto(const LockedWordTables& locked,
                   const std::vector<int64_t>& rows, const int32_t* delta,
                   int64_t delta_width) {
  TF_RETURN_IF_ERROR(locked.CheckWidth("delta", delta_width));
  TF_RETURN_IF_ERROR(RowsInRange(rows, locked.rows()));
  for (size_t i = 0; i < rows.size(); ++i) {
    PutRowWords(locked.tables, rows[i],
                delta + static_cast<int64_t>(i) * locked.width, /*add=*/true);
  }
  return OkStatus();
}

// The log at input 0 and the sids at input 1 (named `name`: a scalar or a
// vector) of the commit, fence and drop ops.
Status ReadLogAndSids(OpKernelContext* ctx, const char* name,
                      core::RefCountPtr<DeltaLog>* log,
                      std::vector<int64_t>* sids) {
  const Tensor& t = ctx->input(1);
  if (t.dims() > 1) {
    return errors::InvalidArgument("`", name, "` must be a scalar or a vector, "
                                   "got shape ", t.shape().DebugString());
  }
  const auto flat = t.flat<int64_t>();
  sids->assign(flat.data(), flat.data() + flat.size());
  return LookupOrCreateDeltaLog(ctx, 0, log);
}

// --- the log ----------------------------------------------------------------

REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogHandle").Device(DEVICE_CPU),
                        ResourceHandleOp<DeltaLog>);

class DeltaLogCommitOp : public OpKernel {
 public:
  explicit DeltaLogCommitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ReadBypassFence(ctx, &bypass_fence_));
  }
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    std::vector<int64_t> sids;
    EC_REQUIRES_OK(ctx, ReadLogAndSids(ctx, "sid", &log, &sids));
    EC_REQUIRES_OK(ctx, log->Commit(sids, bypass_fence_));
  }

 private:
  bool bypass_fence_ = false;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogCommit").Device(DEVICE_CPU),
                        DeltaLogCommitOp);

// Round 1 of a step's commit; asynchronous, so that a step waiting for an
// earlier one holds no thread of the PS.
class DeltaLogCommitInOrderOp : public AsyncOpKernel {
 public:
  explicit DeltaLogCommitInOrderOp(OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ReadBypassFence(ctx, &bypass_fence_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("timeout_ms", &timeout_ms_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    core::RefCountPtr<DeltaLog> log;
    std::vector<int64_t> sids;
    OP_REQUIRES_OK_ASYNC(ctx, ReadLogAndSids(ctx, "sid", &log, &sids), done);
    // A step cut while it waits behind an earlier one stops waiting: else the
    // session's close (and the trainer's recovery) waits for the earlier step,
    // which may be a dead task's that only that recovery settles.
    DeltaLog* raw = log.get();
    const bool bypass = bypass_fence_;
    const int64_t timeout_ms = timeout_ms_;
    CancellableWait(
        ctx, std::move(done), raw,
        [raw, &sids, bypass, timeout_ms](std::function<void(const Status&)> finish) {
          return raw->CommitInOrder(std::move(sids), bypass, timeout_ms, std::move(finish));
        },
        [raw](int64_t id) {
          raw->Withdraw(id, errors::Cancelled("the step was cancelled while its commit waited"));
        });
  }

 private:
  bool bypass_fence_ = false;
  int64_t timeout_ms_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogCommitInOrder").Device(DEVICE_CPU),
                        DeltaLogCommitInOrderOp);

// A kernel that runs `Run` on the log at input 0 with the sids at input 1.
template <void (DeltaLog::*Run)(const std::vector<int64_t>&)>
class DeltaLogSidsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    std::vector<int64_t> sids;
    EC_REQUIRES_OK(ctx, ReadLogAndSids(ctx, "sids", &log, &sids));
    (log.get()->*Run)(sids);
  }
};

class DeltaLogSetGenerationOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t generation = 0;
    EC_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "generation", &generation));
    OP_REQUIRES(ctx, generation >= 0 && generation < (int64_t{1} << 14),
                errors::InvalidArgument("`generation` must be in [0, 16384), "
                                        "got ",
                                        generation));
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    log->SetGeneration(generation);
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogSetGeneration").Device(DEVICE_CPU),
                        DeltaLogSetGenerationOp);

class DeltaLogSeqOfOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& sid = ctx->input(1);
    const Tensor& target = ctx->input(2);
    OP_REQUIRES(ctx,
                TensorShapeUtils::IsScalar(sid.shape()) &&
                    TensorShapeUtils::IsScalar(target.shape()),
                errors::InvalidArgument("`sid` and `target` must be scalars"));
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    EC_REQUIRES_OK(ctx, ScalarOutput(ctx, 0,
                                     log->SeqOf(sid.scalar<int64_t>()(),
                                                target.scalar<int32>()())));
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogSeqOf").Device(DEVICE_CPU),
                        DeltaLogSeqOfOp);

Status Pending(OpKernelContext* ctx, DeltaLog* log) {
  return log->Pending(ctx);
}

Status Read(OpKernelContext* ctx, DeltaLog* log) { return log->Read(ctx); }

REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogPending").Device(DEVICE_CPU),
                        DeltaLogOp<Pending>);
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogRead").Device(DEVICE_CPU),
                        DeltaLogOp<Read>);
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogFence").Device(DEVICE_CPU),
                        DeltaLogSidsOp<&DeltaLog::Fence>);
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogDrop").Device(DEVICE_CPU),
                        DeltaLogSidsOp<&DeltaLog::Drop>);

// --- undo and XOR -------------------------------------------------------------

class DeltaLogUndoOp : public VarsOpKernel {
 public:
  explicit DeltaLogUndoOp(OpKernelConstruction* ctx) : VarsOpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("ordered", &ordered_));
  }

  void Compute(OpKernelContext* ctx) override {
    int32 target = 0;
    const Tensor& seqs = ctx->input(1 + n_);
    if (seqs.dims() > 1) {
      ctx->CtxFailure(errors::InvalidArgument(
          "`seq` must be a scalar or a vector, got shape ", seqs.shape().DebugString()));
      return;
    }
    EC_REQUIRES_OK(ctx, ScalarInput(ctx, 2 + n_, "target", &target));
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 1, n_));
    auto undo = [&](const DeltaLog::Words& net) {
      // Rows a rebuild decodes from keep their T0 words.
      if (log->view().active()) {
        std::string key;
        TF_RETURN_IF_ERROR(VariableKey(ctx, 1, &key));
        log->view().Preserve(key, locked.tables, net.rows.data(),
                             static_cast<int64_t>(net.rows.size()));
      }
      return XorRowsInto(locked, net.rows, net.words.data(), net.width);
    };
    Tensor* found = nullptr;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(0, seqs.shape(), &found));
    auto in = seqs.flat<int64_t>();
    auto out = found->flat<bool>();
    out.setConstant(false);
    bool any = false;
    Status status;
    for (int64_t i = 0; i < in.size() && status.ok(); ++i) {
      bool one = false;
      status = log->Undo(in(i), target, ordered_, undo, &one);
      out(i) = one;
      any = any || one;
    }
    if (any) log->WakeAfterUndo();
    EC_REQUIRES_OK(ctx, status);
  }

 private:
  bool ordered_ = true;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>DeltaLogUndo").Device(DEVICE_CPU),
                        DeltaLogUndoOp);

class XorRowsOp : public VarsOpKernel {
 public:
  using VarsOpKernel::VarsOpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& delta = ctx->input(n_ + 1);
    EC_REQUIRES_OK(ctx, RowsAndDelta(ctx->input(n_), delta));
    // Read once, so a concurrent writer cannot slip a row past the check.
    std::vector<int64_t> rows;
    EC_REQUIRES_OK(ctx, RowIds(ctx->input(n_), "rows", &rows));
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 0, n_));
    EC_REQUIRES_OK(ctx, XorRowsInto(locked, rows, delta.matrix<int32>().data(),
                                    delta.dim_size(1)));
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>XorRows").Device(DEVICE_CPU), XorRowsOp);

// --- logged AssignAdd -----------------------------------------------------------

template <typename T>
class AssignAddLoggedOp : public OpKernel {
 public:
  explicit AssignAddLoggedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ReadBypassFence(ctx, &bypass_fence_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("dedupe", &dedupe_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& value = ctx->input(1);
    core::RefCountPtr<DeltaLog> log;
    DeltaLog::Tag tag;
    EC_REQUIRES_OK(ctx, ReadLogInputs(ctx, 2, /*with_source=*/true, &log, &tag));
    LockedVariables vars;
    EC_REQUIRES_OK(ctx, vars.Acquire<T>(ctx, {0}, {"var"}));
    Tensor* var = vars.tensor(0);
    OP_REQUIRES(ctx, value.shape() == var->shape(),
                errors::InvalidArgument(
                    "`value` has shape ", value.shape().DebugString(),
                    " but `var` has shape ", var->shape().DebugString(),
                    "; they must be equal"));
    // With dedupe (recovery finishing a step), a step adds at most once.
    if (dedupe_ && log->HasEntryOrCommitted(tag.sid, tag.target)) return;
    const WordTable table = WordsOf(var);
    DeltaLog::Entry entry = TaggedEntry(tag, DeltaLog::kCounter);
    entry.rows.resize(table.rows);
    for (int64_t r = 0; r < table.rows; ++r) entry.rows[r] = r;
    EC_REQUIRES_OK(ctx, ctx->allocate_temp(
                            DT_INT32, TensorShape({table.rows, table.words}),
                            &entry.delta));
    const int64_t words = table.rows * table.words;
    int32_t* old_words = entry.delta.flat<int32>().data();
    LogWrite write;  // the last check: from here on the op writes
    EC_REQUIRES_OK(ctx, write.Begin(log.get(), tag.sid, bypass_fence_));
    if (words > 0) {
      std::memcpy(old_words, table.base, words * sizeof(int32_t));
    }
    T* dst = var->flat<T>().data();
    const T* src = value.flat<T>().data();
    const int64_t n = value.NumElements();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral<T>::value) {
        // Wrapping addition, as AssignAddVariableOp does in practice.
        using U = typename std::make_unsigned<T>::type;
        dst[i] = static_cast<T>(static_cast<U>(dst[i]) + static_cast<U>(src[i]));
      } else {
        dst[i] = dst[i] + src[i];
      }
    }
    if (words > 0) {
      for (int64_t j = 0; j < words; ++j) {
        int32_t word;
        std::memcpy(&word, table.base + j * sizeof(int32_t), sizeof(word));
        old_words[j] ^= word;
      }
    }
    log->Append(std::move(entry));  // still under the lock
  }

 private:
  bool bypass_fence_ = false;
  bool dedupe_ = false;
};

#define EC_REC_REGISTER_ASSIGN_ADD(T)                                     \
  REGISTER_KERNEL_BUILDER(Name("EcRec>AssignAddLogged")                   \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("dtype"),                \
                          AssignAddLoggedOp<T>)
EC_REC_REGISTER_ASSIGN_ADD(float);
EC_REC_REGISTER_ASSIGN_ADD(double);
EC_REC_REGISTER_ASSIGN_ADD(int32);
EC_REC_REGISTER_ASSIGN_ADD(int64_t);
#undef EC_REC_REGISTER_ASSIGN_ADD

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
