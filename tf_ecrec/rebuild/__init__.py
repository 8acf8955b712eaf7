"""Rebuilding lost variables where the data lives: PS to PS, in bounded slices, decoded in C++.

`tf_ecrec.recovery` decides whether to rebuild; this package does it.  The
parts, in the order a rebuild runs:

``rebuilder``
    `Rebuilder`: the graph built once before the graph is finalized;
    allocates lost variables, copies dense ones from replicas, and either
    walks every lost chunk at once (`Rebuilder.rebuild`, and the re-encode
    after a restore) or does the T0 part of a background rebuild
    (`Rebuilder.begin_background`).
``stripes``
    `CollectionRebuild`: one collection's read, combine and write ops per
    chunk, the feeds that name survivors and decoding coefficients, and the
    slice-by-slice walk; `RebuildStats`.
``background``
    `BackgroundRebuild`: installs the pending rows while training goes on,
    the rows waiting lookups ask for first (docs/rebuild.md).
"""
