"""Helpers shared by the ops tests (a unique module name: tests/ has no packages)."""

from __future__ import annotations

from collections.abc import Sequence


def sample_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples called ``name`` whose labels include ``labels`` in a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                found.append(s.value)
    return found


def describe(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) or "(no samples)"
