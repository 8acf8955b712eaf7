"""The erasure code: GF(2^16) arithmetic (`gf16`), exact codes over the raw bits of rows (`codec`), and
the code a job chooses (`code.ECConfig`). Layer 0: values and arithmetic, no TensorFlow.
"""
