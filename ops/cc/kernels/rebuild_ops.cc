// Kernels of the rebuild ops: slices of rows read and written as 32-bit
// words, and their GF(2^16) / GF(2^8) linear combination.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cc/kernels/galois.h"
#include "ops/cc/kernels/locked_variables.h"
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

enum Direction { kToWords, kFromWords };

// Copies rows [start, start + count) of the tables to or from `words`, an
// int32 [count, width] matrix holding the tables' rows side by side.
void CopyRows(const std::vector<WordTable>& tables, int64_t start,
              int64_t count, int64_t width, char* words, Direction direction) {
  if (direction == kToWords) {
    GatherRowWords(tables, count, width,
                   [start](int64_t i) { return start + i; }, words);
    return;
  }
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(int32_t));
  int64_t offset = 0;
  for (const WordTable& table : tables) {
    const int64_t bytes = table.words * static_cast<int64_t>(sizeof(int32_t));
    char* rows = table.base + start * bytes;
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(rows + i * bytes, words + i * row_bytes + offset, bytes);
    }
    offset += bytes;
  }
}

class ReadRowWordsOp : public OpKernel {
 public:
  explicit ReadRowWordsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t start = ctx->input(n_).scalar<int64_t>()();
    const int64_t count = ctx->input(n_ + 1).scalar<int64_t>()();
    OP_REQUIRES(ctx, count >= 0,
                errors::InvalidArgument("`count` must be >= 0, got ", count));
    Tensor* out = nullptr;
    if (count == 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0, 0}), &out));
      return;
    }
    LockedVariables vars;
    std::vector<WordTable> tables;
    int64_t width = 0;
    OP_REQUIRES_OK(ctx, LockWordTables(ctx, 0, n_, &vars, &tables, &width));
    OP_REQUIRES_OK(ctx, CheckRange(start, count, tables.front().rows));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({count, width}), &out));
    CopyRows(tables, start, count, width,
             const_cast<char*>(out->tensor_data().data()), kToWords);
  }

 private:
  int n_ = 1;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>ReadRowWords").Device(DEVICE_CPU),
                        ReadRowWordsOp);

class CombineRowsOp : public OpKernel {
 public:
  explicit CombineRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
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
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape_of->shape(), &out));
    int32_t* dst = out->flat<int32>().data();
    const int64_t n = out->NumElements();
    std::memset(dst, 0, n * sizeof(int32_t));
    for (int j = 0; j < n_; ++j) {
      if (coefs(j) == 0) continue;
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
  int n_ = 1;
  int bits_ = 16;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>CombineRows").Device(DEVICE_CPU),
                        CombineRowsOp);

class WriteRowWordsOp : public OpKernel {
 public:
  explicit WriteRowWordsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t start = ctx->input(n_).scalar<int64_t>()();
    const Tensor& words = ctx->input(n_ + 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(words.shape()),
                errors::InvalidArgument("`words` must be a matrix, got shape ",
                                        words.shape().DebugString()));
    const int64_t count = words.dim_size(0);
    if (count == 0) return;
    LockedVariables vars;
    std::vector<WordTable> tables;
    int64_t width = 0;
    OP_REQUIRES_OK(ctx, LockWordTables(ctx, 0, n_, &vars, &tables, &width));
    OP_REQUIRES(ctx, words.dim_size(1) == width,
                errors::InvalidArgument(
                    "`words` rows have ", words.dim_size(1), " words but the "
                    "variables' rows have ", width, " together; they must be "
                    "equal"));
    OP_REQUIRES_OK(ctx, CheckRange(start, count, tables.front().rows));
    CopyRows(tables, start, count, width,
             const_cast<char*>(words.tensor_data().data()), kFromWords);
  }

 private:
  int n_ = 1;
};
REGISTER_KERNEL_BUILDER(Name("EcRec>WriteRowWords").Device(DEVICE_CPU),
                        WriteRowWordsOp);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
