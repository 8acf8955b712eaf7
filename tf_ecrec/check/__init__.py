"""Checks of a live cluster from outside the training graph: reading its manifests and variables
(`live_cluster`) and verifying every parity and replica (`verify`). Layer 2.
"""
