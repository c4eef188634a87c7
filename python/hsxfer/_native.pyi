# Types of the Rust extension module (python/src/lib.rs); hsxfer/__init__.py is the public face.
from typing import Any, Callable, Dict, List, Optional

DEFAULT_PORT: int

class Error(Exception): ...
class AuthError(Error): ...
class ConnectError(Error): ...
class TransientError(Error): ...
class BusyError(TransientError): ...

def copy(
    operands: List[str],
    options: Dict[str, Any],
    *,
    recursive: bool,
    expect: Optional[str] = None,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    interval: float = 0.5,
) -> str: ...
def bench(
    host: str,
    options: Dict[str, Any],
    *,
    direction: str = "upload",
    bytes: Optional[int] = None,
    seconds: Optional[float] = None,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    interval: float = 0.5,
) -> str: ...
def probe(
    host: str,
    *,
    port: int,
    token_file: Optional[str] = None,
    budget: Optional[float] = None,
    direction: str = "push",
    policy: str = "fair",
    save: bool = True,
    encrypt: bool = True,
    server_fingerprint: Optional[str] = None,
    known_servers: Optional[str] = None,
    mptcp: bool = False,
) -> str: ...

class Server:
    def __init__(
        self,
        root: str,
        *,
        token_file: Optional[str] = None,
        listen: str = "127.0.0.1",
        port: int = 0,
        mptcp: bool = False,
        key_file: Optional[str] = None,
        allow_clear: bool = False,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def address(self) -> str: ...
    def stop(self, why: str) -> None: ...
    def close(self) -> None: ...
