"""The job master: membership, cluster versions, dynamic data sharding and barriers over gRPC.

Server side: ``server`` starts it (embedded or standalone), ``servicer``
translates protobufs, ``state`` (a package) holds its plain-Python state,
``sharding`` and ``shard_queue`` the shard plan and who holds which shard.
Task side: ``client`` calls it and returns ``replies``; ``membership`` is the
membership backend kept by the master's heartbeats; ``progress_reporter``
attributes trained records to leases and reports them.  ``wire`` is what
both sides agree on beyond ``proto/master.proto``.
"""
