"""`albert-dist demo`: the whole pipeline on a corpus every machine has (the Python standard library's docstrings)."""
