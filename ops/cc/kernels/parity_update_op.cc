// Kernels of EcRec>ParityUpdate: parity[rows[i]] ^= coef * delta[i] over a
// binary field (GF(2^16) or GF(2^8), see galois.h), and of
// EcRec>ParityUpdateLogged, which also appends (rows, delta, coef) to an
// EcRecDeltaLog under the lock (delta shared, not copied; the log multiplies
// and merges rows only when it is read).

#define EIGEN_USE_THREADS

#include <cstdint>
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
#include "ops/cc/kernels/row_shards.h"
#include "ops/cc/kernels/word_tables.h"
#include "ops/cc/kernels/word_loops.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

// kLogged: five more inputs after the stock ones, (log, sid, target, source,
// source_seq), and the `dedupe` attr: recovery finishing a step folds only
// the rows its log does not already hold for (sid, target, source), and
// nothing of a committed sid, checked and written under the parity's lock.
template <typename Tindex, bool kLogged>
class ParityUpdateOp : public OpKernel {
 public:
  explicit ParityUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("field_bits", &field_bits_));
    OP_REQUIRES(ctx, field_bits_ == 8 || field_bits_ == 16,
                errors::InvalidArgument("`field_bits` must be 8 or 16, got ",
                                        field_bits_));
    if (kLogged) {
      EC_REQUIRES_OK(ctx, ReadBypassFence(ctx, &bypass_fence_));
      EC_REQUIRES_OK(ctx, ctx->GetAttr("dedupe", &dedupe_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& delta = ctx->input(2);
    EC_REQUIRES_OK(ctx, RowsAndDelta(rows, delta));
    int32 coef = 0;
    EC_REQUIRES_OK(ctx, ScalarInput(ctx, 3, "coef", &coef));
    const int32 max_coef = (1 << field_bits_) - 1;
    OP_REQUIRES(ctx, coef >= 1 && coef <= max_coef,
                errors::InvalidArgument("`coef` must be a non-zero element of "
                                        "GF(2^", field_bits_, "), in [1, ",
                                        max_coef, "], got ", coef));
    core::RefCountPtr<DeltaLog> log;
    DeltaLog::Tag tag;
    Tensor logged_delta;
    if (kLogged) {
      EC_REQUIRES_OK(ctx, ReadLogInputs(ctx, ctx->num_inputs() - 5,
                                        /*with_source=*/true, &log, &tag,
                                        /*with_source_seq=*/true));
      EC_REQUIRES_OK(ctx, ShareOrCopy(ctx, delta, &logged_delta));
    }

    LockedVariables vars;
    EC_REQUIRES_OK(ctx, vars.Acquire<int32>(ctx, {0}, {"parity"}));
    Tensor* parity = vars.tensor(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(parity->shape()),
                errors::InvalidArgument("`parity` must be a matrix [rows, "
                                        "width], got shape ",
                                        parity->shape().DebugString()));
    const int64_t width = parity->dim_size(1);
    OP_REQUIRES(ctx, delta.dim_size(1) == width,
                errors::InvalidArgument("`delta` rows have ", delta.dim_size(1),
                                        " words but `parity` rows have ", width,
                                        "; they must be equal"));

    if (kLogged && dedupe_) {
      EC_REQUIRES_OK(ctx, FoldMissing(ctx, log.get(), tag, coef, rows, delta,
                                      parity, width));
      return;
    }
    RowShards shards;
    EC_REQUIRES_OK(ctx, shards.Build<Tindex>(rows, parity->dim_size(0), "rows"));
    LogWrite write;  // the last check: from here on the op writes
    if (kLogged) EC_REQUIRES_OK(ctx, write.Begin(log.get(), tag.sid, bypass_fence_));
    if (kLogged) {
      EC_REQUIRES_OK(ctx, PreserveRows(ctx, log.get(), parity,
                                       shards.rows_data(), shards.size()));
    }
    if (shards.size() == 0 || width == 0) {
      if (kLogged) Log(log.get(), tag, coef, &shards, logged_delta);
      return;
    }

    const int32_t* src = delta.matrix<int32>().data();
    int32_t* dst = parity->matrix<int32>().data();
    const galois::WordScaler scale(field_bits_, static_cast<uint32_t>(coef));

    // XOR commutes, so repeated rows need no grouping and the order of a
    // row's occurrences does not matter; shards only keep two threads off
    // the same parity row.
    auto update_shard = [&](const RowShard& shard) {
      auto prefetch = [&](int64_t i) {
        RowShards::Prefetch(dst + shards.row(i) * width, width);
      };
      if (coef == 1) {
        shard.ForEach(
            [&](int64_t i) {
              XorWords(src + i * width, dst + shards.row(i) * width, width);
            },
            prefetch);
      } else {
        shard.ForEach(
            [&](int64_t i) {
              scale.XorScaled(src + i * width, dst + shards.row(i) * width,
                              width);
            },
            prefetch);
      }
    };
    const double bytes = static_cast<double>(width) * sizeof(int32_t);
    const Eigen::TensorOpCost cost(2 * bytes, bytes,
                                   coef == 1 ? width : 2.0 * width);
    shards.ForEachShard(ctx->eigen_cpu_device(), cost, update_shard);
    if (kLogged) Log(log.get(), tag, coef, &shards, logged_delta);  // still under the lock
  }

 private:
  // The dedupe path (recovery only: small, single-threaded), under the lock.
  Status FoldMissing(OpKernelContext* ctx, DeltaLog* log,
                     const DeltaLog::Tag& tag, int32 coef, const Tensor& rows,
                     const Tensor& delta, Tensor* parity, int64_t width) const {
    std::unordered_set<int64_t> done;
    bool settled = false;
    log->FoldedRows(tag.sid, tag.target, tag.source, &done, &settled);
    if (settled) return OkStatus();
    std::vector<int64_t> ids;
    TF_RETURN_IF_ERROR(RowIds(rows, "rows", &ids));
    TF_RETURN_IF_ERROR(RowsInRange(ids, parity->dim_size(0)));
    std::vector<int64_t> keep;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (done.count(ids[i]) == 0) keep.push_back(static_cast<int64_t>(i));
    }
    if (keep.empty()) return OkStatus();
    LogWrite write;
    TF_RETURN_IF_ERROR(write.Begin(log, tag.sid, bypass_fence_));
    std::vector<int64_t> kept_rows;
    for (int64_t i : keep) kept_rows.push_back(ids[i]);
    TF_RETURN_IF_ERROR(PreserveRows(ctx, log, parity, kept_rows.data(),
                                    static_cast<int64_t>(kept_rows.size())));
    DeltaLog::Entry entry = TaggedEntry(tag, DeltaLog::kFold);
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        DT_INT32, TensorShape({static_cast<int64_t>(keep.size()), width}),
        &entry.delta));
    const int32_t* src = delta.matrix<int32>().data();
    int32_t* copy = entry.delta.matrix<int32>().data();
    int32_t* dst = parity->matrix<int32>().data();
    const galois::WordScaler scale(field_bits_, static_cast<uint32_t>(coef));
    for (size_t k = 0; k < keep.size(); ++k) {
      const int64_t i = keep[k];
      const int64_t row = ids[i];
      std::memcpy(copy + k * width, src + i * width, width * sizeof(int32_t));
      if (coef == 1) {
        XorWords(src + i * width, dst + row * width, width);
      } else {
        scale.XorScaled(src + i * width, dst + row * width, width);
      }
      entry.rows.push_back(row);
    }
    entry.coef = static_cast<uint32_t>(coef);
    entry.field_bits = field_bits_;
    log->Append(std::move(entry));
    return OkStatus();
  }

  // A survivor keeps the T0 words of rows a rebuild decodes from
  // (recovery_view.h); a parity row pending on a rebuilt PS takes folds.
  static Status PreserveRows(OpKernelContext* ctx, DeltaLog* log,
                             Tensor* parity, const int64_t* rows, int64_t n) {
    if (!log->view().active() || n == 0) return OkStatus();
    std::string key;
    TF_RETURN_IF_ERROR(VariableKey(ctx, 0, &key));
    log->view().Preserve(key, {WordsOf(parity)}, rows, n);
    return OkStatus();
  }

  void Log(DeltaLog* log, const DeltaLog::Tag& tag, int32 coef,
           RowShards* shards, const Tensor& delta) const {
    DeltaLog::Entry entry = TaggedEntry(tag, DeltaLog::kFold);
    entry.rows = shards->ReleaseRows();
    entry.delta = delta;
    entry.coef = static_cast<uint32_t>(coef);
    entry.field_bits = field_bits_;
    log->Append(std::move(entry));
  }

  int field_bits_ = 16;
  bool bypass_fence_ = false;
  bool dedupe_ = false;
};

#define EC_REC_REGISTER_PARITY_UPDATE(NAME, LOGGED)                  \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                \
                              .Device(DEVICE_CPU)                   \
                              .TypeConstraint<int32>("Tindices"),   \
                          ParityUpdateOp<int32, LOGGED>);           \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                \
                              .Device(DEVICE_CPU)                   \
                              .TypeConstraint<int64_t>("Tindices"), \
                          ParityUpdateOp<int64_t, LOGGED>)

EC_REC_REGISTER_PARITY_UPDATE("EcRec>ParityUpdate", false);
EC_REC_REGISTER_PARITY_UPDATE("EcRec>ParityUpdateLogged", true);

#undef EC_REC_REGISTER_PARITY_UPDATE

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
