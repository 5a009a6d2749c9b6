"""The estimators (IKD, Isomap, Landmark Isomap, GP-Isomap, LSDR), their solvers, and the
factory that builds them by method name (:mod:`.factory`).

Kept empty: workers import the solver modules of this package, and this file is imported
with each of them.
"""
