"""Analytical cost model: pure functions of (model, machine, job, layouts).

Every function accepts numpy arrays for the layout fields (one element per layout), so the
same code scores one layout for `exaplan estimate` and a million for the search.
"""
