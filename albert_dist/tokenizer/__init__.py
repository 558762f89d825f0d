"""Tokenizers: SentencePiece (English ALBERT) and WordPiece (Chinese ALBERT) behind one `AlbertTokenizer`, and their
training on a corpus."""
