"""Distributed task processing for Django's Tasks framework on your relational database."""

__version__ = "0.1.0"
