"""Context parallelism: strategies, load balancing, counted communication, plans.

A strategy is a module of this package that registers itself (``@register_strategy``): every
such module is imported here, so a new strategy is its file and its ``conf/cp/<name>.yaml``.
"""

from importlib import import_module
from pathlib import Path

from lcab.cp.balance import BALANCERS, Placement, place
from lcab.cp.base import STRATEGIES, Plan, Strategy

for _module in sorted(Path(__file__).parent.glob("*.py")):
    if "\n@register_strategy\n" in _module.read_text():
        import_module(f"{__name__}.{_module.stem}")

__all__ = ["BALANCERS", "STRATEGIES", "Placement", "Plan", "Strategy", "place"]
