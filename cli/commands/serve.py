"""`kdvfs serve`: the tuning service (docs/service.md).

    kdvfs serve [--host 127.0.0.1] [--port 8470] [--db URL] [--token-file F] [--mlflow-uri URI]

Jobs and ranks of one fleet share their observations, decisions and plans through it. It
binds loopback by default; bound to any other address it refuses to start without a token
file. --db defaults to SQLite in the working directory (kdvfs-service.db); a PostgreSQL URL
(postgresql+psycopg://...) works the same. FastAPI, uvicorn and SQLAlchemy (the `service`
extra; psycopg for PostgreSQL: the `postgres` extra) are imported inside run(), so
`kdvfs --help` stays quick and a missing extra is one line naming it.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import socket
from pathlib import Path

#: Port the service listens on by default.
DEFAULT_PORT = 8470
#: How long an idle client connection is kept open (above httpx's 5-s pool expiry, so a
#: client never reuses a connection the service is closing); s.
KEEP_ALIVE_S = 30
#: Database the service uses by default (relative to the working directory).
DEFAULT_DB = "sqlite:///kdvfs-service.db"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: loopback)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help="default %(default)s; 0: any free port"
    )
    parser.add_argument("--db", default=DEFAULT_DB, help="SQLAlchemy database URL (default %(default)s)")
    parser.add_argument(
        "--token-file", type=Path, help="`TOKEN FLEET JOB` per line; required off loopback (docs/service.md)"
    )
    parser.add_argument("--mlflow-uri", help="MLflow tracking URI (default: MLflow's default store)")
    parser.add_argument("--no-tracking", action="store_true", help="log no MLflow runs")
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="import strategies on first use: a quicker start, but the first BoTorch session waits for torch",
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="requests per second per token (default 200)"
    )
    parser.add_argument(
        "--burst", type=float, default=None, help="requests at once above the rate (default 400)"
    )
    parser.add_argument(
        "--port-file", type=Path, help="write the bound port here once listening (for --port 0)"
    )
    parser.add_argument(
        "--pool-wait-s",
        type=float,
        default=None,
        help="longest a data-parallel rank's step report waits for the other ranks', s (default 0.5)",
    )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value}")
    return value


def is_loopback(host: str) -> bool:
    """Whether the address (or every address a name resolves to) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.types import KdvfsError

    if not is_loopback(args.host) and args.token_file is None:
        raise KdvfsError(f"refusing to bind {args.host} (not loopback) without --token-file")
    from kdvfs.cli.commands._common import check_outputs

    check_outputs(args, {"--port-file": args.port_file})
    from kdvfs.extras import require_extra

    require_extra("service", ["fastapi", "uvicorn", "sqlalchemy"], "the tuning service")
    _check_db_url(args.db)
    if args.db.startswith("postgresql"):
        require_extra("postgres", ["psycopg"], "a PostgreSQL database")
    import logging

    import uvicorn

    from kdvfs.service.app import POOL_WAIT_S, RATE_BURST, RATE_PER_S, ServiceConfig, create_app, load_tokens
    from kdvfs.service.store import StorageError

    tokens = load_tokens(args.token_file) if args.token_file is not None else None
    rate = RATE_PER_S if args.rate is None else args.rate
    burst = RATE_BURST if args.burst is None else args.burst
    if not rate > 0 or not burst >= 1:
        raise KdvfsError(f"--rate must be > 0 and --burst >= 1, got {args.rate} and {args.burst}")
    pool_wait_s = POOL_WAIT_S if args.pool_wait_s is None else args.pool_wait_s
    if not (math.isfinite(pool_wait_s) and pool_wait_s > 0):
        raise KdvfsError(f"--pool-wait-s must be a positive number of seconds, got {args.pool_wait_s}")
    config = ServiceConfig(
        db_url=args.db,
        tokens=tokens,
        mlflow_uri=args.mlflow_uri,
        tracking=not args.no_tracking,
        preload=not args.no_preload,
        rate_per_s=rate,
        rate_burst=burst,
        pool_wait_s=pool_wait_s,
    )
    logging.basicConfig(level=logging.WARNING, format="kdvfs serve: %(message)s")
    try:
        app = create_app(config)
    except StorageError as exc:
        raise KdvfsError(f"--db {args.db}: {exc}") from None
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    )
    sock = _bind(args.host, args.port)
    if args.port_file is not None:
        args.port_file.write_text(f"{sock.getsockname()[1]}\n")
    print(
        f"kdvfs serve: listening on http://{args.host}:{sock.getsockname()[1]} "
        f"({'tokens from ' + str(args.token_file) if tokens else 'no tokens, loopback only'}), db {args.db}",
        flush=True,
    )
    server.run(sockets=[sock])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    from kdvfs.runtime.types import KdvfsError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise KdvfsError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _check_db_url(url: str) -> None:
    """--db is a SQLAlchemy URL whose database kind SQLAlchemy knows; else one line."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from kdvfs.runtime.types import KdvfsError

    example = f"e.g. {DEFAULT_DB} or postgresql+psycopg://USER@HOST/DB"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise KdvfsError(f"--db {url!r}: not a database URL ({example})") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise KdvfsError(f"--db {url}: an in-memory database keeps nothing; name a file ({example})")
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise KdvfsError(f"--db {url}: unknown database kind {parsed.drivername!r} ({example})") from None
    except ImportError as exc:
        raise KdvfsError(f"--db {url}: its driver is not installed ({exc})") from None
