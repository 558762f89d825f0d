"""User-facing errors: the CLI prints their message alone, without a traceback."""


class AlbertDistError(Exception):
    """Base of every error caused by the user's input (config, files, data) rather than a bug."""


class ConfigError(AlbertDistError, ValueError):
    """A configuration that cannot work."""


class CheckpointError(AlbertDistError):
    """A checkpoint directory that is missing, incomplete or corrupted."""


class TokenizerError(AlbertDistError):
    """A tokenizer that cannot be trained or loaded."""


class DataError(AlbertDistError):
    """A corpus or dataset that cannot be read."""
