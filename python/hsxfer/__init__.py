"""Bulk data transfer over N parallel TCP channels, from Python.

The same library as the ``hsxfer`` command: one control connection and N data channels on the
server's one port, every block checked on arrival and every file end to end, interrupted
transfers resumed where they stopped, and the transfer tuned to the path while it runs.

>>> import hsxfer
>>> report = hsxfer.copy(["data/"], "dtn1:incoming/", channels=8,
...                      token_file="/home/me/.hsxfer-token", recursive=True,
...                      progress=lambda p: print(p["bytes"], "of", p["expected"]))
>>> report["verified"], report["goodput_bps"]

Transfers release the GIL while they run. The progress callback is called on the calling
thread every ``interval`` seconds (and once at the end) with a dict: ``bytes`` and
``expected`` (payload bytes so far and in all, as far as known), ``files_done``, ``seconds``,
and ``channels`` (bytes per data channel). If the callback raises, or on Ctrl-C (looked for
every 0.2 s, whatever the interval), the transfer stops and the exception propagates; the
server keeps what arrived, and the same call later resumes from there. Python delivers
Ctrl-C to the main thread only: to stop a transfer running on another thread, raise from its
callback (for example once a ``threading.Event`` is set). An exception from the last call,
once the transfer is done, is reported as unraisable (as one from ``__del__`` is) and the
report is returned; Ctrl-C there still propagates.

Errors are :class:`Error` (or one of its subclasses) with the same one-line messages as the
command line; bad arguments raise :class:`ValueError`. :class:`TransientError` (and its
:class:`BusyError`) says that the same call made again later may succeed, and resumes where
this one stopped: the server was busy or stopping, the connection dropped, or a step timed
out. A retry loop catches that one; the others need something changed first, except that a
server being restarted refuses connections for a while (:class:`ConnectError`). A transfer
that fails first issues, as warnings, the notes its report would have carried (entries of a
tree passed over, limits met, a server key recorded).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from . import _native
from ._native import AuthError, BusyError, ConnectError, Error, TransientError

__all__ = [
    "AuthError",
    "BusyError",
    "ConnectError",
    "DEFAULT_PORT",
    "Error",
    "Server",
    "TransientError",
    "bench",
    "copy",
    "probe",
    "pull",
    "push",
]

#: The port ``hsxfer serve`` listens on by default.
DEFAULT_PORT: int = _native.DEFAULT_PORT

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[Dict[str, Any]], Any]


def _whole(name: str, value: Any, bits: int) -> Optional[int]:
    """``value`` as an unsigned integer of ``bits`` bits (``None`` stays ``None``); a float
    with no fraction is taken (``rate=10e9``). Anything else raises :class:`ValueError`,
    where the native layer raised ``TypeError`` or ``OverflowError``."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {value!r} is not a whole number")
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{name} {value} is out of range: use 0 to {(1 << bits) - 1}")
    return value


def _options(
    channels: Optional[int],
    port: int,
    token_file: Optional[PathLike],
    block_size: Optional[int],
    cc: Union[None, str, Sequence[str]],
    rate: Optional[int],
    pace: Optional[int],
    tune: str,
    policy: str,
    mptcp: bool,
    mptcp_paths: Union[str, Sequence[str]],
    encrypt: bool,
    server_fingerprint: Optional[str],
    known_servers: Optional[PathLike],
) -> Dict[str, Any]:
    if isinstance(cc, str):
        cc = [cc]
    if not isinstance(mptcp_paths, str):
        mptcp_paths = ",".join(mptcp_paths)
    return {
        "channels": _whole("channels", channels, 16),
        "port": _whole("port", port, 16),
        "token_file": os.fspath(token_file) if token_file is not None else None,
        "block_size": _whole("block_size", block_size, 32),
        "cc": list(cc or []),
        "rate": _whole("rate", rate, 64),
        "pace": _whole("pace", pace, 64),
        "tune": tune,
        "policy": policy,
        "mptcp": mptcp,
        "mptcp_paths": mptcp_paths,
        "encrypt": encrypt,
        "server_fingerprint": server_fingerprint,
        "known_servers": os.fspath(known_servers) if known_servers is not None else None,
    }


def _operand(path: PathLike) -> str:
    """A string operand as it is (``HOST:PATH`` is remote); a path object is local whatever
    it holds: a relative one goes as ``./NAME``, so that a colon in it (which ``pathlib``
    keeps while it drops a leading ``./``) does not make it read as ``HOST:PATH``."""
    if isinstance(path, str):
        return path
    text = os.fspath(path)
    return text if os.path.isabs(text) else os.path.join(".", text)


def _operands(sources: Union[PathLike, Iterable[PathLike]], dest: PathLike) -> List[str]:
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    return [_operand(s) for s in sources] + [_operand(dest)]


def copy(
    sources: Union[PathLike, Iterable[PathLike]],
    dest: PathLike,
    *,
    recursive: bool = False,
    channels: Optional[int] = None,
    port: int = DEFAULT_PORT,
    token_file: Optional[PathLike] = None,
    block_size: Optional[int] = None,
    cc: Union[None, str, Sequence[str]] = None,
    rate: Optional[int] = None,
    pace: Optional[int] = None,
    tune: str = "auto",
    policy: str = "fair",
    mptcp: bool = False,
    mptcp_paths: Union[str, Sequence[str]] = "auto",
    encrypt: bool = True,
    server_fingerprint: Optional[str] = None,
    known_servers: Optional[PathLike] = None,
    progress: Optional[Progress] = None,
    interval: float = 0.5,
    _expect: Optional[str] = None,
) -> Dict[str, Any]:
    """Copies files to or from an ``hsxfer serve`` server, like ``hsxfer copy``.

    Operands are as for ``scp``: ``HOST:PATH`` is remote (relative to the server's root),
    anything else local (write ``./a:b`` for a local name with a colon; a ``pathlib.Path`` is
    always local). Local sources and a
    remote ``dest`` push; remote sources and a local ``dest`` pull.

    ``channels`` fixes the number of data channels (default: tuned while the copy runs).
    ``token_file`` is the server's shared secret (``hsxfer token new``); without it the server
    must run ``--no-auth`` on loopback. ``cc`` names congestion controls, cycled over the
    channels; ``rate`` is the path's bottleneck in bits/s if known; ``pace`` caps each
    channel, bits/s; ``policy`` is ``"fair"`` or ``"fast"`` (may choose BBR, and runs BIC
    under the pacing caps where it is registered). ``mptcp`` moves the data over one
    Multipath TCP connection with ``channels`` subflows (paced as root,
    ``pace`` per subflow or from ``rate``); it falls back to TCP, with a warning, unless the
    server listens with MPTCP. The report's ``transport`` and ``subflows`` say what ran, and
    its ``channels`` rows are the subflows. ``mptcp_paths`` is ``"auto"`` (as root, also open
    subflows from every local address whose route toward the server leaves through another
    interface), ``"off"``, or a list of this host's addresses to use as well; each path gets
    ``channels`` subflows, 9 in all at most.

    Every connection is TLS 1.3. The server's key is checked against the known-servers file
    (``~/.config/hsxfer/known_servers``, or ``known_servers``): a server met for the first
    time is recorded, a changed key raises :class:`AuthError`. ``server_fingerprint``
    (``"SHA256:..."``, as the server prints it or :attr:`Server.fingerprint` gives it) pins
    one key instead. ``encrypt=False`` asks for clear text, which the server must allow. The
    report's ``encrypted`` and ``cipher_suite`` say what ran.

    ``tune`` is where the rest comes from, as with ``hsxfer copy --tune``: ``"auto"`` starts
    from the profile a probe or an earlier long copy saved for this server and direction, and
    tunes while the copy runs; ``"probe"`` probes the path first (about 10 s) and saves it;
    ``"off"`` keeps the settings planned at the start. Profiles are shared with the command
    line (``~/.cache/hsxfer/profiles``). Problems with them are issued as warnings.

    Returns the report as a dict: the fields of ``hsxfer copy --json``'s summary (``bytes``,
    ``seconds``, ``goodput_bps``, ``verified``, ``files``, ``bytes_resumed``, ``channels``,
    ``tuning``, ...), see docs/json.md.
    """
    options = _options(
        channels, port, token_file, block_size, cc, rate, pace, tune, policy, mptcp,
        mptcp_paths, encrypt, server_fingerprint, known_servers,
    )
    report = _native.copy(
        _operands(sources, dest),
        options,
        recursive=recursive,
        expect=_expect,
        progress=progress,
        interval=interval,
    )
    return json.loads(report)


def push(sources: Union[PathLike, Iterable[PathLike]], dest: str, **kwargs: Any) -> Dict[str, Any]:
    """Sends local ``sources`` to ``dest`` (``HOST:PATH``). Keywords as for :func:`copy`."""
    return copy(sources, dest, _expect="push", **kwargs)


def pull(sources: Union[str, Iterable[str]], dest: PathLike, **kwargs: Any) -> Dict[str, Any]:
    """Fetches ``sources`` (``HOST:PATH``, one host) into local ``dest``. Keywords as for
    :func:`copy`."""
    return copy(sources, dest, _expect="pull", **kwargs)


def bench(
    host: str,
    *,
    direction: str = "upload",
    bytes: Optional[int] = None,
    seconds: Optional[float] = None,
    channels: Optional[int] = None,
    port: int = DEFAULT_PORT,
    token_file: Optional[PathLike] = None,
    block_size: Optional[int] = None,
    cc: Union[None, str, Sequence[str]] = None,
    rate: Optional[int] = None,
    pace: Optional[int] = None,
    tune: str = "auto",
    policy: str = "fair",
    mptcp: bool = False,
    mptcp_paths: Union[str, Sequence[str]] = "auto",
    encrypt: bool = True,
    server_fingerprint: Optional[str] = None,
    known_servers: Optional[PathLike] = None,
    progress: Optional[Progress] = None,
    interval: float = 0.5,
) -> Dict[str, Any]:
    """Memory to memory through the whole protocol, like ``hsxfer bench``: ``bytes`` or
    ``seconds`` (one of them; default 10 s) of generated data, ``direction`` ``"upload"`` or
    ``"download"``. A timed bench ends at its time and counts what arrived by then.
    Encryption as for :func:`copy`. Returns the report, as :func:`copy` does."""
    options = _options(
        channels, port, token_file, block_size, cc, rate, pace, tune, policy, mptcp,
        mptcp_paths, encrypt, server_fingerprint, known_servers,
    )
    if bytes is None and seconds is None:
        seconds = 10.0
    report = _native.bench(
        host,
        options,
        direction=direction,
        bytes=bytes,
        seconds=seconds,
        progress=progress,
        interval=interval,
    )
    return json.loads(report)


def probe(
    host: str,
    *,
    port: int = DEFAULT_PORT,
    token_file: Optional[PathLike] = None,
    budget: Optional[float] = None,
    direction: str = "push",
    policy: str = "fair",
    save: bool = True,
    encrypt: bool = True,
    server_fingerprint: Optional[str] = None,
    known_servers: Optional[PathLike] = None,
    mptcp: bool = False,
) -> Dict[str, Any]:
    """Measures the path to ``host`` and ranks congestion control x channels x pacing within
    ``budget`` seconds (default 10, or the least the path's RTT needs where that is more:
    about 19 at 240 ms), like ``hsxfer probe --json``. With ``save`` the result is kept as the
    server's profile, which later copies in that direction start from (``tune="auto"``).
    Returns the report as a dict (``rtt_ms``, ``rate_bps``, ``recommendation``, ``flags``,
    ``candidates``, ``profile``: the saved file or None, ...). Encryption as for
    :func:`copy`; ``mptcp`` runs the trials over MPTCP subflows, as ``hsxfer probe
    --mptcp``."""
    report = _native.probe(
        host,
        port=_whole("port", port, 16),
        token_file=os.fspath(token_file) if token_file is not None else None,
        budget=budget,
        direction=direction,
        policy=policy,
        save=save,
        encrypt=encrypt,
        server_fingerprint=server_fingerprint,
        known_servers=os.fspath(known_servers) if known_servers is not None else None,
        mptcp=mptcp,
    )
    return json.loads(report)


class Server:
    """An hsxfer server in this process, serving ``root`` until closed.

    Use it as a context manager::

        with hsxfer.Server("/data", token_file="/etc/hsxfer/token", listen="0.0.0.0") as s:
            print("serving on port", s.port)
            ...

    ``port=0`` (the default) takes a free port. Without ``token_file`` it runs without
    authentication, which is allowed only on a loopback address. ``mptcp=True`` listens with
    Multipath TCP, so ``mptcp`` clients get MPTCP channels (TCP clients are served as before).

    Connections are TLS 1.3 with the server's key, kept in ``key_file`` (default:
    ``~/.config/hsxfer/server-key.pem``, made on first use); clients pin it
    (:attr:`fingerprint`). ``allow_clear=True`` also serves clients that ask for clear text
    (``encrypt=False``).
    """

    def __init__(
        self,
        root: PathLike,
        *,
        token_file: Optional[PathLike] = None,
        listen: str = "127.0.0.1",
        port: int = 0,
        mptcp: bool = False,
        key_file: Optional[PathLike] = None,
        allow_clear: bool = False,
    ) -> None:
        self._server = _native.Server(
            os.fspath(root),
            token_file=os.fspath(token_file) if token_file is not None else None,
            listen=listen,
            port=_whole("port", port, 16),
            mptcp=mptcp,
            key_file=os.fspath(key_file) if key_file is not None else None,
            allow_clear=allow_clear,
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._server.port

    @property
    def fingerprint(self) -> str:
        """The fingerprint of its TLS key (``SHA256:...``), for ``server_fingerprint``."""
        return self._server.fingerprint

    @property
    def address(self) -> str:
        """``IP:PORT`` it listens on."""
        return self._server.address

    def stop(self, why: str = "it was stopped") -> None:
        """Ends the sessions running, telling each client ``why`` and to run its copy again
        once the server is back (the copy then resumes); waits at most 3 s, then closes."""
        self._server.stop(why)

    def close(self) -> None:
        """Stops accepting connections; sessions already running end on their own."""
        self._server.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        """Leaving the ``with`` block stops the server: sessions still running end as with
        :meth:`stop`, so that no client writes into the root after the block."""
        self.stop("the server was closed")
