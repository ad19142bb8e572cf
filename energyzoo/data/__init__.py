"""Data sources and task generators, one file each; every one offline unless it reads a `datasets` name."""
