"""Ray Tune sweeps of fine-tuning and distillation hyperparameters, tracked in MLflow.

config: sweep configs · space: search-space distributions, validation, sampled values → job configs · trainable:
one trial = one run of the registered job on Ray Train · mlflow_runs: parent/child runs · report: the trials table,
CSV and plot · sweep: runs (or resumes) a sweep and publishes its best trial.
"""
