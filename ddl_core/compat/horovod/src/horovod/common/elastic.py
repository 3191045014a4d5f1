"""`hvd.elastic` on horovod-ddl: Horovod's elastic training API (State, ObjectState, the
run loop, host updates) on DDL's fault-tolerant world.

The contract is Horovod's: the training function runs inside `hvd.elastic.run`; its state
object is committed now and then (`state.commit()`); when a collective fails because a
rank died (HorovodInternalError) every survivor restores the last commit, the world is
rebuilt over the ranks still alive (elastic_world.rebuild: ddl_core.shrink_world()), the
reset callbacks run, the state is synchronised from the new rank 0 and the function is
called again. When the launcher reports new or removed hosts, `commit()` (or
`check_host_updates()`) raises HostsUpdatedInterrupt on every rank at the same step and the
same reset follows, without the restore.
"""

from __future__ import annotations

import copy
import functools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import elastic_world
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, HostUpdateResult

__all__ = ["State", "ObjectState", "run_fn", "notification_manager", "HorovodInternalError",
           "HostsUpdatedInterrupt", "HostUpdateResult"]


class WorkerNotificationManager:
    """Delivers the launcher's host updates to the State objects of the running
    `hvd.elastic.run` calls (Horovod's listener interface: `on_hosts_updated`)."""

    def __init__(self) -> None:
        self._listeners: list[Any] = []
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def init(self) -> None:
        """Under ddlrun --elastic with a discovery script, start the thread that hands
        ddlrun's host updates to the listeners as they come (as Horovod's notification
        service does; check_host_updates also polls)."""
        with self._lock:
            if self._thread is not None or not os.environ.get("DDL_HOST_UPDATES"):
                return
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="horovod-host-updates")
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a lost channel ends the updates only
                print(f"horovod: host updates stopped: {exc}", file=sys.stderr, flush=True)
                return
            time.sleep(POLL_S)

    def register_listener(self, listener: Any) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def handle_hosts_updated(self, timestamp: float, update_res: int) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)

    def poll(self) -> None:
        """Hand every update the launcher has announced since the last poll on."""
        with self._poll_lock:
            updates = elastic_world.poll_host_updates()
        for timestamp, res in updates:
            self.handle_hosts_updated(timestamp, HostUpdateResult(int(res)))


notification_manager = WorkerNotificationManager()

#: seconds between two looks at ddlrun's host updates (a non-blocking read)
POLL_S = 0.1


class State:
    """What elastic training keeps in step across ranks and across resets. Subclasses say
    how to save (commit), restore and synchronise it.

    bcast_object: sends a picklable object from rank 0 to every rank (the front end's
    broadcast_object); get_rank: the rank now (it changes at a reset)."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        # (Horovod's attribute names: its own integration test reads them.)
        self._host_messages: queue.Queue[tuple[float, int]] = queue.Queue()
        self._last_updated_timestamp: float = 0
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Functions to call after every reset, once the world is the new one and before
        the state is synchronised: e.g. scale the learning rate by the new hvd.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state as the one a failure goes back to, then check for host updates
        (HostsUpdatedInterrupt). A commit copies the state, so commit as often as the
        work a failure may lose is worth."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt, on every rank at once, when the launcher has
        announced host updates newer than the last one acted on. Collective: rank 0's
        view is broadcast, so all ranks decide alike."""
        notification_manager.poll()
        prev = newest = self._last_updated_timestamp
        flags = HostUpdateResult.no_update
        while True:
            try:
                timestamp, res = self._host_messages.get_nowait()
            except queue.Empty:
                break
            if timestamp > newest:
                newest = timestamp
                flags |= HostUpdateResult(int(res))
        prev, newest, flags = self._bcast_object((prev, newest, int(flags)))
        self._last_updated_timestamp = newest
        if newest > prev:
            # Only removals: no new rank needs the state, so the sync can be skipped.
            raise HostsUpdatedInterrupt(HostUpdateResult(flags) == HostUpdateResult.removed)

    def save(self) -> None:
        """Keep the current state in host memory as the last commit."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last commit, undoing what changed since."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state rank 0's (collective)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Adjust to a new world after a reset, before the sync (e.g. re-shard data)."""


def _snapshot(value: Any) -> Any:
    """A copy of `value` that later changes to it do not reach (so a restore really
    undoes them, lists included); an object that cannot be copied is kept as it is."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - uncopyable (locks, handles): keep the reference
        return value


class ObjectState(State):
    """State made of plain Python objects, each a keyword argument that becomes an
    attribute (state.epoch, state.batch, ...)."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state = {k: _snapshot(v) for k, v in kwargs.items()}
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {k: _snapshot(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, _snapshot(value))


def _recoverable(exc: BaseException) -> bool:
    """A failure a reset recovers from: a HorovodInternalError, or libddl's lost-peer
    error reaching the loop directly or wrapped (torch re-raises errors of backward
    hooks as RuntimeErrors of its own)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, HorovodInternalError) or elastic_world.recoverable(e):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """`hvd.elastic.run` for a front end whose world reset is `reset`: call `func(state,
    ...)` until it returns, recovering from failures and host updates in between."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt as exc:
                    skip_sync = exc.skip_sync
                except Exception as exc:
                    if not _recoverable(exc):
                        raise
                    state.restore()
                    skip_sync = False
                _reset_world(reset)
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)

    return wrapper


def _reset_world(reset: Callable[[], None]) -> None:
    """Rebuild the world; a failure while doing so (another rank died during the shrink)
    is one more reset, within the reset limit."""
    while True:
        elastic_world.count_reset()
        try:
            reset()
            return
        except Exception as exc:
            if not _recoverable(exc):
                raise
