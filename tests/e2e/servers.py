"""Private Redis and PostgreSQL servers for fault tests: started on free ports with their
files in temporary directories, killed and restarted by the test, always stopped at
teardown. The shared servers other tests use are never touched."""

from __future__ import annotations

import glob
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from enclave.processes import free_port


class RedisServer:
    """`redis-server` on a free port; `persistent` turns on the append-only file, fsynced on
    every write, so a SIGKILL loses nothing acknowledged."""

    def __init__(self, tmp: Path, *, persistent: bool) -> None:
        self.dir = tmp / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        aof = ["yes", "--appendfsync", "always"] if self.persistent else ["no"]
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--dir", str(self.dir), "--save", "", "--appendonly", *aof]
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "private redis-server did not start"
                time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: connections stay open and commands hang unanswered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    assert found[-1], f"PostgreSQL's {name} is not installed"
    return found[-1]


class PostgresServer:
    """A throwaway PostgreSQL cluster (trust auth, fsync off) run by the `postgres` user
    (the server refuses to run as root), listening on 127.0.0.1 and a free port. Its
    directory is its own under /tmp (pytest's tmp dirs are closed to other users);
    `remove()` stops the server and deletes it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="enclave-pg-"))
        shutil.chown(self.dir, user="postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_postgres(
            _pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N"
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _as_postgres(self, *argv: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )

    def stop_immediate(self) -> None:
        """`pg_ctl stop -m immediate`: every backend is killed at once, as in a crash."""
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-w", "stop", "-m", "immediate")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop_immediate()
        shutil.rmtree(self.dir, ignore_errors=True)
