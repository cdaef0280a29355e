"""nczmap and the outside world: netCDF-4/HDF5 files (``netcdf4``), copying between any of them (``copy``),
and, above the format layer, the adapters other libraries use."""
