// Op definitions of tf_ecrec: sparse optimizer steps that report the bitwise
// change they made (those of the rules with a momentum slot are in
// momentum_ops.cc), and the parity update that consumes it.
//
// Contract shared by the EcRec>SparseApply*WithDelta ops
// ------------------------------------------------------
// `var` and its slots are float32 resource variables of one shape
// [rows, d1, d2, ...] (rank >= 1; an embedding table is [rows, dim]); `grad`
// is float32 [n, d1, d2, ...] and `indices` a vector of n row ids (int32 or
// int64). Below, dim = d1 * d2 * ... (1 for a vector) is the row width. The op takes the exclusive locks of var and every slot (in address
// order, as TensorFlow's training ops do, and whatever `use_locking` a stock
// optimizer would pass), applies the update to each indexed row, and returns
//
//   delta: int32 [n, (1 + num_slots) * dim]
//
// whose row i is, for the FIRST occurrence of indices[i], the concatenation
// over [var, slot1, slot2, ...] of bitcast<int32>(row before this op) XOR
// bitcast<int32>(row after this op), and all zeros for any later occurrence of
// the same id. Hence XOR-folding every delta row into a copy of the old rows
// (or, multiplied by a code coefficient, into parity) reproduces the new rows
// exactly, duplicates included. Occurrences of a duplicated id are applied
// one after the other in input order, as the stock sparse kernels do; both
// the update and the delta happen under the locks, so concurrent steps on the
// same variable serialize and each delta is exactly old ^ new of its own step.
// Ids, shapes, dtypes and hyperparameters are all checked before the first
// write, so an op that fails (InvalidArgument, FailedPrecondition) has changed
// nothing.
//
// Values written are bit-identical to the stock TensorFlow 2.15 kernels named
// in each op (see ops/cc/kernels/optimizer_rules.h and momentum_rules.h for
// how).
//
// Logged variants
// ---------------
// Each op X here has a variant XLogged with the same inputs plus, at the end,
// `log: resource` (an EcRec>DeltaLogHandle on the same device), `sid: int64`
// and `target: int32` scalars (ParityUpdateLogged also `source: int32`). It
// does exactly what X does and, in the same kernel while it still holds the
// variables' locks, appends one entry (sid, target, source, rows, delta) to
// the log. As EcRec>DeltaLogRead shows it, rows are the DISTINCT rows
// written, ascending, and delta[g] the words XORed into row rows[g] (for the
// apply ops the [var | slots] old ^ new bits; for ParityUpdateLogged the XOR
// of every coef * delta folded into that parity row). To keep appends cheap
// the op stores only its row ids and a reference to the delta tensor (the
// apply op's output; the fold's input, copied if it borrows a fed NumPy
// buffer) and its coef: products and merging happen when the log is read. An op that fails appends nothing; an op whose sid is
// fenced or committed in the log fails with Aborted and changes nothing,
// unless its `bypass_fence` attr is set (recovery finishing a step). See
// ops/cc/ops/delta_log_ops.cc for the log itself.

#include <vector>

#include "ops/cc/ops/apply_op_def.h"
#include "ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Checks the rank of a parity handle's value when the handle carries it, and
// merges its second dimension into `*width`.
Status MergeHandleWidth(InferenceContext* c, int input, DimensionHandle* width) {
  const auto* handle_data = c->input_handle_shapes_and_types(input);
  if (handle_data == nullptr || handle_data->empty()) return OkStatus();
  ShapeHandle value;
  TF_RETURN_IF_ERROR(c->WithRank((*handle_data)[0].shape, 2, &value));
  return c->Merge(c->Dim(value, 1), *width, width);
}

Status ParityUpdateShape(InferenceContext* c) {
  int field_bits;
  TF_RETURN_IF_ERROR(c->GetAttr("field_bits", &field_bits));
  if (field_bits != 8 && field_bits != 16) {
    return errors::InvalidArgument("`field_bits` must be 8 or 16, got ",
                                   field_bits);
  }
  ShapeHandle rows;
  ShapeHandle delta;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &delta));
  TF_RETURN_IF_ERROR(ScalarInputs(c, 3, 4));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(delta, 0), &n));
  DimensionHandle width = c->Dim(delta, 1);
  return MergeHandleWidth(c, 0, &width);
}

// The inputs of the FTRL ops; with `shrinkage` (FtrlV2), l2_shrinkage too.
std::vector<const char*> FtrlInputs(bool shrinkage) {
  std::vector<const char*> inputs = {
      "var: resource", "accum: resource", "linear: resource", "grad: float",
      "indices: Tindices", "lr: float", "l1: float", "l2: float"};
  if (shrinkage) inputs.push_back("l2_shrinkage: float");
  inputs.push_back("lr_power: float");
  return inputs;
}

// EcRec>ParityUpdate, or with `logged` its variant that also takes (log, sid,
// target, source, source_seq) and the `bypass_fence` and `dedupe` attrs.
InitOnStartupMarker RegisterParityUpdateOp(bool logged, const char* doc) {
  register_op::OpDefBuilderWrapper b(logged ? "EcRec>ParityUpdateLogged"
                                            : "EcRec>ParityUpdate");
  b.Input("parity: resource")
      .Input("rows: Tindices")
      .Input("delta: int32")
      .Input("coef: int32")
      .Attr("Tindices: {int32, int64} = DT_INT64")
      .Attr("field_bits: int = 16");
  if (!logged) return b.SetShapeFn(ParityUpdateShape).Doc(doc)();
  return b.Input("log: resource")
      .Input("sid: int64")
      .Input("target: int32")
      .Input("source: int32")
      .Input("source_seq: int64")
      .Attr("bypass_fence: bool = false")
      .Attr("dedupe: bool = false")
      .SetIsStateful()
      .SetShapeFn([](InferenceContext* c) {
        TF_RETURN_IF_ERROR(ScalarInputs(c, 5, 9));
        return ParityUpdateShape(c);
      })
      .Doc(doc)();
}

}  // namespace

InitOnStartupMarker const kSgdOps = RegisterApplyOps(
    {"EcRec>SparseApplySgdWithDelta", "EcRec>SparseApplySgdWithDeltaLogged",
     {"var: resource", "lr: float", "grad: float", "indices: Tindices"},
     {}, 1, {1}, 2, 3},
    R"doc(
Sparse SGD step that returns the bitwise delta of the touched rows.

var[indices[i]] += (-grad[i]) * lr for each i in order, bit-identical to the
sparse path of tf.compat.v1.train.GradientDescentOptimizer on a resource
variable (ResourceScatterAdd of -grad * lr).

var: float32 resource variable [rows, ...].
lr: learning rate, float32 scalar.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
delta: int32 [n, dim]; old ^ new bits at the first occurrence of each id,
  zeros at later occurrences.
)doc");

InitOnStartupMarker const kAdagradOps = RegisterApplyOps(
    {"EcRec>SparseApplyAdagradWithDelta",
     "EcRec>SparseApplyAdagradWithDeltaLogged",
     {"var: resource", "accum: resource", "lr: float", "grad: float",
      "indices: Tindices"},
     {}, 2, {2}, 3, 4},
    R"doc(
Sparse Adagrad step that returns the bitwise delta of the touched rows.

accum += grad^2; var -= lr * grad * rsqrt(accum) per occurrence, bit-identical
to ResourceSparseApplyAdagrad with update_slots=True (the path of
tf.compat.v1.train.AdagradOptimizer).

var: float32 resource variable [rows, ...].
accum: float32 resource variable shaped like var, the accumulator slot.
lr: learning rate, float32 scalar.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
delta: int32 [n, 2 * dim]; [var, accum] old ^ new bits at the first
  occurrence of each id, zeros at later occurrences.
)doc");

InitOnStartupMarker const kLazyAdamOps = RegisterApplyOps(
    {"EcRec>SparseApplyLazyAdamWithDelta",
     "EcRec>SparseApplyLazyAdamWithDeltaLogged",
     {"var: resource", "m: resource", "v: resource", "lr: float",
      "beta1: float", "beta2: float", "epsilon: float", "grad: float",
      "indices: Tindices"},
     {}, 3, {3, 4, 5, 6}, 7, 8},
    R"doc(
Sparse "lazy" Adam step that returns the bitwise delta of the touched rows.

TensorFlow has no sparse Adam kernel: v1 AdamOptimizer decays every row of m
and v on every step. This op implements lazy Adam (LazyAdamOptimizer of
tf.contrib.opt and tensorflow_addons), which updates the moments of the
touched rows only:

  m = beta1 * m + (1 - beta1) * grad
  v = beta2 * v + (1 - beta2) * grad^2
  var -= lr * m / (sqrt(v) + epsilon)

per occurrence, bit-identical to the same formula written with stock ops
(gather, Mul, Add, Square, Sqrt, RealDiv, scatter). `lr` is the bias-corrected
rate lr0 * sqrt(1 - beta2^t) / (1 - beta1^t), computed by the caller.

var, m, v: float32 resource variables of one shape [rows, ...].
lr, beta1, beta2, epsilon: float32 scalars.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
delta: int32 [n, 3 * dim]; [var, m, v] old ^ new bits at the first occurrence
  of each id, zeros at later occurrences.
)doc");

InitOnStartupMarker const kFtrlOps = RegisterApplyOps(
    {"EcRec>SparseApplyFtrlWithDelta", "EcRec>SparseApplyFtrlWithDeltaLogged",
     FtrlInputs(/*shrinkage=*/false),
     {"multiply_linear_by_lr: bool = false"}, 3, {5, 6, 7, 8}, 3, 4},
    R"doc(
Sparse FTRL-Proximal step that returns the bitwise delta of the touched rows.

Bit-identical to ResourceSparseApplyFtrl (the path of
tf.compat.v1.train.FtrlOptimizer when l2_shrinkage_regularization_strength is
0), including its scalar arithmetic for rows of width 1.

var, accum, linear: float32 resource variables of one shape [rows, ...].
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
lr: positive float32 scalar.
l1, l2: non-negative float32 scalars.
lr_power: non-positive float32 scalar.
delta: int32 [n, 3 * dim]; [var, accum, linear] old ^ new bits at the first
  occurrence of each id, zeros at later occurrences.
)doc");

InitOnStartupMarker const kFtrlV2Ops = RegisterApplyOps(
    {"EcRec>SparseApplyFtrlV2WithDelta",
     "EcRec>SparseApplyFtrlV2WithDeltaLogged",
     FtrlInputs(/*shrinkage=*/true),
     {"multiply_linear_by_lr: bool = false"}, 3, {5, 6, 7, 8, 9}, 3, 4},
    R"doc(
Sparse FTRL-Proximal step with l2 shrinkage that returns the bitwise delta.

Bit-identical to ResourceSparseApplyFtrlV2 (the path of
tf.compat.v1.train.FtrlOptimizer when l2_shrinkage_regularization_strength is
positive). Same inputs as EcRec>SparseApplyFtrlWithDelta plus
`l2_shrinkage`, a non-negative float32 scalar.
)doc");

InitOnStartupMarker const kParityUpdateOp = RegisterParityUpdateOp(
    /*logged=*/false, R"doc(
Folds deltas into parity rows: parity[rows[i]] ^= coef * delta[i].

The product is taken symbol by symbol in a binary field, over the
little-endian bytes of the int32 words:

  field_bits=16: GF(2^16) with polynomial 0x1100B on 16-bit symbols (two per
    word), the field of pyeclib's liberasurecode_rs_vand and tf_ecrec.erasure.codec;
  field_bits=8: GF(2^8) with polynomial 0x11D on bytes, the field of
    pyeclib's isa_l_rs_vand.

coef == 1 is a plain XOR in either field. The parity variable is locked
exclusively for the whole update; repeated rows fold in one after another
(XOR commutes, so their order does not matter).

parity: int32 resource variable [parity_rows, width].
rows: [n] parity row ids in [0, parity_rows).
delta: int32 [n, width], e.g. the output of an EcRec>SparseApply*WithDelta op.
coef: int32 scalar, a non-zero field element: [1, 2^field_bits - 1].
)doc");

InitOnStartupMarker const kParityUpdateLoggedOp = RegisterParityUpdateOp(
    /*logged=*/true, R"doc(
EcRec>ParityUpdate that also logs what it folded.

Appends (sid, target, source, distinct parity rows ascending, for each the
XOR of every coef * delta[i] folded into it: [rows, width]) to `log` under
the parity variable's lock. `target` is the parity variable's id, `source`
that of the data variable (group) the delta came from, or -1, and
`source_seq` the seq of the source's apply entry in its own log (from
EcRec>DeltaLogSeqOf), or -1.

With `dedupe` (recovery finishing a step), folds only the rows the log does
not already hold for (sid, target, source), and nothing if `sid` was
committed here: running the same finishing fold twice folds once.
)doc");

REGISTER_OP("EcRec>RouteDeltas")
    .Input("indices: Tindices")
    .Input("delta: int32")
    .Input("bases: int64")
    .Attr("chunk_rows: int >= 1")
    .Attr("num_routes: int >= 1")
    .Attr("Tindices: {int32, int64} = DT_INT64")
    .Output("rows: num_routes * int64")
    .Output("deltas: num_routes * int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices;
      ShapeHandle delta;
      ShapeHandle bases;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &delta));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &bases));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(indices, 0), c->Dim(delta, 0), &n));
      int num_routes;
      TF_RETURN_IF_ERROR(c->GetAttr("num_routes", &num_routes));
      DimensionHandle routes;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(bases, 0), num_routes, &routes));
      for (int j = 0; j < num_routes; ++j) {
        c->set_output(j, c->Vector(c->UnknownDim()));
        c->set_output(num_routes + j,
                      c->Matrix(c->UnknownDim(), c->Dim(delta, 1)));
      }
      return OkStatus();
    })
    .Doc(R"doc(
Splits one apply's deltas by the parity they fold into: one op on the data's
PS instead of a mask, gather and index arithmetic per route.

`indices` are local rows of a data variable whose local chunk i holds rows
[i * chunk_rows, (i + 1) * chunk_rows); `delta` their words (from an
EcRec>SparseApply*WithDelta op). Row j of `bases` is route j: for each local
chunk, the first row of its stripe's parity chunk on the route's PS, or -1
when the chunk does not fold there. Output j holds, in input order, the
parity rows bases[j, c] + indices[i] % chunk_rows and delta rows of every i
whose chunk c = indices[i] / chunk_rows has bases[j, c] >= 0, ready for
EcRec>ParityUpdateLogged on the route's PS with its coefficient. An index
outside the chunks of `bases` is an InvalidArgument.
)doc");

}  // namespace ec_rec
}  // namespace tensorflow
