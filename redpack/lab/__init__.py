"""The benchmark lab: bench users, the direct bench, ceilings, and the comparison report.

Tooling, not business rules: it drives the services the way clients would and measures.
"""
