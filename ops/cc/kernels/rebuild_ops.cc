// Kernels of the rebuild ops: slices of rows read and written as 32-bit
// words, and their GF(2^16) / GF(2^8) linear combination.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cc/kernels/galois.h"
#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/word_tables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

Status CheckRange(int64_t start, int64_t count, int64_t rows) {
  if (start < 0 || count < 0 || start > rows || count > rows - start) {
    return errors::InvalidArgument("rows [", start, ", ", start + count,
                                   ") are out of range [0, ", rows, ")");
  }
  return OkStatus();
}

class ReadRowWordsOp : public VarsOpKernel {
 public:
  using VarsOpKernel::VarsOpKernel;

  void Compute(OpKernelContext* ctx) override {
    const int64_t start = ctx->input(n_).scalar<int64_t>()();
    const int64_t count = ctx->input(n_ + 1).scalar<int64_t>()();
    OP_REQUIRES(ctx, count >= 0,
                errors::InvalidArgument("`count` must be >= 0, got ", count));
    Tensor* out = nullptr;
    if (count == 0) {
      EC_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0, 0}), &out));
      return;
    }
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 0, n_));
    EC_REQUIRES_OK(ctx, CheckRange(start, count, locked.rows()));
    EC_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({count, locked.width}), &out));
    GatherRowWords(locked.tables, count, locked.width,
                   [start](int64_t i) { return start + i; },
                   const_cast<char*>(out->tensor_data().data()));
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>ReadRowWords").Device(DEVICE_CPU),
                        ReadRowWordsOp);

class CombineRowsOp : public OpKernel {
 public:
  explicit CombineRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ == 8 || bits_ == 16,
                errors::InvalidArgument("`bits` must be 8 or 16, got ", bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& coefs_t = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(coefs_t.shape()) &&
                         coefs_t.dim_size(0) == n_,
                errors::InvalidArgument("`coefs` must be a vector of ", n_,
                                        " coefficients, got shape ",
                                        coefs_t.shape().DebugString()));
    const auto coefs = coefs_t.vec<int32>();
    const int64_t limit = int64_t{1} << bits_;
    const Tensor* shape_of = nullptr;
    for (int j = 0; j < n_; ++j) {
      OP_REQUIRES(ctx, coefs(j) >= 0 && coefs(j) < limit,
                  errors::InvalidArgument("coefs[", j, "] = ", coefs(j),
                                          " is not an element of GF(2^", bits_,
                                          ")"));
      if (coefs(j) == 0) continue;
      const Tensor& part = ctx->input(1 + j);
      OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(part.shape()),
                  errors::InvalidArgument("parts[", j, "] must be a matrix, "
                                          "got shape ",
                                          part.shape().DebugString()));
      if (shape_of == nullptr) {
        shape_of = &part;
      } else {
        OP_REQUIRES(ctx, part.shape() == shape_of->shape(),
                    errors::InvalidArgument(
                        "parts[", j, "] has shape ", part.shape().DebugString(),
                        " but the other parts with a nonzero coefficient have ",
                        shape_of->shape().DebugString()));
      }
    }
    OP_REQUIRES(ctx, shape_of != nullptr,
                errors::InvalidArgument("every coefficient is 0: nothing to "
                                        "combine"));
    // The output starts as a part whose coefficient is 1: that part's own buffer when nothing else holds
    // it (a slice received from a survivor: no new buffer, no pages to fault in and clear, one pass fewer),
    // else a copy of it; zeros only when no coefficient is 1.
    int first = -1;
    for (int j = 0; j < n_ && first < 0; ++j) {
      if (coefs(j) == 1) first = j;
    }
    Tensor* out = nullptr;
    if (first >= 0) {
      EC_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({1 + first}, 0, shape_of->shape(), &out));
    } else {
      EC_REQUIRES_OK(ctx, ctx->allocate_output(0, shape_of->shape(), &out));
    }
    int32_t* dst = out->flat<int32>().data();
    const int64_t n = out->NumElements();
    if (first < 0) {
      std::memset(dst, 0, n * sizeof(int32_t));
    } else {
      const int32_t* src = ctx->input(1 + first).flat<int32>().data();
      if (src != dst) std::memcpy(dst, src, n * sizeof(int32_t));
    }
    for (int j = 0; j < n_; ++j) {
      if (coefs(j) == 0 || j == first) continue;
      const int32_t* src = ctx->input(1 + j).flat<int32>().data();
      if (coefs(j) == 1) {
        for (int64_t i = 0; i < n; ++i) dst[i] ^= src[i];
      } else {
        galois::WordScaler(bits_, static_cast<uint32_t>(coefs(j)))
            .XorScaled(src, dst, n);
      }
    }
  }

 private:
  int n_ = 1;  // parts
  int bits_ = 16;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>CombineRows").Device(DEVICE_CPU),
                        CombineRowsOp);

class WriteRowWordsOp : public VarsOpKernel {
 public:
  using VarsOpKernel::VarsOpKernel;

  void Compute(OpKernelContext* ctx) override {
    const int64_t start = ctx->input(n_).scalar<int64_t>()();
    const Tensor& words = ctx->input(n_ + 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(words.shape()),
                errors::InvalidArgument("`words` must be a matrix, got shape ",
                                        words.shape().DebugString()));
    const int64_t count = words.dim_size(0);
    if (count == 0) return;
    LockedWordTables locked;
    EC_REQUIRES_OK(ctx, locked.Lock(ctx, 0, n_));
    EC_REQUIRES_OK(ctx, locked.CheckWidth("words", words.dim_size(1)));
    EC_REQUIRES_OK(ctx, CheckRange(start, count, locked.rows()));
    const int32_t* from = words.matrix<int32>().data();
    for (int64_t i = 0; i < count; ++i) {
      PutRowWords(locked.tables, start + i, from + i * locked.width,
                  /*add=*/false);
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("EcRec>WriteRowWords").Device(DEVICE_CPU),
                        WriteRowWordsOp);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
