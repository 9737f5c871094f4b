"""Relational databases through SQLAlchemy: ``RdsSource`` and ``RdsSink``."""
