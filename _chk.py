import numpy as np
from fractions import Fraction
from scipy import stats
from protocols.discrete_gaussian import *
for seed in range(3):
  for s2 in [1, Fraction(1,4), 10]:
    x = sample_discrete_gaussian(s2, 400000, GeneratorUniform(np.random.default_rng(seed)))
    ks = np.arange(-80, 81); w = np.exp(-ks**2/(2*float(s2))); w/=w.sum()
    obs = np.array([(x==k).sum() for k in ks]); exp=w*x.size
    m = exp>5
    chi = ((obs[m]-exp[m])**2/exp[m]).sum(); print(seed, s2, x.var(), (w*ks**2).sum(), chi, m.sum()-1, stats.chi2.sf(chi, m.sum()-1))
for seed in range(3):
    x = discrete_laplace(3, 400000, GeneratorUniform(np.random.default_rng(seed)))
    ks = np.arange(-80, 81); w = np.exp(-abs(ks)/3); w/=w.sum()
    obs = np.array([(x==k).sum() for k in ks]); exp=w*x.size; m=exp>5
    chi = ((obs[m]-exp[m])**2/exp[m]).sum(); print('lap', chi, m.sum()-1, stats.chi2.sf(chi, m.sum()-1))
