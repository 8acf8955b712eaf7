"""The launched job as a value, shared by the launcher and its task processes: the flags and their closed
sets (`choices`, `kill_spec`, `intervals`, `elastic`, `pss_rules`), the validated `spec.JobSpec`, the model
(`models`), the model dir's paths (`model_dir`), the status channel's datagrams (`status`) and the kinds of
process exits (`diagnosis`). Imports nothing else of the launcher.
"""
