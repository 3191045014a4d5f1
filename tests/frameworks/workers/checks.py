"""Shared by the Horovod workers: failures are collected in `bad` (each worker prints them
and exits 1 at its end) so one run reports every broken semantic, not only the first."""

from __future__ import annotations

bad: list[str] = []


def expect(cond: bool, what: str) -> None:
    if not cond:
        bad.append(what)


def raises(exc: type[BaseException], fn, what: str, text: str = "") -> None:  # noqa: ANN001
    """fn() raises exc with `text` in its message (anything else is recorded)."""
    try:
        fn()
    except exc as e:
        expect(text in str(e), f"{what}: message {e!s:.300}")
        return
    except BaseException as e:  # noqa: BLE001
        bad.append(f"{what}: raised {type(e).__name__}: {e!s:.300}")
        return
    bad.append(f"{what}: did not raise")
