"""The task side of the launcher: what runs inside one task process (``python -m tf_ecrec.launcher.task.entry
JOB_JSON``): the Estimator task (`entry`), the TF2 ParameterServerStrategy job (`pss_job`), the connection to
the job master (`master_connection`) and the process's own waits and signals (`process`). Imports only
`tf_ecrec.launcher.job` of the launcher; the rest of `tf_ecrec.launcher` is the parent side (the supervisor
and its parts).
"""
