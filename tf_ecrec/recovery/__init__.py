"""Bringing lost parameter servers back at the chief's session creation: deciding what to do and doing it.

The parts, in the order a recovery runs:

``scaffold``
    What `ec_model_fn` attaches to a training EstimatorSpec: the Scaffold
    whose saver (`ECSaver`) and ``init_fn`` lead session creation to the
    plan, the workers' ready op, and the chief's settlement hooks.
``graph``
    Graph pieces the plan builds before the graph is finalized: a whole
    marker per PS and the batched initialisers of a fresh start.
``plan``
    `RecoveryPlan`: at session creation, inspects what the PS tasks hold,
    asks the decision and carries it out (settle, initialise, restore,
    rebuild in `tf_ecrec.rebuild`, refuse).
``decision``
    `decide`: the decision table, a pure function of what was found.
``deadline_session``
    The long deadline (and optional tracing) under which the plan's session
    calls, saves and restores run.
``result``
    `RecoveryResult`: what a recovery did, returned by the plan and given to
    its listeners (the report's ``method``).
"""
