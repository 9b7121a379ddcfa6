"""Placement scoring terms, by name: the registry lives in
``controlplane.runtime.scoring`` because a Dispatch start that uses a capacity
credit ranks its nodes with the same terms (services do not import each
other). ``ScheduleConfig.scoring`` names the term a Schedule instance uses.
"""

from __future__ import annotations

from controlplane.runtime.scoring import SCORES, lookup, register

__all__ = ["SCORES", "lookup", "register"]
