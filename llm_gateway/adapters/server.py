"""Serving the gateway's ASGI apps (``serve``, ``demo``) on uvicorn: the one place their
server settings live. Several listeners (the public one, the admin one) share one process
and one event loop, so they share the gateway too.

With ``WORKERS`` above 1 a small supervisor (``run_workers``) binds the listeners once and
forks that many workers, each serving on inherited sockets with a gateway of its own.
Where the platform has ``SO_REUSEPORT`` each worker slot has a public socket of its own
and the kernel spreads new connections across them (adapters/listeners.py); elsewhere the
workers share one socket and whichever is awake first accepts. Every worker serves the admin
listener too: the workers stay alike, so a dead or replaced worker takes nothing with it.
SIGTERM or SIGINT stops the workers gracefully; a worker that dies is started again;
SIGHUP reads the settings again and replaces the workers one by one, each old one stopped
once its replacement serves. Forked, not spawned: a worker starts from the supervisor's
imported modules, with nothing to pickle.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import logging
import os
import random
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from llm_gateway.adapters.gateway_protocol import server_options
from llm_gateway.adapters.listeners import (
    Listeners,
    bind_another,
    bind_listeners,
    bind_side,
    reuse_port_available,
)
from llm_gateway.config import ConfigError, HostPort, Settings

log = logging.getLogger("llm_gateway")

def server_config(app: object, bind: HostPort, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings for every listener of the gateway."""
    # No access log: per-request logging costs CPU on the hot path, and usage records
    # already hold what an access log would (without prompts or keys).
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=bind.host,
        port=bind.port,
        access_log=False,
        # Nothing reads the client address, and no uvicorn banner goes to clients.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        log_level="info",
        # uvicorn's loggers keep no handlers of their own: their lines go through the
        # process's (telemetry/logs.py), JSON with LOG_FORMAT=json like every other line.
        log_config=None,
        timeout_graceful_shutdown=10,
        # Slow, idle and oversized clients are reaped on every listener.
        **server_options(app, settings),  # type: ignore[arg-type]
    )


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside uvicorn's own handler: before it is installed, and when it raises
    the signal again after a graceful shutdown. A process told to stop that stopped did
    what it was asked: status 0, not death by SIGTERM."""
    raise SystemExit(0)


def run_server(app: object, settings: Settings,
               also: Sequence[tuple[object, HostPort]] = (), *,
               listeners: Listeners | None = None,
               on_reload: Callable[[], None] | None = None,
               on_started: Callable[[], None] | None = None) -> None:
    """Serve ``app`` on ``settings.bind`` and each ``(app, address)`` of ``also`` beside it,
    in one event loop, until SIGTERM or SIGINT (in-flight requests finish, the lifespan
    shutdown flushes usage records; then status 0); when one listener stops, all do.
    SIGHUP calls ``on_reload``; ``on_started`` is called once every listener serves.
    ``listeners``: sockets bound already (a worker's); else they are bound here."""
    servers: list[tuple[uvicorn.Server, list[socket.socket] | None]] = [
        (uvicorn.Server(server_config(app, settings.bind, settings)),
         [listeners.public] if listeners else None)]
    for side_app, bind in also:
        sock = listeners.side.get(bind) if listeners else bind_side(bind)
        if sock is not None:
            servers.append((uvicorn.Server(server_config(side_app, bind, settings)), [sock]))
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        status = asyncio.run(_serve_all(servers, on_reload, on_started),
                             loop_factory=servers[0][0].config.get_loop_factory())
    except KeyboardInterrupt:
        status = None
    finally:
        for _, sockets in servers[1:]:
            for sock in sockets or ():
                sock.close()
    if status is not None:
        sys.exit(status)
    if not servers[0][0].started:
        sys.exit(STARTUP_FAILURE)


async def _serve_all(servers: Sequence[tuple[uvicorn.Server, list[socket.socket] | None]],
                     on_reload: Callable[[], None] | None,
                     on_started: Callable[[], None] | None) -> int | str | None:
    """Every server until one stops; then the others. A server that cannot start calls
    sys.exit (a failed lifespan: 3); caught here, in its task, so the loop ends cleanly and
    the process exits with that status, not with a traceback."""

    async def serve(server: uvicorn.Server, sockets: list[socket.socket] | None,
                    ) -> int | str | None:
        try:
            await server.serve(sockets=sockets)
        except SystemExit as exc:
            return exc.code
        return None

    async def announce(callback: Callable[[], None]) -> None:
        while not all(server.started for server, _ in servers):
            if any(task.done() for task in tasks):
                return
            await asyncio.sleep(0.01)
        callback()

    if on_reload is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload, on_reload)
    tasks = [asyncio.create_task(serve(server, sockets)) for server, sockets in servers]
    announcing = asyncio.create_task(announce(on_started)) if on_started else None
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for server, _ in servers:
        server.should_exit = True
    statuses = await asyncio.gather(*tasks)
    if announcing is not None:
        announcing.cancel()
    return next((status for status in statuses if status), None)


def _reload(on_reload: Callable[[], None]) -> None:
    log.info("SIGHUP: looking at the routes again")
    on_reload()


# ---- several workers -------------------------------------------------------------------

# What a worker runs: a gateway serving on the listeners, ``started`` called once it
# serves; returns the worker's exit status.
WorkerMain = Callable[[Settings, Listeners, Callable[[], None]], int]

RESTART_DELAY_SECONDS = 1.0  # a worker that died this young is started again after this
STOP_GRACE_SECONDS = 25.0  # after SIGTERM, then SIGKILL (uvicorn gives connections 10 s)


def run_workers(settings: Settings, worker: WorkerMain, *, side: Sequence[HostPort] = (),
                reload_settings: Callable[[], Settings] | None = None) -> int:
    """Serve with ``settings.workers`` processes on listeners bound here once (the public
    one and each of ``side``) until SIGTERM or SIGINT; the exit status: 0 when every worker
    stopped cleanly. ``reload_settings`` reads the settings again (SIGHUP)."""
    try:
        listeners = bind_listeners(settings.bind, side, reuse_port=reuse_port_available())
    except OSError as exc:
        log.error("cannot listen on %s: %s", settings.bind, exc.strerror)
        return STARTUP_FAILURE
    supervisor = _Supervisor(settings, listeners, worker, reload_settings)
    try:
        return supervisor.run()
    finally:
        for sock in supervisor.own_sockets.values():
            sock.close()
        listeners.close()


@dataclass(slots=True)
class _Worker:
    pid: int
    slot: int
    pipe: int  # read end: a byte once the worker serves, end of file once it has exited
    started_at: float
    serving: bool = False
    stopping: bool = False  # told to stop: its exit is expected


class _Supervisor:
    def __init__(self, settings: Settings, listeners: Listeners, worker: WorkerMain,
                 reload_settings: Callable[[], Settings] | None) -> None:
        self.settings = settings
        self.listeners = listeners
        # Slot -> its own public socket (SO_REUSEPORT), bound when the slot's first worker
        # starts: until then the kernel hands every connection to the sockets that are
        # served. Slot 0 has the first one, ``listeners.public``. The socket outlives its
        # workers: a restarted or reloaded worker of the slot serves the same one, and
        # while the slot has no worker (a restart: about RESTART_DELAY_SECONDS plus a
        # start) the connections the kernel hashes to it wait in its backlog rather than
        # go to another worker; closing it instead would reset the ones waiting there.
        self.own_sockets: dict[int, socket.socket] = {}
        self.reuse_port = reuse_port_available()
        self.worker_main = worker
        self.reload_settings = reload_settings
        self.pid = os.getpid()
        self.selector = selectors.DefaultSelector()
        self.workers: dict[int, _Worker] = {}  # by pid: every process not yet reaped
        self.slots: dict[int, int] = {}  # slot -> the pid serving it (or starting to)
        self.restart_at: dict[int, float] = {}  # slot -> when to start a worker for it
        self.booted = False  # a first worker served: the settings work
        self.status = 0
        self.stopping_since: float | None = None
        self.killed = False
        # A reload: the settings new workers get, the slots left to replace, and the
        # new worker of the slot being replaced (the old one stops once it serves).
        self.next_settings = settings
        self.to_replace: list[int] = []
        self.replacement: _Worker | None = None

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self.wake = (wake_read, wake_write)
        self.selector.register(wake_read, selectors.EVENT_READ)
        previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        watched = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        # The signal number reaches the wake-up pipe; the loop below reads it there.
        previous = {signum: signal.signal(signum, _noted) for signum in watched}
        try:
            # One worker first: settings that cannot serve fail once, not N times.
            self._start(0, self.settings)
            while self.workers or self.stopping_since is None:
                for key, _ in self.selector.select(self._timeout()):
                    if key.fd == wake_read:
                        for signum in os.read(wake_read, 64):
                            self._on_signal(signum)
                    else:
                        self._on_pipe(key.data)
                self._on_time()
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.selector.close()
            os.close(wake_read)
            os.close(wake_write)
        return self.status

    # ---- workers --------------------------------------------------------------------

    def _start(self, slot: int, settings: Settings) -> _Worker:
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        listeners = self._listeners_of(slot)
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(read_end)
            self._become_worker(settings, listeners, write_end)
        os.close(write_end)
        worker = _Worker(pid, slot, read_end, time.monotonic())
        self.workers[pid] = worker
        self.selector.register(read_end, selectors.EVENT_READ, worker)
        log.info("worker %d starting (pid %d)", slot, pid)
        return worker

    def _listeners_of(self, slot: int) -> Listeners:
        """The listeners slot ``slot``'s workers serve: its own public socket where the
        platform has SO_REUSEPORT (bound on its first start), else the shared one."""
        if not self.reuse_port or slot == 0:
            return self.listeners
        if slot not in self.own_sockets:
            try:
                self.own_sockets[slot] = bind_another(self.listeners.public)
            except OSError as exc:
                log.warning("worker %d shares worker 0's socket: %s", slot, exc.strerror)
                return self.listeners
        return dataclasses.replace(self.listeners, public=self.own_sockets[slot])

    def _become_worker(self, settings: Settings, listeners: Listeners,
                       started_pipe: int) -> None:
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, _exit_cleanly)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            _die_with(self.pid)
            _reseed_random_generators()
            # Nothing of the supervisor's but the listeners and this worker's pipe.
            self.selector.close()
            for fd in (*self.wake, *(worker.pipe for worker in self.workers.values())):
                os.close(fd)
            for sock in (self.listeners.public, *self.own_sockets.values()):
                if sock is not listeners.public:
                    sock.close()  # another slot's: only the supervisor keeps them

            def started() -> None:
                with contextlib.suppress(OSError):  # the supervisor is gone: we stop too
                    os.write(started_pipe, b"s")

            status = self.worker_main(settings, listeners, started)
        except SystemExit as exc:
            status = _status_of(exc.code)
        except KeyboardInterrupt:
            status = 0  # an interrupt before uvicorn took over: stopped, as asked
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def _on_pipe(self, worker: _Worker) -> None:
        if os.read(worker.pipe, 64):
            self._serving(worker)
            return
        # End of file: the worker has exited.
        self.selector.unregister(worker.pipe)
        os.close(worker.pipe)
        _, wait_status = os.waitpid(worker.pid, 0)
        del self.workers[worker.pid]
        self._exited(worker, os.waitstatus_to_exitcode(wait_status))

    def _serving(self, worker: _Worker) -> None:
        worker.serving = True
        log.info("worker %d serving (pid %d)", worker.slot, worker.pid)
        if not self.booted:
            self.booted = True
            for slot in range(1, self.settings.workers):
                self.slots[slot] = self._start(slot, self.settings).pid
            self.slots[worker.slot] = worker.pid
        if worker is self.replacement:
            self.replacement = None
            self.settings = self.next_settings  # they serve: the reload's settings work
            self.restart_at.pop(worker.slot, None)
            old = self.workers.get(self.slots.get(worker.slot, -1))
            self.slots[worker.slot] = worker.pid
            if old is not None:
                self._stop(old)
            self._replace_next()

    def _exited(self, worker: _Worker, status: int) -> None:
        expected = worker.stopping or self.stopping_since is not None
        (log.info if expected and status == 0 else log.warning)(
            "worker %d (pid %d) exited with status %d", worker.slot, worker.pid, status)
        if expected:
            if status != 0 and not self.status:
                self.status = 1  # told to stop, it did not stop cleanly
            return
        if worker is self.replacement:
            self.replacement = None
            self.to_replace.clear()
            self.next_settings = self.settings
            log.error("reload: a new worker exited before serving; the others keep serving "
                      "as they were")
            return
        if not self.booted:
            # The first worker could not serve: its settings, its database, its port.
            self.status = status if status > 0 else 1
            self._shutdown()
            return
        if self.slots.get(worker.slot) != worker.pid or (
                self.replacement is not None and self.replacement.slot == worker.slot):
            return  # its slot is served by another already
        self.slots.pop(worker.slot, None)
        young = time.monotonic() - worker.started_at < RESTART_DELAY_SECONDS
        self.restart_at[worker.slot] = time.monotonic() + (RESTART_DELAY_SECONDS if young else 0)

    def _stop(self, worker: _Worker, signum: int = signal.SIGTERM) -> None:
        worker.stopping = True
        with contextlib.suppress(ProcessLookupError):  # exited already: its pipe says so
            os.kill(worker.pid, signum)

    # ---- signals and time -----------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            if self.stopping_since is None:
                self._shutdown()
            else:
                # Asked again: uvicorn stops at once on a second interrupt.
                for worker in list(self.workers.values()):
                    self._stop(worker, signal.SIGINT)
        elif signum == signal.SIGHUP:
            self._reload()

    def _shutdown(self) -> None:
        if self.workers:
            log.info("stopping %d workers", len(self.workers))
        self.stopping_since = time.monotonic()
        self.restart_at.clear()
        self.to_replace.clear()
        for worker in list(self.workers.values()):
            self._stop(worker)

    def _timeout(self) -> float:
        now = time.monotonic()
        due = list(self.restart_at.values())
        if self.stopping_since is not None and not self.killed:
            due.append(self.stopping_since + STOP_GRACE_SECONDS)
        return max(0.0, min([*due, now + 1.0]) - now)

    def _on_time(self) -> None:
        now = time.monotonic()
        for slot, at in list(self.restart_at.items()):
            if at <= now and self.stopping_since is None:
                del self.restart_at[slot]
                self.slots[slot] = self._start(slot, self.settings).pid
        if (self.stopping_since is not None and not self.killed
                and now - self.stopping_since >= STOP_GRACE_SECONDS):
            self.killed = True
            for worker in list(self.workers.values()):
                log.warning("worker %d (pid %d) did not stop in %.0f s: killed", worker.slot,
                            worker.pid, STOP_GRACE_SECONDS)
                self._stop(worker, signal.SIGKILL)

    # ---- reload -----------------------------------------------------------------------

    def _reload(self) -> None:
        if self.stopping_since is not None or not self.booted:
            log.warning("SIGHUP: ignored while the workers %s",
                        "stop" if self.booted else "start")
            return
        if self.reload_settings is not None:
            try:
                fresh = self.reload_settings()
            except ConfigError as exc:
                log.error("SIGHUP: %s; the workers keep serving as they were", exc)
                return
            fixed = {"BIND_ADDR": "bind", "ADMIN_BIND_ADDR": "admin_bind", "WORKERS": "workers"}
            if changed := [name for name, attr in fixed.items()
                           if getattr(fresh, attr) != getattr(self.settings, attr)]:
                log.warning("SIGHUP: %s changed: takes effect on restart", ", ".join(changed))
            self.next_settings = dataclasses.replace(
                fresh, **{attr: getattr(self.settings, attr) for attr in fixed.values()})
        log.info("SIGHUP: replacing %d workers one by one", len(self.slots))
        self.to_replace = sorted(self.slots)
        if self.replacement is None:
            self._replace_next()

    def _replace_next(self) -> None:
        while self.to_replace:
            slot = self.to_replace.pop(0)
            if slot in self.slots:
                self.replacement = self._start(slot, self.next_settings)
                return
        log.info("SIGHUP: every worker replaced")


def _noted(signum: int, frame: FrameType | None) -> None:
    """The supervisor's handler: the number is on the wake-up pipe already."""


def _status_of(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _reseed_random_generators() -> None:
    """Every ``random.Random`` the worker inherited (modules keep their own, for trace
    ids) holds the supervisor's state: unseeded, all workers would draw the same ids.
    Python reseeds only its module-level generator after a fork."""
    for thing in gc.get_objects():
        if type(thing) is random.Random:
            thing.seed()


def _die_with(supervisor: int) -> None:
    """SIGTERM (a graceful stop) when the supervisor dies, however it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: a worker outlives a killed supervisor
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)  # it died before the request was made
