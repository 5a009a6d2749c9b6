"""Reports: the plotting API (:mod:`~dr_dask.report.plot`), the HTML page
(:mod:`~dr_dask.report.html`), the notebook's interactive scatter
(:mod:`~dr_dask.report.interactive`), and what the stream and the jobs report."""
