// Ops of the rebuild that runs while training goes on (recovery_view.h,
// tf_ecrec/rebuild/): pending rows on the rebuilt PS, preserved rows on the
// survivors. `log` is the process's EcRecDeltaLog (EcRec>DeltaLogHandle),
// which holds the view; `var` names a variable group by its first variable.

#include "ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ec_rec {

using shape_inference::InferenceContext;

REGISTER_OP("EcRec>RebuildBeginPending")
    .Input("log: resource")
    .Input("var: resource")
    .Input("rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RanksAre(c, {{2, 0}}); })
    .Doc(R"doc(
Marks rows [0, rows) of `var`'s group pending on this PS: lookups of them wait
(EcRec>AwaitRebuiltRows) and updates are refused until EcRec>InstallRowWords
writes them.
)doc");

REGISTER_OP("EcRec>RebuildForgetPending")
    .Input("log: resource")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Forgets every pending row of this PS, under any variable's key: a new T0 of a
lost PS supersedes what an unfinished rebuild left (its variables re-created
under new keys). Lookups still waiting fail with Aborted.
)doc");

REGISTER_OP("EcRec>RecoveryViewStats")
    .Input("log: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return OkStatus();
    })
    .Doc(R"doc(
[rows pending on this PS, rows preserved (saved T0 words) on this PS, variable
groups with preserved ranges on this PS].
)doc");

REGISTER_OP("EcRec>AwaitRebuiltRows")
    .Input("log: resource")
    .Input("var: resource")
    .Input("rows: Tindices")
    .Attr("Tindices: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RanksAre(c, {{2, 1}}); })
    .Doc(R"doc(
Finishes once no row of `rows` of `var`'s group is pending (at once when none
is), asking the rebuild for the pending ones. Asynchronous: a waiting lookup
holds no thread. Cancelled with its step.
)doc");

REGISTER_OP("EcRec>WantedRows")
    .Input("log: resource")
    .Input("var: resource")
    .Input("lo: int64")
    .Input("hi: int64")
    .Output("rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RanksAre(c, {{2, 0}, {3, 0}}));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    })
    .Doc(R"doc(
The pending rows of `var`'s group in [lo, hi) that waiting lookups ask for,
ascending and distinct.
)doc");

REGISTER_OP("EcRec>WaitWanted")
    .Input("log: resource")
    .Input("timeout_ms: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RanksAre(c, {{1, 0}}); })
    .Doc(R"doc(
Finishes once a lookup waits for a pending row on this PS, or after
`timeout_ms`. Asynchronous.
)doc");

REGISTER_OP("EcRec>InstallRowWords")
    .Input("vars: N * resource")
    .Input("log: resource")
    .Input("rows: int64")
    .Input("words: int32")
    .Output("installed: int64")
    .Attr("N: int >= 1")
    .Attr("add: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 3;
      TF_RETURN_IF_ERROR(RanksAre(c, {{n + 1, 1}, {n + 2, 2}}));
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Writes row i of `words` into row rows[i] of the variables (split as in
EcRec>ReadRowWords) for each row still pending, then marks it installed and
wakes the lookups waiting for it; rows already installed are left alone, so
an install runs at most once per row whoever races it. With `add`, the words
are XORed into the row instead (a parity row: the code of the T0 data added
to the folds it took since). A row with a saved T0 copy (EcRec>PreserveRanges
covers the rows of a PS being rebuilt too) gets the words into the copy as
well, which then holds the row's T0 words. Under the variables' exclusive locks.
installed: how many rows were written.
)doc");

REGISTER_OP("EcRec>PreserveRanges")
    .Input("log: resource")
    .Input("var: resource")
    .Input("ranges: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RanksAre(c, {{2, 2}}); })
    .Doc(R"doc(
From now on the first logged write of a row of `var`'s group in one of the
[lo, hi) `ranges` ([m, 2]) saves the row's words first, for
EcRec>ReadPreservedRowWords. Replaces the group's ranges and forgets its saved
rows.
)doc");

REGISTER_OP("EcRec>PreserveEnd")
    .Input("log: resource")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Forgets every preserved range and saved row of this PS.
)doc");

REGISTER_OP("EcRec>ReadPreservedRowWords")
    .Input("vars: N * resource")
    .Input("log: resource")
    .Input("rows: int64")
    .Output("words: int32")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 2;
      TF_RETURN_IF_ERROR(RanksAre(c, {{n + 1, 1}}));
      return UnknownMatrixOutput(c);
    })
    .Doc(R"doc(
Rows `rows` of the variables as 32-bit words side by side (as
EcRec>ReadRowWords), each as it was when its range was preserved: the saved
words of a row written since, the current words of the others. Empty `rows`
gives [0, 0] without looking the variables up.
)doc");

}  // namespace ec_rec
}  // namespace tensorflow
