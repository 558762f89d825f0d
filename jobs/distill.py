"""Ray job: distill a fine-tuned teacher into a smaller student."""

from jobs._entry import run

if __name__ == "__main__":
    run("distill")
