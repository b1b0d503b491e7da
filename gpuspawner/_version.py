"""The one place gpuspawner's version is written: the package, its wheel and the hub image tag read it."""

__version__ = "0.1.0.dev0"
