import math
from accounting.discrete_gaussian import *
from accounting.gaussian import analytic_sigma, analytic_delta
from dp_accounting.pld import privacy_loss_mechanism as plm
print(zcdp_delta(0.025,1), zcdp_epsilon(0.025,1e-6), zcdp_rho(1,1e-6))
for s2, d in [(1,1),(4,1),(10,3),(100,7)]:
    for e in [0.1,0.5,1,2]:
        ours = delta_one_dimensional(e, s2, d)
        o = plm.DiscreteGaussianPrivacyLoss(math.sqrt(s2), sensitivity=d).get_delta_for_epsilon(e)
        print(s2,d,e, ours, o, ours/o-1 if o else None, zcdp_delta(rho(s2,d), e))
for e in [0.5,1,4]:
    D=2**17
    s2 = calibrate_sigma2(e,1e-6,D); print(e, s2, math.sqrt(s2)/D, analytic_sigma(e,1e-6,1), math.sqrt(s2)/D/analytic_sigma(e,1e-6,1))
