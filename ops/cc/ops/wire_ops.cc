// Op registrations of EcRec>Pack and EcRec>Unpack (the kernels:
// ops/cc/kernels/wire_ops.cc; why: tf_ecrec/step/wire.py).

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ec_rec {
namespace {

using shape_inference::InferenceContext;

REGISTER_OP("EcRec>Pack")
    .Input("tensors: T")
    .Output("blob: int32")
    .Attr("T: list({int32, int64, bool}) >= 1")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    })
    .Doc(R"doc(
Packs `tensors` into one int32 vector: a header (their count, then each one's
rank and dimensions) and each one's elements as 32-bit words (an int64 as
two, a bool as one), so that a graph sends them to another task in one
transfer. EcRec>Unpack on the receiving task gives them back.
)doc");

REGISTER_OP("EcRec>Unpack")
    .Input("blob: int32")
    .Output("tensors: T")
    .Attr("T: list({int32, int64, bool}) >= 1")
    .Attr("ranks: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int32> ranks;
      TF_RETURN_IF_ERROR(c->GetAttr("ranks", &ranks));
      if (static_cast<int>(ranks.size()) != c->num_outputs()) {
        return errors::InvalidArgument("EcRec>Unpack: ", ranks.size(), " ranks for ", c->num_outputs(),
                                       " tensors");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, c->UnknownShapeOfRank(ranks[i]));
      }
      return OkStatus();
    })
    .Doc(R"doc(
The tensors EcRec>Pack put into `blob`, with their dtypes (`T`, which must
be the packing's) and shapes; `ranks` are their ranks, for shape inference.
)doc");

}  // namespace
}  // namespace ec_rec
}  // namespace tensorflow
