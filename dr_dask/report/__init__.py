"""Reports: the plotting API (:mod:`~dr_dask.report.plot`), the HTML page
(:mod:`~dr_dask.report.html`), and what the stream and the jobs report."""
