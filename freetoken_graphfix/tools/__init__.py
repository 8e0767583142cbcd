"""The tools a user runs beside FreeToken: the command line (``doctor``, ``run``, ``patch``) and what it
shares with the benchmarks (its exit codes, its child processes). Nothing here runs inside FreeToken's processes."""
