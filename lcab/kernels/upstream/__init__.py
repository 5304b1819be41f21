"""What each GPU library really defines, read from its source: one table per library.

An adapter and its CPU stand-in must not share a misreading, so the facts both depend on live
here once, each row naming the repository, version and file it was read from; the tests hold
every row to the real thing where it exists on a CPU. `facts` holds the row types.
"""
