"""Reaching the cluster: TF_CONFIG as a value (`tf_config`, its one writer) and sessions that carry the
cluster they reach (`ps_session`). Layer 1.
"""
