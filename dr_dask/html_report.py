"""``html_report`` at its public path: :mod:`dr_dask.report.html` is where it lives."""

from dr_dask.report.html import MAX_POINTS, html_report

__all__ = ["MAX_POINTS", "html_report"]
