// Reading, checking and answering op inputs and outputs the way every
// tf_ecrec kernel does: InvalidArgument naming the input, the rule and what
// it got.

#ifndef TF_ECREC_OPS_CC_KERNELS_OP_INPUTS_H_
#define TF_ECREC_OPS_CC_KERNELS_OP_INPUTS_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

// EC_REQUIRES_OK(ctx, status): OP_REQUIRES_OK, except that an Aborted status
// (a protocol refusal: a fenced or older-generation step, a round 1 behind an
// earlier step, a fold round refused) fails the op without TensorFlow's
// "OP_REQUIRES failed" warning.  Refusals are the protocol's normal answers,
// which trainers and the settlement retry or resolve; logged as warnings they
// filled the PS logs and, forwarded by TensorFlow's executor as "Recent
// warning and error logs", grew every later error message to kilobytes, which
// the Python client parses at about 10 ms each (measured in the settlement
// harness: 5 s of 38).  Every other status warns as before.
#define EC_REQUIRES_OK(CTX, ...)                                   \
  do {                                                             \
    ::tensorflow::Status _ec_s(__VA_ARGS__);                       \
    if (!TF_PREDICT_TRUE(_ec_s.ok())) {                            \
      if (::tensorflow::errors::IsAborted(_ec_s)) {                \
        (CTX)->CtxFailure(__FILE__, __LINE__, _ec_s);              \
      } else {                                                     \
        (CTX)->CtxFailureWithWarning(__FILE__, __LINE__, _ec_s);   \
      }                                                            \
      return;                                                      \
    }                                                              \
  } while (0)

namespace tensorflow {
namespace ec_rec {

// Reads the scalar of type T at `input` (named `name` in errors).
template <typename T>
Status ScalarInput(OpKernelContext* ctx, int input, const char* name,
                   T* value) {
  const Tensor& t = ctx->input(input);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument("`", name, "` must be a scalar, got shape ",
                                   t.shape().DebugString());
  }
  *value = t.scalar<T>()();
  return OkStatus();
}

// Reads a vector of int32 or int64 row ids (named `name` in errors).
inline Status RowIds(const Tensor& t, const char* name,
                     std::vector<int64_t>* rows) {
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

// Checks every row id against [0, num_rows).
inline Status RowsInRange(const std::vector<int64_t>& rows, int64_t num_rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows) {
      return errors::InvalidArgument("rows[", i, "] = ", rows[i],
                                     " is out of range [0, ", num_rows, ")");
    }
  }
  return OkStatus();
}

// Checks the (rows, delta) inputs of an op that XORs delta[i] into row
// rows[i]: a vector and a matrix with a row per id.
inline Status RowsAndDelta(const Tensor& rows, const Tensor& delta) {
  if (!TensorShapeUtils::IsVector(rows.shape())) {
    return errors::InvalidArgument("`rows` must be a vector, got shape ",
                                   rows.shape().DebugString());
  }
  if (!TensorShapeUtils::IsMatrix(delta.shape())) {
    return errors::InvalidArgument("`delta` must be a matrix [n, width], "
                                   "got shape ",
                                   delta.shape().DebugString());
  }
  if (delta.dim_size(0) != rows.dim_size(0)) {
    return errors::InvalidArgument(
        "`delta` has ", delta.dim_size(0), " rows but `rows` has ",
        rows.dim_size(0), " entries; they must be equal");
  }
  return OkStatus();
}

// Sets output `index` to the scalar `value`.
template <typename T>
Status ScalarOutput(OpKernelContext* ctx, int index, T value) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape({}), &out));
  out->scalar<T>()() = value;
  return OkStatus();
}

// Sets output `index` to the int64 vector `values`.
inline Status VectorOutput(OpKernelContext* ctx, int index,
                           const std::vector<int64_t>& values) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      index, TensorShape({static_cast<int64_t>(values.size())}), &out));
  if (!values.empty()) {
    std::memcpy(out->vec<int64_t>().data(), values.data(),
                values.size() * sizeof(int64_t));
  }
  return OkStatus();
}

// An output to allocate as a vector: its index, length and where to put it.
struct VectorSlot {
  int index;
  int64_t length;
  Tensor** out;
};

// Allocates each output of `slots`, in order.
inline Status AllocateVectors(OpKernelContext* ctx,
                              std::initializer_list<VectorSlot> slots) {
  for (const VectorSlot& slot : slots) {
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(slot.index, TensorShape({slot.length}), slot.out));
  }
  return OkStatus();
}

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_OP_INPUTS_H_
