"""lcab: the long-context attention benchmark."""

__version__ = "0.1.0"
