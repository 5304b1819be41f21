"""Context parallelism: strategies, load balancing, counted communication, plans."""

from lcab.cp import allgather, loongtrain, ring, ulysses, usp  # noqa: F401  (registration)
from lcab.cp.balance import BALANCERS, Placement, place
from lcab.cp.base import STRATEGIES, Plan, Strategy

__all__ = ["BALANCERS", "STRATEGIES", "Placement", "Plan", "Strategy", "place"]
