// Kernels of the recovery-view ops (ops/cc/ops/recovery_view_ops.cc).

#define EIGEN_USE_THREADS

#include <cstdint>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/cc/kernels/cancellable_wait.h"
#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/delta_log_inputs.h"
#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/recovery_view.h"
#include "ops/cc/kernels/word_tables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/env.h"

namespace tensorflow {
namespace ec_rec {
namespace {

// A kernel that runs `Run` on the log at input 0 and the key of the variable
// group at input 1.
template <Status (*Run)(OpKernelContext*, DeltaLog*, const std::string&)>
class GroupViewOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    std::string key;
    EC_REQUIRES_OK(ctx, LookupLogAndKey(ctx, &log, &key));
    EC_REQUIRES_OK(ctx, Run(ctx, log.get(), key));
  }
};

Status BeginPending(OpKernelContext* ctx, DeltaLog* log,
                    const std::string& key) {
  const int64_t rows = ctx->input(2).scalar<int64_t>()();
  if (rows < 0) {
    return errors::InvalidArgument("`rows` must be >= 0, got ", rows);
  }
  log->view().BeginPending(key, rows);
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>RebuildBeginPending").Device(DEVICE_CPU),
                        GroupViewOp<BeginPending>);

Status ViewStats(OpKernelContext* ctx, DeltaLog* log) {
  return VectorOutput(ctx, 0,
                      {log->view().PendingRows(), log->view().SavedRows(),
                       log->view().PreservedGroups()});
}
REGISTER_KERNEL_BUILDER(Name("EcRec>RecoveryViewStats").Device(DEVICE_CPU),
                        DeltaLogOp<ViewStats>);

// Asynchronous, so that lookups waiting for their rows hold no thread of the
// PS (the rebuild's own ops need them). Registered with the step's
// cancellation manager: a step cut by its deadline stops waiting.
class AwaitRebuiltRowsOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK_ASYNC(ctx, LookupOrCreateDeltaLog(ctx, 0, &log), done);
    if (!log->view().active()) {
      done();
      return;
    }
    std::string key;
    OP_REQUIRES_OK_ASYNC(ctx, VariableKey(ctx, 1, &key), done);
    std::vector<int64_t> rows;
    OP_REQUIRES_OK_ASYNC(ctx, RowIds(ctx->input(2), "rows", &rows), done);
    DeltaLog* raw = log.get();
    CancellableWait(
        ctx, std::move(done), raw,
        [raw, &key, &rows](std::function<void(const Status&)> finish) {
          return raw->view().Await(key, std::move(rows), std::move(finish));
        },
        [raw](int64_t id) { raw->view().Cancel(id); });
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>AwaitRebuiltRows").Device(DEVICE_CPU),
                        AwaitRebuiltRowsOp);

Status Wanted(OpKernelContext* ctx, DeltaLog* log, const std::string& key) {
  const int64_t lo = ctx->input(2).scalar<int64_t>()();
  const int64_t hi = ctx->input(3).scalar<int64_t>()();
  return VectorOutput(ctx, 0, log->view().Wanted(key, lo, hi));
}
REGISTER_KERNEL_BUILDER(Name("EcRec>WantedRows").Device(DEVICE_CPU),
                        GroupViewOp<Wanted>);

class WaitWantedOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK_ASYNC(ctx, LookupOrCreateDeltaLog(ctx, 0, &log), done);
    const int64_t timeout_ms = ctx->input(1).scalar<int64_t>()();
    DeltaLog* raw = log.get();
    const int64_t id = raw->view().WaitWanted(done);
    if (id < 0) return;
    raw->Ref();  // released by the timeout
    Env::Default()->SchedClosureAfter(
        std::max<int64_t>(timeout_ms, 0) * 1000, [raw, id]() {
          raw->view().WantedTimeOut(id);
          raw->Unref();
        });
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>WaitWanted").Device(DEVICE_CPU),
                        WaitWantedOp);

class InstallRowWordsOp : public VarsOpKernel {
 public:
  explicit InstallRowWordsOp(OpKernelConstruction* ctx) : VarsOpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("add", &add_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, n_, &log));
    std::vector<int64_t> rows;
    EC_REQUIRES_OK(ctx, RowIds(ctx->input(n_ + 1), "rows", &rows));
    const Tensor& words = ctx->input(n_ + 2);
    Tensor* out = nullptr;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = 0;
    if (rows.empty()) return;
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(words.shape()) &&
                         words.dim_size(0) == static_cast<int64_t>(rows.size()),
                errors::InvalidArgument("`words` must be [", rows.size(),
                                        ", width], got shape ",
                                        words.shape().DebugString()));
    std::string key;
    EC_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 0, n_));
    EC_REQUIRES_OK(ctx, locked.CheckWidth("words", words.dim_size(1)));
    EC_REQUIRES_OK(ctx, RowsInRange(rows, locked.rows()));
    std::vector<bool> pending;
    log->view().Claim(key, rows, &pending);
    const int32_t* src = words.matrix<int32>().data();
    int64_t installed = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!pending[i]) continue;
      ++installed;
      PutRowWords(locked.tables, rows[i],
                  src + static_cast<int64_t>(i) * locked.width, add_);
    }
    log->view().InstallSaved(key, rows, pending, src, locked.width, add_);
    log->view().Installed(key, rows, pending);  // still under the locks
    out->scalar<int64_t>()() = installed;
  }

 private:
  bool add_ = false;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>InstallRowWords").Device(DEVICE_CPU),
                        InstallRowWordsOp);

Status PreserveRanges(OpKernelContext* ctx, DeltaLog* log,
                      const std::string& key) {
  const Tensor& t = ctx->input(2);
  if (t.dims() != 2 || t.dim_size(1) != 2) {
    return errors::InvalidArgument("`ranges` must be [m, 2], got shape ",
                                   t.shape().DebugString());
  }
  const auto m = t.matrix<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = 0; i < t.dim_size(0); ++i) {
    if (m(i, 0) < 0 || m(i, 0) > m(i, 1)) {
      return errors::InvalidArgument("ranges[", i, "] = [", m(i, 0), ", ",
                                     m(i, 1), ") is not a range of rows");
    }
    if (m(i, 0) < m(i, 1)) ranges.emplace_back(m(i, 0), m(i, 1));
  }
  log->view().BeginPreserve(key, std::move(ranges));
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>PreserveRanges").Device(DEVICE_CPU),
                        GroupViewOp<PreserveRanges>);

Status ForgetPending(OpKernelContext*, DeltaLog* log) {
  log->view().ForgetPending();
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>RebuildForgetPending").Device(DEVICE_CPU),
                        DeltaLogOp<ForgetPending>);

Status EndPreserve(OpKernelContext*, DeltaLog* log) {
  log->view().EndPreserve();
  return OkStatus();
}
REGISTER_KERNEL_BUILDER(Name("EcRec>PreserveEnd").Device(DEVICE_CPU),
                        DeltaLogOp<EndPreserve>);

class ReadPreservedRowWordsOp : public VarsOpKernel {
 public:
  using VarsOpKernel::VarsOpKernel;

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> rows;
    EC_REQUIRES_OK(ctx, RowIds(ctx->input(n_ + 1), "rows", &rows));
    Tensor* out = nullptr;
    if (rows.empty()) {
      EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0, 0}), &out));
      return;
    }
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, n_, &log));
    std::string key;
    EC_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 0, n_));
    EC_REQUIRES_OK(ctx, RowsInRange(rows, locked.rows()));
    const int64_t n = static_cast<int64_t>(rows.size());
    const int64_t width = locked.width;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, width}), &out));
    int32_t* dst = out->matrix<int32>().data();
    GatherRowWords(locked.tables, n, width,
                   [&rows](int64_t i) { return rows[i]; },
                   reinterpret_cast<char*>(dst));
    EC_REQUIRES_OK(ctx, log->view().Substitute(key, rows.data(), n, width, dst));
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>ReadPreservedRowWords").Device(DEVICE_CPU),
                        ReadPreservedRowWordsOp);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
