"""A user's own Estimator, protected: the model_fn wrapper (`model_fn.ec_model_fn`), training under any
TF_CONFIG launcher (`job.train`, `job.train_and_evaluate`) and the trained model outside its cluster
(`offline.offline_estimator`). The public names are `tf_ecrec.ec_model_fn`, `tf_ecrec.train`,
`tf_ecrec.train_and_evaluate` and `tf_ecrec.offline_estimator`. Layer 5: it composes everything below.
"""
