// Ops that rebuild lost chunks where the data lives.
//
// A lost chunk is rebuilt in slices of rows, PS to PS: ReadRowWords runs on
// each surviving member of the stripe and returns a slice of its rows as
// 32-bit words (a data chunk's value and slot rows side by side, or a
// parity chunk's rows); CombineRows runs on the PS that holds the lost chunk
// and XORs the slices, each scaled by its decoding coefficient in GF(2^16);
// WriteRowWords writes the result into the chunk's rows there. The
// coordinator feeds only the slice's offset and the coefficients, so no
// table bytes pass through it and no process holds more than the slices in
// flight beyond its own variables.

#include "ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {

using shape_inference::InferenceContext;

REGISTER_OP("EcRec>ReadRowWords")
    .Input("vars: N * resource")
    .Input("start: int64")
    .Input("count: int64")
    .Output("words: int32")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 2;
      TF_RETURN_IF_ERROR(ScalarInputs(c, n, n + 2));
      return UnknownMatrixOutput(c);
    })
    .Doc(R"doc(
Rows [start, start + count) of variables seen as 32-bit words, side by side.

The variables are seen as in EcRec>XorRows (rows = first dimension, W_v words
per row) and must have equal row counts; row i of `words` is
[W_0 words of vars[0] | W_1 of vars[1] | ...] of row start + i. The variables
are locked exclusively (in address order) while the rows are copied.
count = 0 returns a [0, 0] tensor without looking the variables up (so a
lost, uninitialised variable can sit behind an input that is not wanted).

vars: N distinct resource variables of dtype float32, int32, float64 or int64.
start: int64 scalar >= 0.
count: int64 scalar >= 0, start + count <= rows.
words: int32 [count, sum W_v].
)doc");

REGISTER_OP("EcRec>CombineRows")
    .Input("coefs: int32")
    .Input("parts: N * int32")
    .Output("words: int32")
    .Attr("N: int >= 1")
    .Attr("bits: int = 16")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RanksAre(c, {{0, 1}}));
      return UnknownMatrixOutput(c);
    })
    .Doc(R"doc(
XOR of parts[j] scaled by coefs[j] in GF(2^bits), symbol by symbol.

A 32-bit word holds two 16-bit symbols (or four 8-bit ones) as in
tf_ecrec.erasure.codec, so the result is the codec's linear combination of chunks:
with the decoding coefficients of a stripe's survivors it is a lost chunk's
rows, with the encoding ones a parity's. Parts whose coefficient is 0 are
ignored whatever their shape (a part that was not read is [0, 0]); the
others must all have one shape [n, W], which is the output's. At least one
coefficient must be nonzero.

coefs: int32 [N], each in [0, 2^bits).
parts: N int32 matrices.
words: int32 [n, W].
)doc");

REGISTER_OP("EcRec>WriteRowWords")
    .Input("vars: N * resource")
    .Input("start: int64")
    .Input("words: int32")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 2;
      return RanksAre(c, {{n, 0}, {n + 1, 2}});
    })
    .Doc(R"doc(
Writes rows [start, start + n) of variables from 32-bit words (n = rows of
`words`), split across the variables as in EcRec>ReadRowWords.

The variables are locked exclusively (in address order) and written in
place; everything is checked before the first write. An empty `words`
writes nothing.

vars: N distinct, initialised resource variables of dtype float32, int32,
  float64 or int64 with equal row counts.
start: int64 scalar >= 0, start + n <= rows.
words: int32 [n, sum W_v].
)doc");

}  // namespace ec_rec
}  // namespace tensorflow
