"""Foundation helpers with no idea of their own to belong to: bounded retries (`retry`), ending a process
without the interpreter's teardown (`process_end`), objects kept beside a graph (`graph_registry`), large
tensors built on their PS (`unfolded`). Layer 0.
"""
