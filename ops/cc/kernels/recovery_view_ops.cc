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

Status RowsOf(const Tensor& t, const char* name, std::vector<int64_t>* rows) {
  if (!TensorShapeUtils::IsVector(t.shape())) {
    return errors::InvalidArgument("`", name, "` must be a vector, got shape ",
                                   t.shape().DebugString());
  }
  rows->clear();
  if (t.dtype() == DT_INT32) {
    const auto flat = t.flat<int32>();
    rows->assign(flat.data(), flat.data() + flat.size());
  } else {
    const auto flat = t.flat<int64_t>();
    rows->assign(flat.data(), flat.data() + flat.size());
  }
  return OkStatus();
}

Status InRange(const std::vector<int64_t>& rows, int64_t num_rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows) {
      return errors::InvalidArgument("rows[", i, "] = ", rows[i],
                                     " is out of range [0, ", num_rows, ")");
    }
  }
  return OkStatus();
}

class RebuildBeginPendingOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    std::string key;
    OP_REQUIRES_OK(ctx, VariableKey(ctx, 1, &key));
    const int64_t rows = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES(ctx, rows >= 0,
                errors::InvalidArgument("`rows` must be >= 0, got ", rows));
    log->view().BeginPending(key, rows);
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>RebuildBeginPending").Device(DEVICE_CPU),
                        RebuildBeginPendingOp);

class RecoveryViewStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &out));
    out->vec<int64_t>()(0) = log->view().PendingRows();
    out->vec<int64_t>()(1) = log->view().SavedRows();
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>RecoveryViewStats").Device(DEVICE_CPU),
                        RecoveryViewStatsOp);

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
    OP_REQUIRES_OK_ASYNC(ctx, RowsOf(ctx->input(2), "rows", &rows), done);
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

class WantedRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    std::string key;
    OP_REQUIRES_OK(ctx, VariableKey(ctx, 1, &key));
    const int64_t lo = ctx->input(2).scalar<int64_t>()();
    const int64_t hi = ctx->input(3).scalar<int64_t>()();
    std::vector<int64_t> rows = log->view().Wanted(key, lo, hi);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(rows.size())}),
                            &out));
    if (!rows.empty()) {
      std::memcpy(out->vec<int64_t>().data(), rows.data(),
                  rows.size() * sizeof(int64_t));
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>WantedRows").Device(DEVICE_CPU),
                        WantedRowsOp);

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

class InstallRowWordsOp : public OpKernel {
 public:
  explicit InstallRowWordsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("add", &add_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, n_, &log));
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, RowsOf(ctx->input(n_ + 1), "rows", &rows));
    const Tensor& words = ctx->input(n_ + 2);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = 0;
    if (rows.empty()) return;
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(words.shape()) &&
                         words.dim_size(0) == static_cast<int64_t>(rows.size()),
                errors::InvalidArgument("`words` must be [", rows.size(),
                                        ", width], got shape ",
                                        words.shape().DebugString()));
    std::string key;
    OP_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
    LockedVariables vars;
    std::vector<WordTable> tables;
    int64_t width = 0;
    OP_REQUIRES_OK(ctx, LockWordTables(ctx, 0, n_, &vars, &tables, &width));
    OP_REQUIRES(ctx, words.dim_size(1) == width,
                errors::InvalidArgument(
                    "`words` rows have ", words.dim_size(1), " words but the "
                    "variables' rows have ", width, " together; they must be "
                    "equal"));
    OP_REQUIRES_OK(ctx, InRange(rows, tables.front().rows));
    std::vector<bool> pending;
    log->view().Claim(key, rows, &pending);
    const int32_t* src = words.matrix<int32>().data();
    int64_t installed = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!pending[i]) continue;
      ++installed;
      const int32_t* from = src + static_cast<int64_t>(i) * width;
      for (const WordTable& table : tables) {
        char* dst = table.base + rows[i] * table.words * sizeof(int32_t);
        if (add_) {
          for (int64_t j = 0; j < table.words; ++j) {
            uint32_t word;
            std::memcpy(&word, dst + j * sizeof(uint32_t), sizeof(word));
            word ^= static_cast<uint32_t>(from[j]);
            std::memcpy(dst + j * sizeof(uint32_t), &word, sizeof(word));
          }
        } else {
          std::memcpy(dst, from, table.words * sizeof(int32_t));
        }
        from += table.words;
      }
    }
    log->view().Installed(key, rows, pending);  // still under the locks
    out->scalar<int64_t>()() = installed;
  }

 private:
  int n_ = 1;
  bool add_ = false;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>InstallRowWords").Device(DEVICE_CPU),
                        InstallRowWordsOp);

class PreserveRangesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    std::string key;
    OP_REQUIRES_OK(ctx, VariableKey(ctx, 1, &key));
    const Tensor& t = ctx->input(2);
    OP_REQUIRES(ctx, t.dims() == 2 && t.dim_size(1) == 2,
                errors::InvalidArgument("`ranges` must be [m, 2], got shape ",
                                        t.shape().DebugString()));
    const auto m = t.matrix<int64_t>();
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t i = 0; i < t.dim_size(0); ++i) {
      OP_REQUIRES(ctx, m(i, 0) >= 0 && m(i, 0) <= m(i, 1),
                  errors::InvalidArgument("ranges[", i, "] = [", m(i, 0), ", ",
                                          m(i, 1), ") is not a range of rows"));
      if (m(i, 0) < m(i, 1)) ranges.emplace_back(m(i, 0), m(i, 1));
    }
    log->view().BeginPreserve(key, std::move(ranges));
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>PreserveRanges").Device(DEVICE_CPU),
                        PreserveRangesOp);

class PreserveEndOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    log->view().EndPreserve();
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>PreserveEnd").Device(DEVICE_CPU),
                        PreserveEndOp);

class ReadPreservedRowWordsOp : public OpKernel {
 public:
  explicit ReadPreservedRowWordsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, RowsOf(ctx->input(n_ + 1), "rows", &rows));
    Tensor* out = nullptr;
    if (rows.empty()) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0, 0}), &out));
      return;
    }
    core::RefCountPtr<DeltaLog> log;
    OP_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, n_, &log));
    std::string key;
    OP_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
    LockedVariables vars;
    std::vector<WordTable> tables;
    int64_t width = 0;
    OP_REQUIRES_OK(ctx, LockWordTables(ctx, 0, n_, &vars, &tables, &width));
    OP_REQUIRES_OK(ctx, InRange(rows, tables.front().rows));
    const int64_t n = static_cast<int64_t>(rows.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, width}), &out));
    int32_t* dst = out->matrix<int32>().data();
    GatherRowWords(tables, n, width, [&rows](int64_t i) { return rows[i]; },
                   reinterpret_cast<char*>(dst));
    OP_REQUIRES_OK(ctx, log->view().Substitute(key, rows.data(), n, width, dst));
  }

 private:
  int n_ = 1;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>ReadPreservedRowWords").Device(DEVICE_CPU),
                        ReadPreservedRowWordsOp);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
