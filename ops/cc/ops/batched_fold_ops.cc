// Op registrations of batched folds (the kernels: ops/cc/kernels/
// batched_fold_ops.cc; the protocol: docs/settlement.md, "Folds batched over
// steps"; the graph: tf_ecrec/step/batched_commit.py).

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ec_rec {
namespace {

using shape_inference::InferenceContext;

Status Vectors(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) {
    c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  }
  return OkStatus();
}

REGISTER_OP("EcRec>DeltaLogTake")
    .Input("log: resource")
    .Output("rows: int64")
    .Output("delta: int32")
    .Output("entry: int32")
    .Output("sids: int64")
    .Output("seqs: int64")
    .Attr("target: int >= 0")
    .Attr("width: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      TF_RETURN_IF_ERROR(Vectors(c));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, width));
      return OkStatus();
    })
    .Doc(R"doc(
The apply entries of `target` not marked folded, in seq order: each entry's
distinct rows (`rows`) and words (`delta`, [rows, width]), the index of its
entry (`entry`) per row, and per entry its step id and seq.
)doc");

REGISTER_OP("EcRec>ParityFoldBatch")
    .Input("parity: resource")
    .Input("rows: int64")
    .Input("delta: int32")
    .Input("entry: int32")
    .Input("sids: int64")
    .Input("seqs: int64")
    .Input("coef: int32")
    .Input("log: resource")
    .Input("round_id: int64")
    .Output("present: bool")
    .Attr("target: int >= 0")
    .Attr("source: int >= 0")
    .Attr("field_bits: int = 16")
    .SetIsStateful()
    .SetShapeFn(Vectors)
    .Doc(R"doc(
Folds a batch of taken apply entries of data target `source` into `parity`
(a parity or a replica, logged as `target`): for each entry i, its rows
(`entry` == i) get coef * delta XORed in and one fold entry (sid i, source seq
seqs[i]) is appended, as ParityUpdateLogged does, all under the variable's
lock.  An entry whose fold the log holds already is skipped, and so is one the
log refuses (fenced, committed, of an older generation).  present[i]: the
fold of entry i is in `parity` now.  Fails with Aborted, folding nothing, if
`round_id` (the round's id, its generation in bits 48..61) is of an older
generation than the log admits: a trainer that has not followed the cluster.
)doc");

REGISTER_OP("EcRec>DeltaLogMarkFolded")
    .Input("log: resource")
    .Input("seqs: int64")
    .Input("present: N * bool")
    .Attr("N: int >= 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Marks folded the apply entries `seqs` whose fold every fold target holds
(`present`, one vector per target, a flag per seq).
)doc");

REGISTER_OP("EcRec>DeltaLogReady")
    .Input("log: resource")
    .Input("counted: N * int64")
    .Output("ready: int64")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(Vectors)
    .Doc(R"doc(
Of the steps counted on every counter copy (the sids in each `counted`), the
ones whose apply entries here are all folded, as is every earlier apply entry
of the same targets; a step without an entry here is ready, a fenced one not.
)doc");

REGISTER_OP("EcRec>DeltaLogCommitEach")
    .Input("log: resource")
    .Input("round_id: int64")
    .Input("ready: N * int64")
    .Output("committed: int64")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(Vectors)
    .Doc(R"doc(
Round 2 of each step ready on every data PS (the sids in each `ready`) that
this log does not refuse (fenced, or of an older generation: left to
settlement): drops its entries and remembers it committed.  Outputs the sids
committed here, now or before.  Aborted, committing nothing, for a round
(`round_id`) of an older generation than the log admits.
)doc");

REGISTER_OP("EcRec>DeltaLogCounted")
    .Input("log: resource")
    .Output("sids: int64")
    .Attr("target: int >= 0")
    .SetIsStateful()
    .SetShapeFn(Vectors)
    .Doc(R"doc(
The steps with a counter entry of `target` in the log (counted, not committed).
)doc");

REGISTER_OP("EcRec>DeltaLogIsCommitted")
    .Input("log: resource")
    .Input("sids: int64")
    .Output("committed: bool")
    .SetIsStateful()
    .SetShapeFn(Vectors)
    .Doc(R"doc(
For each of `sids`, whether this log committed it (its last 65536 commits).
)doc");

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
