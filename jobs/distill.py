"""Ray job: distill a fine-tuned teacher into a smaller student."""

from jobs._entry import run

if __name__ == "__main__":
    run(__doc__, "distill", "albert_dist.finetune.config:DistillJobConfig",
        "albert_dist.finetune.distill:run_distill")
