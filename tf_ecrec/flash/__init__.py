"""Flash checkpoints of a PS job: every variable of every PS copied at one global step into shared
memory (its own host's and a peer's), persisted in the background and on SIGTERM, restored before
any disk checkpoint when more PS are lost than the code covers (DESIGN.md invariant 7;
docs/flash.md).

    from tf_ecrec.flash.config import FlashConfig
    model_fn = tf_ecrec.ec_model_fn(model_fn, ec, flash=FlashConfig(every_steps=100))

`config` (what, where: no TensorFlow), `snapshots` (the ops), `hooks` (the rounds and the gate),
`persist` (a PS's SIGTERM copy to disk).
"""
