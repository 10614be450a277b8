"""What a rank leaves behind to explain its end: its failure record, its log, its stacks.

`failure` holds the one failure-record format (`Report`); `ranklog` keeps a rank's output and
record in a log folder under any launcher; `stacks` writes, reads and groups Python stacks;
`progress` is the watchdog thread that says a rank stopped progressing. ``distenv run``'s
supervisor (`distenv.local`), the in-process hang autopsy (`distenv.bootstrap.hang`) and
``distenv why`` (`distenv.cli.why`) build their cards from them.
"""
