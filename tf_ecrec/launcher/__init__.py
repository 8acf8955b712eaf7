"""The local cluster launcher: ``tf-ecrec run`` (the parent side, here: the supervisor and its parts), the
job it runs (`tf_ecrec.launcher.job`, shared) and the per-process task entry (`tf_ecrec.launcher.task`).
"""
