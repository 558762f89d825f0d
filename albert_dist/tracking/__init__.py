"""MLflow: a job's run (opened, resumed, ended), the metrics its workers log, the final model as an MLflow model. Takes
paths and flat params: it knows no job config, model or task."""
