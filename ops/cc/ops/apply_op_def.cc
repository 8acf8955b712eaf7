// Registration of the EcRec>SparseApply*WithDelta ops and their ...Logged
// variants from an ApplyOp (apply_op_def.h).

#include "ops/cc/ops/apply_op_def.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ec_rec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Shape function of an apply op with `num_tables` variables (var + slots) at
// inputs [0, num_tables), float scalars at `scalars`, grad and indices:
// delta is [n, num_tables * prod(var.shape[1:])].
Status SparseApplyWithDeltaShape(InferenceContext* c, int num_tables,
                                 const std::vector<int>& scalars,
                                 int grad_input, int indices_input) {
  ShapeHandle unused;
  for (int input : scalars) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(input), 0, &unused));
  }
  ShapeHandle grad;
  ShapeHandle indices;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(grad_input), 1, &grad));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(indices_input), 1, &indices));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(grad, 0), c->Dim(indices, 0), &n));
  ShapeHandle row;
  TF_RETURN_IF_ERROR(c->Subshape(grad, 1, &row));
  for (int t = 0; t < num_tables; ++t) {
    const auto* handle_data = c->input_handle_shapes_and_types(t);
    if (handle_data == nullptr || handle_data->empty()) continue;
    ShapeHandle value;
    ShapeHandle value_row;
    TF_RETURN_IF_ERROR(c->WithRankAtLeast((*handle_data)[0].shape, 1, &value));
    TF_RETURN_IF_ERROR(c->Subshape(value, 1, &value_row));
    TF_RETURN_IF_ERROR(c->Merge(row, value_row, &row));
  }
  DimensionHandle width = c->UnknownDim();
  if (c->RankKnown(row)) {
    width = c->MakeDim(num_tables);
    for (int d = 0; d < c->Rank(row); ++d) {
      TF_RETURN_IF_ERROR(c->Multiply(width, c->Dim(row, d), &width));
    }
  }
  c->set_output(0, c->Matrix(n, width));
  return OkStatus();
}

// The documentation of the logged variant of `op`.
std::string LoggedApplyDoc(const ApplyOp& op) {
  std::vector<std::string> tables;
  for (int t = 0; t < op.num_tables; ++t) {
    const std::string input = op.inputs[t];
    tables.push_back(input.substr(0, input.find(':')));
  }
  const bool one = op.num_tables == 1;
  return strings::StrCat(
      "\n", op.name, " that also logs its delta.\n\n",
      "Appends (sid, target, source=-1, distinct rows ascending, their [n, ",
      one ? "dim" : strings::StrCat(op.num_tables, " * dim"), "]\n",
      one ? "" : strings::StrCat("[", absl::StrJoin(tables, " | "), "] "),
      "old ^ new bits) to `log` under ",
      one ? "var's lock" : "the variables' locks", ".\n");
}

InitOnStartupMarker RegisterApplyOp(const ApplyOp& op, bool logged,
                                    const std::string& doc) {
  register_op::OpDefBuilderWrapper b(logged ? op.logged_name : op.name);
  for (const char* input : op.inputs) b.Input(input);
  if (logged) b.Input("log: resource").Input("sid: int64").Input("target: int32");
  b.Output("delta: int32").Attr("Tindices: {int32, int64} = DT_INT64");
  if (logged) b.Attr("bypass_fence: bool = false").SetIsStateful();
  for (const char* attr : op.attrs) b.Attr(attr);
  const int log_input = logged ? static_cast<int>(op.inputs.size()) : -1;
  b.SetShapeFn([op, log_input](InferenceContext* c) {
    if (log_input >= 0) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, log_input + 1, log_input + 3));
    }
    return SparseApplyWithDeltaShape(c, op.num_tables, op.scalars,
                                     op.grad_input, op.indices_input);
  });
  b.Doc(doc);
  return b();
}

}  // namespace

InitOnStartupMarker RegisterApplyOps(const ApplyOp& op, const char* doc) {
  RegisterApplyOp(op, /*logged=*/false, doc);
  return RegisterApplyOp(op, /*logged=*/true, LoggedApplyDoc(op));
}

}  // namespace ec_rec
}  // namespace tensorflow
