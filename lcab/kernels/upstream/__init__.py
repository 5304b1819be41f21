"""What each GPU library really defines, read from its source: one table per library.

An adapter and the CPU stand-in it is tested against must not share a misreading of the
library (two adapters once passed stand-ins written from the same wrong reading). So the
facts both depend on — functions, parameters in order, return arity, LSE layout and log base,
window and causal alignment — live here once, each row naming the repository, version or
commit and file it was read from. Adapters take their calls and probes from these rows, the
stand-ins in ``tests/helpers`` build their signatures from them, and the tests hold every row
to the real thing wherever it exists on a CPU machine (torch's own kernels, packages that
install without a GPU, the sources in a library's sdist).

`facts` holds the row types; each other module is one library's table, its rows written with
`facts.upstream_function`: the parameter list as the source's ``def`` writes it.
"""
