"""``bench serve``: every arm in a real ``ft serve``, driven by the OpenAI client, through a cache rebuild."""
