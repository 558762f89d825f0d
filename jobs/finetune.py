"""Ray job: fine-tune a pretrained ALBERT on a labelled task."""

from jobs._entry import run

if __name__ == "__main__":
    run(__doc__, "finetune", "albert_dist.finetune.config:FinetuneJobConfig",
        "albert_dist.finetune.job:run_finetune")
