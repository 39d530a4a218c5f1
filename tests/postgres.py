"""A throwaway PostgreSQL server for the tests: a cluster made with initdb
in a temporary folder, listening only on a Unix socket there (no TCP), with
trust authentication, stopped and removed at the end. Uses Debian's
``postgresql`` binaries (``apt-get install postgresql``; ``.ci/run``
installs them). The server refuses to run as root, so as root it runs as
the ``postgres`` user the package creates."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path


def server_bin() -> Path | None:
    """The folder of the newest installed PostgreSQL server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PostgresCluster:
    """A PostgreSQL server in a temporary folder, on a Unix socket only."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="rag-test-pg-"))
        self.user = None
        if os.geteuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "rag", "--no-sync", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o",
                  f"-c listen_addresses='' -k {self.root} -c fsync=off", "start")
        self.admin_url = f"postgresql://rag@/postgres?host={self.root}"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([str(self.bindir / tool), *args], check=True, user=self.user, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    def new_database(self) -> str:
        """The URL of a new, empty database on this server."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return f"postgresql://rag@/{name}?host={self.root}"

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
