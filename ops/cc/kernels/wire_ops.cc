// Kernels of EcRec>Pack and EcRec>Unpack (see ops/cc/ops/wire_ops.cc).

#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

int64_t WordsPer(DataType dtype) { return dtype == DT_INT64 ? 2 : 1; }

class PackOp : public OpKernel {
 public:
  explicit PackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList tensors;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &tensors));
    int64_t header = 1;
    int64_t words = 0;
    for (const Tensor& t : tensors) {
      header += 1 + t.dims();
      words += t.NumElements() * WordsPer(t.dtype());
    }
    Tensor* blob = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({header + words}), &blob));
    int32* out = blob->flat<int32>().data();
    *out++ = static_cast<int32>(tensors.size());
    for (const Tensor& t : tensors) {
      *out++ = t.dims();
      for (int d = 0; d < t.dims(); ++d) {
        OP_REQUIRES(ctx, t.dim_size(d) <= INT32_MAX,
                    errors::InvalidArgument("EcRec>Pack: dimension ", t.dim_size(d), " over 2^31"));
        *out++ = static_cast<int32>(t.dim_size(d));
      }
    }
    for (const Tensor& t : tensors) {
      const int64_t n = t.NumElements();
      if (t.dtype() == DT_BOOL) {
        const bool* in = t.flat<bool>().data();
        for (int64_t i = 0; i < n; ++i) *out++ = in[i] ? 1 : 0;
      } else {
        const int64_t bytes = n * WordsPer(t.dtype()) * 4;
        if (bytes > 0) std::memcpy(out, t.tensor_data().data(), bytes);
        out += n * WordsPer(t.dtype());
      }
    }
  }
};

class UnpackOp : public OpKernel {
 public:
  explicit UnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtypes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& blob = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(blob.shape()),
                errors::InvalidArgument("EcRec>Unpack: `blob` must be a vector, got shape ",
                                        blob.shape().DebugString()));
    const int32* in = blob.flat<int32>().data();
    const int32* end = in + blob.NumElements();
    OP_REQUIRES(ctx, in < end && *in == static_cast<int32>(dtypes_.size()),
                errors::InvalidArgument("EcRec>Unpack: the blob holds ", in < end ? *in : -1,
                                        " tensors, the op unpacks ", dtypes_.size()));
    ++in;
    std::vector<TensorShape> shapes(dtypes_.size());
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      OP_REQUIRES(ctx, in < end, errors::InvalidArgument("EcRec>Unpack: the blob's header is cut"));
      const int rank = *in++;
      OP_REQUIRES(ctx, rank >= 0 && end - in >= rank,
                  errors::InvalidArgument("EcRec>Unpack: tensor ", i, " has rank ", rank, " in a cut header"));
      for (int d = 0; d < rank; ++d) {
        OP_REQUIRES(ctx, *in >= 0, errors::InvalidArgument("EcRec>Unpack: a negative dimension"));
        shapes[i].AddDim(*in++);
      }
    }
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      const int64_t n = shapes[i].num_elements();
      const int64_t words = n * WordsPer(dtypes_[i]);
      OP_REQUIRES(ctx, end - in >= words,
                  errors::InvalidArgument("EcRec>Unpack: tensor ", i, " needs ", words, " words, ",
                                          end - in, " are left"));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shapes[i], &out));
      if (dtypes_[i] == DT_BOOL) {
        bool* o = out->flat<bool>().data();
        for (int64_t j = 0; j < n; ++j) o[j] = in[j] != 0;
      } else if (words > 0) {
        std::memcpy(const_cast<char*>(out->tensor_data().data()), in, words * 4);
      }
      in += words;
    }
    OP_REQUIRES(ctx, in == end,
                errors::InvalidArgument("EcRec>Unpack: ", end - in, " words left after the last tensor"));
  }

 private:
  DataTypeVector dtypes_;
};

REGISTER_KERNEL_BUILDER(Name("EcRec>Pack").Device(DEVICE_CPU), PackOp);
REGISTER_KERNEL_BUILDER(Name("EcRec>Unpack").Device(DEVICE_CPU), UnpackOp);

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
