"""Side-by-side speed measurements (ratios from one run, never timed tests)."""

from .runner import run_bench  # noqa: F401
