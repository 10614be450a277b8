"""The local launcher: `distenv run` and `launch()`, several ranks on this node.

`plan` decides the node, its ranks and their environments; `spawn` (`launch`) runs a function in
worker processes, `run` is the ``distenv run`` command; `supervise` runs ranks under one stop
policy (`stopping`), copying their output (`output`), with a `group_killer` that outlives a
launcher killed outright. Each rank reports its failure (`reporting`), the node's `witness` reads
the reports, the output and the ends, and a failed job ends with the first-failure `card`.
"""
