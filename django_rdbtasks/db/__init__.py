"""Database-specific SQL of the claim protocol, one module per database."""

from .dialects import dialect_for, forget_what_claims_learnt, pin_clock

__all__ = ["dialect_for", "forget_what_claims_learnt", "pin_clock"]
