"""logicd: the logic-server framework (CPU half of a service). The framework itself arrives with issue 4."""

__version__ = "0.1.0"

__all__ = ["__version__"]
