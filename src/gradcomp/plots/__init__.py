"""The draw step of every experiment: one function per experiment ID, named after its slug, in the module of
its stage (distributions, fp, sparsity, statquant, beyond). A draw function receives the experiment's
`Record` (what its compute step wrote, see `gradcomp.analysis.tables`) and returns a matplotlib figure; it
reads nothing else, so a figure shows exactly the numbers of its table. `gradcomp draw` saves it as PNG and
PDF next to the JSON."""
