"""sapper's version, in a module of its own: the run log's header records it, and the
monitor that writes the header must not import the package root (which lists the
monitor among its exports)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
