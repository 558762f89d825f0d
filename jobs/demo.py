"""Ray job: the whole pipeline on a small corpus of Python docstrings (`albert-dist demo`)."""

from jobs._entry import run

if __name__ == "__main__":
    run("demo")
