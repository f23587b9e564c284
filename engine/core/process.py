"""``ProcessCore``: the engine core (scheduler, KV manager, structured outputs, model
runner) in a child process, so the server's event loop never shares a GIL with a step.

::

    server process                                    core process (spawn)
    --------------                                    --------------------
    send(command) -> deque -> sender thread --[commands pipe: list of commands]--> recv
                                                      CoreLoop.apply, CoreLoop.step
    on_event <- receiver thread <------[events pipe: one message per step]------- emit
                   `-- also watches the child's sentinel: its death is an event too

The message layer is ``multiprocessing.connection`` (two one-way pipes, pickled tuples):
the standard library, no extra dependency, and the messages are small (a step's new ids,
text and logprobs: ``engine/core/deltas.py``), so a faster framing would not show. A
``spawn`` context is used because CUDA cannot be used in a process forked after it was
initialised.

Lifecycle: the constructor starts the child and waits for it to load the model; a
failure there is raised from the constructor with the child's exception (a model that
cannot load fails ``tamis serve`` as before). Afterwards the core ends with a ``("dead",
message)`` event when its step loop raises, a rank of a multi-process runner ends (also
while the core idles: it waits on the ranks as on its commands), or the process dies for
any reason (killed, out of memory): never a hang. The child ignores SIGINT (a terminal's
Ctrl-C reaches the whole process group; the server decides when the core stops) and exits
when the server's end of a pipe closes.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import logging
import multiprocessing
import multiprocessing.connection as mpc
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tamis.engine.core.deltas import OutputPacker
from tamis.engine.core.loop import CoreLoop

logger = logging.getLogger("tamis.engine.core")


@dataclass
class CoreInfo:
    """What the server needs of the engine in the core process (``ProcessCore.engine``):
    the names ``LLMEngine`` has, plus the tokenizer, loaded in the server's process."""
    config: Any
    model_dir: Path | None
    max_model_len: int
    vocab_size: int
    eos_token_ids: set[int]
    tokenizer: Any = None
    hf_config: Any = None

    @classmethod
    def of(cls, engine: Any) -> "CoreInfo":
        return cls(engine.config, getattr(engine, "model_dir", None), engine.max_model_len,
                   engine.vocab_size, set(engine.eos_token_ids))

    def load_tokenizer(self) -> None:
        from tamis.engine.loader import tokenizer_path
        from tamis.engine.tokenizer import load_tokenizer

        if self.config.skip_tokenizer_init or self.model_dir is None:
            return
        self.tokenizer = load_tokenizer(tokenizer_path(self.config, self.model_dir),
                                        self.config.trust_remote_code)


class EngineCoreStartError(RuntimeError):
    """The core process ended before its engine was ready."""


class ProcessCore:
    """The engine core in a child process; ``make_engine`` (picklable, called in the
    child) builds its ``LLMEngine``. ``remote`` is True: outputs cross the pipe as deltas,
    so the server asks for them (``engine/core/deltas.py``).

    ``ProcessCore.for_config(config)`` is the usual way to make one."""

    remote = True

    def __init__(self, make_engine: Callable[[], Any], start_timeout: float | None = None):
        context = multiprocessing.get_context("spawn")
        core_commands, self._commands = context.Pipe(duplex=False)
        self._events, core_events = context.Pipe(duplex=False)
        self.process = context.Process(
            target=run_core, name="tamis-engine-core", daemon=True,
            args=(make_engine, core_commands, core_events, logging.getLogger().level))
        self.process.start()
        # Only the child may hold its ends: a dead child must read as EOF here.
        core_commands.close()
        core_events.close()
        try:
            self.engine: CoreInfo = self._wait_until_ready(start_timeout)
            self.engine.load_tokenizer()
        except BaseException:
            self.process.kill()
            raise
        self._outbox: collections.deque = collections.deque()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._on_event: Callable[[tuple], None] | None = None
        self._receiver = threading.Thread(target=self._receive, name="tamis-core-events",
                                          daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="tamis-core-commands",
                                        daemon=True)

    @classmethod
    def for_config(cls, config: Any, **kwargs: Any) -> "ProcessCore":
        from tamis.engine.engine import LLMEngine

        return cls(functools.partial(LLMEngine, config), **kwargs)

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive() and self._receiver.is_alive()

    def start(self, on_event: Callable[[tuple], None]) -> None:
        """Starts relaying: ``on_event`` receives every event (``engine/core/loop.py``), on
        the receiver thread; the core's death arrives as a ``("dead", message)`` event."""
        self._on_event = on_event
        self._receiver.start()
        self._sender.start()

    def send(self, command: tuple) -> None:
        """Queues a command; the sender thread pickles and writes it (a large prompt never
        blocks the caller while the core is busy with a step)."""
        with self._wakeup:
            self._outbox.append(command)
            self._wakeup.notify()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Asks the core to abort everything and exit; kills it after ``timeout`` seconds."""
        with self._wakeup:
            self._outbox.append(("shutdown",))
            self._stopping = True
            self._wakeup.notify()
        if self._sender.is_alive():
            self._sender.join(timeout)
        else:   # never started, or ended by a broken pipe
            with contextlib.suppress(OSError, ValueError):
                self._commands.send([("shutdown",)])
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core did not exit in %.0f s; killing it", timeout)
            self.process.kill()
            self.process.join(timeout)
        self._commands.close()

    # ---- start-up ----

    def _wait_until_ready(self, timeout: float | None) -> CoreInfo:
        ready = mpc.wait([self._events, self.process.sentinel], timeout)
        if not ready:
            self.process.kill()
            raise EngineCoreStartError(f"the engine core was not ready after {timeout} s")
        try:
            kind, payload = self._events.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise EngineCoreStartError(f"the engine core process exited with code "
                                       f"{self.process.exitcode} while loading") from None
        if kind == "ready":
            return payload
        self.process.join(5)
        raise payload

    # ---- relay threads ----

    def _send_loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._outbox and not self._stopping:
                    self._wakeup.wait()
                commands = list(self._outbox)
                self._outbox.clear()
            if commands:
                try:
                    self._commands.send(commands)
                except (OSError, ValueError):
                    return   # the core is gone; the receiver reports it
            if self._stopping and not self._outbox:
                return

    def _receive(self) -> None:
        message = None
        try:
            while message is None:
                event = self._next_event()
                if event is None:
                    message = _exit_message(self.process)
                elif event[0] == "dead":
                    message = event[1]
                else:
                    self._on_event(event)
        except Exception as exc:  # noqa: BLE001 - a broken relay is a dead core to the server
            logger.exception("relaying the engine core's events failed")
            message = f"relaying the engine core's events failed: {exc!r}"
        if not self._stopping:   # after shutdown() the core's exit is no death
            logger.error("engine core died: %s", message)
            self._on_event(("dead", message))

    def _next_event(self) -> tuple | None:
        """The next event, or None once the core process is gone (after its last
        messages were read)."""
        while True:
            mpc.wait([self._events, self.process.sentinel])
            if self._events.poll():
                try:
                    return self._events.recv()
                except (EOFError, OSError):
                    return None
            if not self.process.is_alive():
                return None


def _exit_message(process) -> str:
    process.join(5)
    code = process.exitcode
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"the engine core process {how}"


# ---- the child ----

def run_core(make_engine: Callable[[], Any], commands, events, log_level: int) -> None:
    """The core process's entry point: builds the engine, says it is ready (or why not),
    then serves commands until told to stop or the server's end of a pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s[core]: %(message)s")
    try:
        engine = make_engine()
        _freeze_startup_objects()
        events.send(("ready", CoreInfo.of(engine)))
    except BaseException as exc:  # noqa: BLE001 - handed to the server, which raises it
        # Not logged here: the server decides how to report it (one line for a bad model
        # name). Where it prints a traceback, this process's frames come with it.
        if hasattr(exc, "add_note"):   # Python 3.11+
            exc.add_note("raised in the engine core process:\n" + "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
        events.send(("error", _picklable(exc)))
        sys.exit(1)
    loop = CoreLoop(engine, events.send, OutputPacker())
    try:
        import torch

        with torch.inference_mode():
            _serve(loop, commands)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        sys.exit(0)   # the server is gone: nobody to serve
    except BaseException as exc:  # noqa: BLE001 - any crash ends the core
        logger.exception("engine core step loop crashed")
        with contextlib.suppress(OSError):
            events.send(("dead", f"engine step loop crashed: {exc!r}"))
        sys.exit(1)
    finally:
        loop.abort_all()
        _stop_engine(engine)


def _stop_engine(engine) -> None:
    """Stops the ranks and workers the engine started: a process ends here through
    ``os._exit`` (multiprocessing), which runs no exit handler."""
    try:
        shutdown = getattr(engine, "shutdown", None)   # a test's stand-in may have none
        if shutdown is not None:
            shutdown()
    except Exception:  # noqa: BLE001 - the process ends either way
        logger.exception("engine shutdown failed")


def _freeze_startup_objects() -> None:
    """Takes what start-up made (the model's modules, the tokenizer, the structured-output
    tables) out of the cyclic garbage collector's reach: it lives as long as the process,
    and every full collection would rescan it, a pause of up to a second in the middle of
    a step. Garbage made later is collected as usual."""
    gc.collect()
    gc.freeze()


def _serve(loop: CoreLoop, commands) -> None:
    runner = getattr(loop.engine, "runner", None)
    while True:
        if not loop.has_work:
            _wait_for_command(commands, runner)
        batch = _receive_commands(commands)
        stop = any(c[0] == "shutdown" for c in batch)
        loop.apply([c for c in batch if c[0] != "shutdown"])
        if stop:
            return
        if loop.has_work:
            loop.step()


def _wait_for_command(commands, runner) -> None:
    """Blocks until a command arrives. A rank of a multi-process runner that ends
    meanwhile raises its ``RankFailedError`` (a process of this host at once, another
    host's within the runner's ``rank_check_interval_s``): an idle engine that lost a rank
    must die now (``/health`` 503, the server exits), not with the next request."""
    sentinels = getattr(runner, "rank_sentinels", [])
    interval = getattr(runner, "rank_check_interval_s", None)
    while commands not in (ready := mpc.wait([commands, *sentinels], interval)):
        runner.check_ranks()   # ranks of other hosts are checked when the wait times out
        if ready:
            raise RuntimeError("a rank process ended but its runner reports no failure")


def _receive_commands(commands) -> list[tuple]:
    """Every command waiting in the pipe; EOFError once the server's end closed."""
    batch: list[tuple] = []
    while commands.poll():
        batch += commands.recv()
    return batch


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it crosses a pipe intact, else a RuntimeError with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return RuntimeError(text)


__all__ = ["CoreInfo", "EngineCoreStartError", "ProcessCore", "run_core"]
