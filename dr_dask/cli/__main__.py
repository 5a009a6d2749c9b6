from dr_dask.cli import main

main()
