"""The engine core: the step loop of ``tamis serve``, in a thread or in a process of its own.

::

    API server process (event loop)           engine core (ThreadCore | ProcessCore)
    -------------------------------           -----------------------------------------
    AsyncEngine.generate/abort
        core.send(("add", id, prompt, params, priority) | ("abort", id))
                                  -------->   CoreLoop.apply(commands) between steps
                                              CoreLoop.step(): engine.step()
        AsyncEngine.on_core_event(event)
                                  <--------   ("outputs", [RequestOutput], stats)  one per step
                                              ("stats", stats) | ("failed", id, message, fault)
                                              ("dead", message): the core stopped for good

``ThreadCore`` runs ``LLMEngine.step()`` in a thread of the server's process (the offline
path's engine, shared GIL). ``ProcessCore`` runs it in a child process so tokenizing,
streaming and HTTP never wait for a step; its outputs cross the pipe as deltas
(``engine/core/deltas.py``) and the server rebuilds the cumulative outputs its handlers read.
"""
from tamis.engine.core.loop import CoreLoop
from tamis.engine.core.process import CoreInfo, ProcessCore
from tamis.engine.core.thread import ThreadCore

__all__ = ["CoreInfo", "CoreLoop", "ProcessCore", "ThreadCore"]
