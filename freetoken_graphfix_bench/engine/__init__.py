"""``bench engine``: every arm in FreeToken's real offline engine, a process per arm; ``child/`` is that process."""
