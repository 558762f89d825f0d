"""Ray job: hyperparameter sweep with Ray Tune."""

from jobs._entry import run

if __name__ == "__main__":
    run(__doc__, "tune", "albert_dist.tune.config:TuneJobConfig", "albert_dist.tune:run_tune")
