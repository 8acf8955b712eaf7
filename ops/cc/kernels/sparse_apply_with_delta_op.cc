// Kernels of EcRec>SparseApply*WithDelta: a sparse optimizer step on float32
// resource variables that also returns old XOR new of every touched row, and
// of their ...Logged variants, which also append (indices, that delta) to an
// EcRecDeltaLog before releasing the variables' locks.
//
// Like the stock kernels, they view var, slots and grad as [rows, dim]
// matrices (`flat_outer_dims`), dim being the elements of a row.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/delta_log_inputs.h"
#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/momentum_rules.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/optimizer_rules.h"
#include "ops/cc/kernels/recovery_view.h"
#include "ops/cc/kernels/row_shards.h"
#include "ops/cc/kernels/word_tables.h"
#include "ops/cc/kernels/word_loops.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tensorflow {
namespace ec_rec {
namespace {

// The op: validate, lock var and slots, then for every distinct row
//   delta[first occurrence] = bits(old rows), apply each occurrence in input
//   order, delta[first occurrence] ^= bits(new rows),
// with zeros for the later occurrences of a row. Distinct rows run in
// parallel on the intra-op pool; all of it happens under the locks.
//
// kLogged: the op has three more inputs after the stock ones, (log, sid,
// target); the ids and the delta output (shared, not copied: nothing writes
// it after this op) are appended to the log as one entry while the locks are
// still held.
template <typename Rule, typename Tindex, bool kLogged>
class SparseApplyWithDeltaOp : public OpKernel {
 public:
  explicit SparseApplyWithDeltaOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), rule_(ctx) {
    if (kLogged) EC_REQUIRES_OK(ctx, ReadBypassFence(ctx, &bypass_fence_));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr int kTables = 1 + Rule::kNumSlots;
    const std::vector<const char*> names = Rule::VariableNames();

    typename Rule::Hyper hyper;
    EC_REQUIRES_OK(ctx, rule_.Read(ctx, &hyper));
    const Tensor& grad = ctx->input(Rule::kGradInput);
    const Tensor& indices = ctx->input(Rule::kIndicesInput);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(indices.shape()),
                errors::InvalidArgument("`indices` must be a vector, got shape ",
                                        indices.shape().DebugString()));
    OP_REQUIRES(ctx, grad.dims() >= 1 && grad.dim_size(0) == indices.dim_size(0),
                errors::InvalidArgument(
                    "`grad` must have one row per id: shape [",
                    indices.dim_size(0), ", ...], got ",
                    grad.shape().DebugString()));
    core::RefCountPtr<DeltaLog> log;
    DeltaLog::Tag tag;
    if (kLogged) {
      EC_REQUIRES_OK(ctx, ReadLogInputs(ctx, ctx->num_inputs() - 3,
                                        /*with_source=*/false, &log, &tag));
    }

    std::vector<int> inputs(kTables);
    for (int t = 0; t < kTables; ++t) inputs[t] = t;
    LockedVariables vars;
    EC_REQUIRES_OK(ctx, vars.Acquire<float>(ctx, inputs, names));

    const TensorShape& shape = vars.tensor(0)->shape();
    OP_REQUIRES(ctx, shape.dims() >= 1,
                errors::InvalidArgument("`var` must have rank >= 1 (rows "
                                        "first), got a scalar"));
    for (int t = 1; t < kTables; ++t) {
      OP_REQUIRES(ctx, vars.tensor(t)->shape() == shape,
                  errors::InvalidArgument(
                      "`", names[t], "` has shape ",
                      vars.tensor(t)->shape().DebugString(), " but `var` has ",
                      shape.DebugString(), "; they must be equal"));
    }
    TensorShape row_shape = shape;
    row_shape.RemoveDim(0);
    TensorShape grad_row_shape = grad.shape();
    grad_row_shape.RemoveDim(0);
    OP_REQUIRES(ctx, grad_row_shape == row_shape,
                errors::InvalidArgument(
                    "`grad` rows have shape ", grad_row_shape.DebugString(),
                    " but `var` rows have shape ", row_shape.DebugString(),
                    "; they must be equal"));
    const int64_t dim = row_shape.num_elements();
    OP_REQUIRES(ctx, dim > 0,
                errors::InvalidArgument("`var` rows must not be empty, got "
                                        "shape ",
                                        shape.DebugString()));

    RowShards ids;
    EC_REQUIRES_OK(ctx, ids.Build<Tindex>(indices, shape.dim_size(0),
                                          "indices"));

    const int64_t width = kTables * dim;
    Tensor* delta = nullptr;
    EC_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({ids.size(), width}), &delta));
    LogWrite write;  // the last check: from here on the op writes
    if (kLogged) EC_REQUIRES_OK(ctx, write.Begin(log.get(), tag.sid, bypass_fence_));
    if (kLogged && log->view().active() && ids.size() > 0) {
      // A PS being rebuilt refuses updates of rows not there yet; a survivor
      // keeps the words the rebuild decodes from (recovery_view.h).
      std::string key;
      EC_REQUIRES_OK(ctx, VariableKey(ctx, 0, &key));
      EC_REQUIRES_OK(ctx, log->view().CheckWritable(key, ids.rows_data(), ids.size()));
      std::vector<WordTable> words;
      for (int t = 0; t < kTables; ++t) words.push_back(WordsOf(vars.tensor(t)));
      log->view().Preserve(key, words, ids.rows_data(), ids.size());
    }
    if (ids.size() == 0) {
      if (kLogged) Log(log.get(), tag, &ids, *delta);
      return;
    }
    ids.MarkFirstOccurrences();

    std::vector<Rows> tables;
    tables.reserve(kTables);
    for (int t = 0; t < kTables; ++t) {
      tables.push_back(vars.tensor(t)->flat_outer_dims<float>());
    }
    const ConstRows grads = grad.flat_outer_dims<float>();
    int32_t* out = delta->matrix<int32>().data();
    const Rule& rule = rule_;

    auto copy_old = [&](int64_t row, int32_t* out_row) {
      for (int t = 0; t < kTables; ++t) {
        CopyWords(tables[t].data() + row * dim, out_row + t * dim, dim);
      }
    };
    auto xor_new = [&](int64_t row, int32_t* out_row) {
      for (int t = 0; t < kTables; ++t) {
        XorWords(tables[t].data() + row * dim, out_row + t * dim, dim);
      }
    };
    // Without repeats every row is done in one visit, while it is in cache.
    // With repeats the new bits are only known after the shard's last
    // occurrence of the row, so they are XORed in by a second pass.
    auto apply_shard = [&](const RowShard& shard) {
      if (!ids.has_duplicates()) {
        shard.ForEach(
            [&](int64_t i) {
              const int64_t row = ids.row(i);
              int32_t* out_row = out + i * width;
              copy_old(row, out_row);
              rule.ApplyRow(hyper, tables, row, grads, i);
              xor_new(row, out_row);
            },
            [&](int64_t i) {
              for (int t = 0; t < kTables; ++t) {
                RowShards::Prefetch(tables[t].data() + ids.row(i) * dim, dim);
              }
            });
        return;
      }
      shard.ForEach([&](int64_t i) {
        const int64_t row = ids.row(i);
        if (ids.is_first(i)) {
          copy_old(row, out + i * width);
        } else {
          std::memset(out + i * width, 0, width * sizeof(int32_t));
        }
        rule.ApplyRow(hyper, tables, row, grads, i);
      });
      shard.ForEach([&](int64_t i) {
        if (ids.is_first(i)) xor_new(ids.row(i), out + i * width);
      });
    };
    const double bytes = static_cast<double>(dim) * sizeof(float);
    const Eigen::TensorOpCost cost(bytes * (2 * kTables + 1),
                                   bytes * 2 * kTables,
                                   static_cast<double>(dim) *
                                       (Rule::kCyclesPerElement + 2 * kTables));
    ids.ForEachShard(ctx->eigen_cpu_device(), cost, apply_shard);
    if (kLogged) Log(log.get(), tag, &ids, *delta);  // still under the locks
  }

  static void Log(DeltaLog* log, const DeltaLog::Tag& tag, RowShards* ids,
                  const Tensor& delta) {
    DeltaLog::Entry entry = TaggedEntry(tag, DeltaLog::kApply);
    entry.rows = ids->ReleaseRows();
    entry.delta = delta;
    log->Append(std::move(entry));
  }

 private:
  const Rule rule_;
  bool bypass_fence_ = false;
};

#define EC_REC_REGISTER_APPLY(NAME, RULE)                                  \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                      \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<int32>("Tindices"),         \
                          SparseApplyWithDeltaOp<RULE, int32, false>);    \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                      \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<int64_t>("Tindices"),       \
                          SparseApplyWithDeltaOp<RULE, int64_t, false>);  \
  REGISTER_KERNEL_BUILDER(Name(NAME "Logged")                             \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<int32>("Tindices"),         \
                          SparseApplyWithDeltaOp<RULE, int32, true>);     \
  REGISTER_KERNEL_BUILDER(Name(NAME "Logged")                             \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<int64_t>("Tindices"),       \
                          SparseApplyWithDeltaOp<RULE, int64_t, true>)

EC_REC_REGISTER_APPLY("EcRec>SparseApplySgdWithDelta", SgdRule);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyAdagradWithDelta", AdagradRule);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyLazyAdamWithDelta", LazyAdamRule);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyFtrlWithDelta", FtrlRule<false>);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyFtrlV2WithDelta", FtrlRule<true>);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyMomentumWithDelta", MomentumRule);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyRMSPropWithDelta", RmsPropRule<false>);
EC_REC_REGISTER_APPLY("EcRec>SparseApplyCenteredRMSPropWithDelta",
                      RmsPropRule<true>);

#undef EC_REC_REGISTER_APPLY

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
