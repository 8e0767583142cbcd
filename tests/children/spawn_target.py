"""Run in spawned children. Imports nothing of freetoken_graphfix itself: only the bootstrap can."""

import sys


def report(queue) -> None:
    preloaded = "freetoken_graphfix" in sys.modules  # put there by the .pth, or not at all
    import freetoken.engine.graph as graph

    queue.put((preloaded, type(vars(graph)["_upload_graph"]).__name__))
