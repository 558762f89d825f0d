"""Ray job: pretrain ALBERT (MLM + SOP) on Ray Train."""

from jobs._entry import run

if __name__ == "__main__":
    run("pretrain")
