"""The benchmark lab: bench users, the direct bench, ceilings, and the comparison report.

Tooling, not business rules: it drives the services the way clients would and measures. Its
libraries (Locust, matplotlib, psutil) come with the `lab` extra: pip install -e '.[lab]'.
"""

LAB_EXTRA = "pip install -e '.[lab]' (make compare installs it)"


def missing_extra(error: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error to raise when a lab library is not installed: it says how to get it."""
    return ModuleNotFoundError(f"{error.name} is not installed: the lab needs {LAB_EXTRA}")
