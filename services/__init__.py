"""Example services on a real transformer; ``python -m services.build`` builds their model files."""
