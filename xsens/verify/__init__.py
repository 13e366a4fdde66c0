"""Neural-network verification by the nonconvex reformulation (arXiv 2010.14322).

`bounds` (IBP and triangle-relaxation bounds of ReLU networks on an L∞ ball), `nonconvex`
(the reformulation, its primal/dual certificates and the PGD / FISTA solvers), `lp` (the
same relaxation as a HiGHS linear program) and `isotonic` (a second stagewise problem).
"""
