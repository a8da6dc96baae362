from .process import EXIT_RECYCLE, Worker
from .supervisor import Supervisor

__all__ = ["EXIT_RECYCLE", "Supervisor", "Worker"]
