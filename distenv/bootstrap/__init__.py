"""The bootstrap: from a resolved `RankInfo` to a torch process group that every rank joined.

`init` (`init_dist`, `setup`) orchestrates; `session` holds one rank's place in its job's
rendezvous and the runner that bounds every phase by one deadline; `store` reaches rank 0's store,
`scope` proves it is this job's, `rollcall` holds the roll call (`records`, `verdict` and
`problems` check what it reads), `group` creates the process group and checks that every rank came
up, and `teardown` ends the groups before the interpreter finalises. torch is imported inside the
functions that need it.
"""
