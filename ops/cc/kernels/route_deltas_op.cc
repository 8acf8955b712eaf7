// Kernel of EcRec>RouteDeltas: one apply's (indices, delta) split by the
// parity route each row folds into (see ops/cc/ops/ec_ops.cc).

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

template <typename Tindex>
class RouteDeltasOp : public OpKernel {
 public:
  explicit RouteDeltasOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("chunk_rows", &chunk_rows_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("num_routes", &num_routes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& delta = ctx->input(1);
    const Tensor& bases = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(indices.shape()),
                errors::InvalidArgument("`indices` must be a vector, got shape ",
                                        indices.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(delta.shape()) &&
                         delta.dim_size(0) == indices.dim_size(0),
                errors::InvalidArgument(
                    "`delta` must be a matrix with a row per index, got shape ",
                    delta.shape().DebugString(), " for ", indices.dim_size(0),
                    " indices"));
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(bases.shape()) &&
                         bases.dim_size(0) == num_routes_,
                errors::InvalidArgument("`bases` must be [num_routes=",
                                        num_routes_, ", chunks], got shape ",
                                        bases.shape().DebugString()));
    const int64_t n = indices.dim_size(0);
    const int64_t width = delta.dim_size(1);
    const int64_t chunks = bases.dim_size(1);
    const auto idx = indices.flat<Tindex>();
    const auto base = bases.matrix<int64_t>();
    const int32* words = delta.flat<int32>().data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(idx(i));
      OP_REQUIRES(ctx, row >= 0 && row / chunk_rows_ < chunks,
                  errors::InvalidArgument(
                      "index ", row, " at position ", i, " is outside the ",
                      chunks, " local chunks of ", chunk_rows_, " rows"));
    }
    std::vector<int64_t> picked;
    picked.reserve(n);
    for (int j = 0; j < num_routes_; ++j) {
      picked.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (base(j, static_cast<int64_t>(idx(i)) / chunk_rows_) >= 0) picked.push_back(i);
      }
      const int64_t m = static_cast<int64_t>(picked.size());
      Tensor* rows_out = nullptr;
      Tensor* delta_out = nullptr;
      EC_REQUIRES_OK(ctx, ctx->allocate_output(j, TensorShape({m}), &rows_out));
      EC_REQUIRES_OK(ctx, ctx->allocate_output(num_routes_ + j,
                                               TensorShape({m, width}), &delta_out));
      auto rows = rows_out->flat<int64_t>();
      int32* out = delta_out->flat<int32>().data();
      for (int64_t k = 0; k < m; ++k) {
        const int64_t i = picked[k];
        const int64_t row = static_cast<int64_t>(idx(i));
        rows(k) = base(j, row / chunk_rows_) + row % chunk_rows_;
        std::memcpy(out + k * width, words + i * width, width * sizeof(int32));
      }
    }
  }

 private:
  int64_t chunk_rows_;
  int num_routes_;
};

#define REGISTER(T)                                            \
  REGISTER_KERNEL_BUILDER(Name("EcRec>RouteDeltas")            \
                              .Device(DEVICE_CPU)              \
                              .TypeConstraint<T>("Tindices"),  \
                          RouteDeltasOp<T>);
REGISTER(int32)
REGISTER(int64_t)
#undef REGISTER

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
