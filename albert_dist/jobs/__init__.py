"""The jobs as the entry points see them: the registry (every job's command, config class and declaration) and
the catalog of packaged configs and schemas."""
