"""Ray job: fine-tune a pretrained ALBERT on a labelled task."""

from jobs._entry import run

if __name__ == "__main__":
    run("finetune")
