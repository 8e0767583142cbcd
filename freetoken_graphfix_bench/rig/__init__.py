"""``bench rig`` and ``bench deadlock``: a decode-like graph on FreeToken's real graph runner and PLE table."""
