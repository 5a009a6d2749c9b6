"""The boundary: storage locations, opening and validating inputs, JSON files, and the
checkpoint protocol a solver asks of a run."""
