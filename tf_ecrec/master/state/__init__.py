"""The master's state as plain Python, persisted on every mutation.

``master_state`` holds :class:`~tf_ecrec.master.state.master_state.MasterState`,
the one lock and the public operations; it composes the task slots and their
liveness (``tasks``), the barriers (``barriers``), the datasets'
:class:`~tf_ecrec.master.shard_queue.ShardQueue` and the atomic snapshots
(``snapshot``).  Nothing here does network I/O.
"""
