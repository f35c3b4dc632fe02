"""What the lognormal model of a neural gradient predicts about compressing it, from a layer's fit alone:
`fp` the error of rounding to a floating-point grid at a scale (and the best scale and exponent split),
`block` the flushed and clipped shares and error of block-scaled formats, `unbiased` the variance that
stochastic pruning, LUQ and MVUE N:M add. (`gradcomp.lognormal` holds the fit and the pruning threshold, which
the ops use.)"""
