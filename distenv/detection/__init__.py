"""Detection: from this process's environment to a resolved `RankInfo`.

`choice` picks the launcher (innermost wins), `agreement` checks that the layers present agree and
refuses leftovers, `layer` asks each launcher each question once, `pipeline` (`locate`) runs it all
and completes the master, over MPI through `exchange` where no variable names it. Everything but
`exchange` reads the environment only: no torch, no mpi4py, no subprocess.
"""
