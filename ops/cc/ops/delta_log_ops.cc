// Op definitions of the EcRecDeltaLog: a per-PS-process record of the
// updates the ...Logged ops make, so that a training step cut anywhere can be
// undone or finished exactly by recovery.
//
// The log
// -------
// One log per (device, container, shared_name), a resource in the device's
// ResourceMgr: it survives sessions (on a tf.distribute.Server, as long as
// the process lives) and is created empty by the first op that uses it.
// It holds an ordered list of entries
//
//   (seq int64, sid int64, target int32, source int32,
//    rows int64[n] (distinct, ascending), delta int32[n, width])
//
// one per executed logged op, appended in the same kernel as the update and
// under the updated variables' exclusive locks, so that the entry exists iff
// the update happened. delta[g] is exactly the words XORed into row rows[g]
// of the target (its tables side by side), so XORing it back undoes the
// update. `seq` is unique and increasing within the log; the entries of one
// target are in the order their updates happened.
//
// It also remembers the last 65536 committed sids (in commit order), and,
// per target, the highest seq of an entry that was removed by Commit or Drop
// while its update stayed in effect ("settled"): an entry of that target with
// a lower seq can no longer be undone safely (on a target whose update is
// not a plain XOR, i.e. an optimizer's var and slots).
//
// A logged op first checks, under the log's mutex and after all its other
// checks, that its sid is neither fenced nor committed (else it fails with
// Aborted and writes nothing; `bypass_fence` skips this), and counts itself
// in flight until it has appended. DeltaLogFence(sids) fences and then waits
// until none of the sids is in flight.
//
// Recovery protocol these ops are built for (workers blocked): read every
// surviving PS's log; FENCE every sid with entries and not committed anywhere
// on every surviving log (a dead worker's step may still have ops running on
// the PSs, e.g. a parity fold pulling its delta from the data PS), then read
// again: those sids' entries are now final. Ignore (and commit) sids
// committed anywhere; for each other sid either UNDO its entries
// (DeltaLogUndo, reverse seq order) or FINISH it (run the missing ...Logged
// folds with the same sid and source and bypass_fence=true); then commit the
// sid on every log (which also lifts the fence). Undo removes its entry and
// finishing folds append theirs in the same kernel as the write, so a
// recovery cut anywhere can be run again.

#include "ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

Status ScalarOrVector(InferenceContext* c, int input) {
  ShapeHandle unused;
  return c->WithRankAtMost(c->input(input), 1, &unused);
}

}  // namespace

REGISTER_OP("EcRec>DeltaLogHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
A handle to the EcRecDeltaLog `shared_name` in `container` of this device.

The log itself is created empty by the first op that uses the handle and
lives in the device's ResourceMgr: every handle op with the same container
and shared_name on the same device names the same log, in any session.
)doc");

REGISTER_OP("EcRec>DeltaLogCommit")
    .Input("log: resource")
    .Input("sid: int64")
    .Attr("bypass_fence: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarOrVector(c, 1); })
    .Doc(R"doc(
Marks steps complete (round 2): drops every entry of `sid` and remembers
`sid` as committed (the log keeps the last 65536 committed sids). Fails with
Aborted, changing nothing, if a sid is fenced or of an older generation than
the log admits, unless bypass_fence (recovery's own commits).

sid: int64 scalar, or a vector of sids.
)doc");

REGISTER_OP("EcRec>DeltaLogCommitInOrder")
    .Input("log: resource")
    .Input("sid: int64")
    .Attr("bypass_fence: bool = false")
    .Attr("timeout_ms: int = 60000")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarOrVector(c, 1); })
    .Doc(R"doc(
Round 1 of a step's commit, on a data PS (asynchronous).

Waits until no apply entry of another step precedes an apply entry of `sid`
on the same target, then drops the apply entries of `sid` and remembers
`sid` as data-committed. Fails with Aborted if a sid is (or gets) fenced or
is of an older generation (unless bypass_fence), or after `timeout_ms`
(0: fail at once instead of waiting).

sid: int64 scalar, or a vector of sids committed together.
)doc");

REGISTER_OP("EcRec>DeltaLogSetGeneration")
    .Input("log: resource")
    .Input("generation: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Raises the log's minimum generation: later writes and commits of sids of an
older generation (sid >> 48) fail with Aborted (unless bypass_fence).
)doc");

REGISTER_OP("EcRec>DeltaLogSeqOf")
    .Input("log: resource")
    .Input("sid: int64")
    .Input("target: int32")
    .Output("seq: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
The seq of the log's entry of (sid, target), -1 if there is none.
)doc");

REGISTER_OP("EcRec>DeltaLogPending")
    .Input("log: resource")
    .Output("sids: int64")
    .Output("age_secs: float")
    .Output("waiting: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      return OkStatus();
    })
    .Doc(R"doc(
The steps with entries in the log: each sid, the age in seconds of its
first entry, and whether a CommitInOrder of it is waiting.
)doc");

REGISTER_OP("EcRec>DeltaLogFence")
    .Input("log: resource")
    .Input("sids: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarOrVector(c, 1); })
    .Doc(R"doc(
Fences steps: every later logged op of `sids` on this log fails with Aborted
and writes nothing (unless it has bypass_fence=true). Returns once no logged
op of `sids` is still writing, so the log then holds all their entries for
good. Committing a sid lifts its fence (a committed sid is refused anyway).

sids: int64 scalar or vector.
)doc");

REGISTER_OP("EcRec>DeltaLogDrop")
    .Input("log: resource")
    .Input("sids: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarOrVector(c, 1); })
    .Doc(R"doc(
Drops every entry of `sids` without remembering them as committed.

Their updates stay in effect (they become "settled"). Prefer
EcRec>DeltaLogCommit to close steps: a committed mark tells a later recovery
that the step is done everywhere.

sids: int64 scalar or vector.
)doc");

REGISTER_OP("EcRec>DeltaLogRead")
    .Input("log: resource")
    .Output("seq: int64")
    .Output("sid: int64")
    .Output("target: int32")
    .Output("source: int32")
    .Output("row_splits: int64")
    .Output("rows: int64")
    .Output("widths: int64")
    .Output("deltas: int32")
    .Output("committed: int64")
    .Output("settled_targets: int32")
    .Output("settled_seq: int64")
    .Output("fenced: int64")
    .Output("source_seq: int64")
    .Output("kinds: int32")
    .Output("settled_sources: int32")
    .Output("settled_source_seq: int64")
    .Output("data_committed: int64")
    .Output("generation: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i + 1 < c->num_outputs(); ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      c->set_output(c->num_outputs() - 1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
A consistent snapshot of the log (it does not change the log).

Entry i (of m, in seq order) has rows rows[row_splits[i]:row_splits[i + 1]]
and a [n_i, widths[i]] delta, the next n_i * widths[i] words of `deltas`
(entries follow each other, each row-major).

seq, sid: int64 [m].
target, source: int32 [m].
row_splits: int64 [m + 1].
rows: int64 [sum n_i].
widths: int64 [m], words per row.
deltas: int32 [sum n_i * widths[i]].
committed: int64 [c], the remembered committed sids, oldest first.
settled_targets, settled_seq: [t]; the highest seq of an entry of each
  target that left the log by Commit or Drop.
fenced: int64 [f], the fenced sids not committed since, ascending.
source_seq: int64 [m], a fold's source apply seq (-1 for others).
kinds: int32 [m], 0 apply, 1 fold, 2 counter.
settled_sources, settled_source_seq: [s]; per source, the highest
  source_seq of a fold that left the log by Commit or Drop.
data_committed: int64 [d], sids committed by CommitInOrder, oldest first.
generation: int64 scalar, the minimum generation admitted.
)doc");

REGISTER_OP("EcRec>DeltaLogUndo")
    .Input("log: resource")
    .Input("vars: N * resource")
    .Input("seq: int64")
    .Input("target: int32")
    .Output("found: bool")
    .Attr("N: int >= 1")
    .Attr("ordered: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 3;
      TF_RETURN_IF_ERROR(ScalarInputs(c, 2 + n, 3 + n));
      shape_inference::ShapeHandle seq;
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(1 + n), 1, &seq));
      c->set_output(0, seq);
      return OkStatus();
    })
    .Doc(R"doc(
Undoes entry `seq` of the log and removes it, atomically; a vector `seq`
undoes its entries one after the other, in its order, each as a scalar would
(an undo that fails stops the op with its error, the earlier ones done).

Holding the exclusive locks of `vars` (taken in address order) and then the
log's mutex, it finds entry `seq`, checks that it belongs to `target`, XORs its delta
back into the rows of `vars` (the entry's row of width W is split across
vars in order, each var taking its own row width in 32-bit words; see
EcRec>XorRows) and removes the entry. `found` is false and nothing changes
if the log holds no entry `seq` (already undone, committed or dropped), so
running an undo twice is harmless.

With `ordered` (for an optimizer's var + slots, whose updates do not
commute), fails with FailedPrecondition and changes nothing if the log holds
a later entry of `target`, or a later one of it was committed or dropped:
undo entries of such a target in reverse seq order. Without it (for parity
and replicas, whose XOR folds commute) any entry may be undone any time.

vars: the variables of `target`, e.g. [var, slot1, slot2] for an apply
  entry, [parity] or [replica] for a fold, [counter] for AssignAddLogged.
seq: int64 scalar, or a vector of entries of `target` in the order to undo
  them (newest first for an ordered target).
target: int32 scalar, the entry's expected target.
found: whether the entry was there (and has been undone); of `seq`'s shape.
)doc");

REGISTER_OP("EcRec>XorRows")
    .Input("vars: N * resource")
    .Input("rows: Tindices")
    .Input("delta: int32")
    .Attr("N: int >= 1")
    .Attr("Tindices: {int32, int64} = DT_INT64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 2;
      ShapeHandle rows;
      ShapeHandle delta;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n + 1), 2, &delta));
      shape_inference::DimensionHandle unused;
      return c->Merge(c->Dim(rows, 0), c->Dim(delta, 0), &unused);
    })
    .Doc(R"doc(
XORs words into rows of variables: vars[*][rows[i]] ^= delta[i].

Each variable is seen as a matrix of 32-bit words [rows, W_v]: rows is its
first dimension (1 for a scalar) and W_v the elements of a row times 1
(float32, int32) or 2 (float64, int64, low word first on little-endian
hosts). The variables must have equal row counts; a row of `delta` is split
across them in order: [W_0 words of vars[0] | W_1 of vars[1] | ...]. All
variables are locked exclusively (in address order) for the whole op;
repeated rows XOR in one after another. Everything is checked before the
first write.

vars: N distinct resource variables of dtype float32, int32, float64 or int64.
rows: [n] row ids in [0, rows).
delta: int32 [n, sum W_v].
)doc");

REGISTER_OP("EcRec>AssignAddLogged")
    .Input("var: resource")
    .Input("value: dtype")
    .Input("log: resource")
    .Input("sid: int64")
    .Input("target: int32")
    .Input("source: int32")
    .Attr("dtype: {float, double, int32, int64}")
    .Attr("bypass_fence: bool = false")
    .Attr("dedupe: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputs(c, 3, 6));
      ShapeHandle unused;
      const auto* handle_data = c->input_handle_shapes_and_types(0);
      if (handle_data != nullptr && !handle_data->empty()) {
        TF_RETURN_IF_ERROR(
            c->Merge((*handle_data)[0].shape, c->input(1), &unused));
      }
      return OkStatus();
    })
    .Doc(R"doc(
var += value (as AssignAddVariableOp, integers wrapping), logged.

Under var's exclusive lock, adds `value` and appends (sid, target, source,
rows 0..R-1, delta = bits(old) ^ bits(new) as [R, W] int32 words) to `log`,
where var is seen as words as in EcRec>XorRows (a scalar is one row: an
int64 counter gives R = 1, W = 2). XORing the delta back restores the old
value bit for bit. Fails with Aborted, changing nothing, if `sid` is fenced
or committed in the log, unless bypass_fence.

var: resource variable of `dtype`.
value: tensor of var's shape.
sid: int64 scalar; target: int32 scalar >= 0; source: int32 scalar >= -1.
)doc");

}  // namespace ec_rec
}  // namespace tensorflow
